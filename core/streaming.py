"""The one loop that consumes a measured stream: chat replies, rounds, replay and the benchmark.

    outcome = await consume(plan.open_stream(), on_chunk=draw)

Every rule of a reply's end is written here once: the loop runs to the stream's end, to a
`BackendError` (the watchdog's first-token and stall limits included: status "error", the
error kept), or to a cancellation (the person's Stop, Ctrl-C: status "stopped"). In every
case the stream is closed - its HTTP request ends on the server, the embedded model's worker
lets go - and the record is frozen with that status and its exact counts. A cancellation is
then passed on as `Stopped`, a CancelledError that carries the outcome: a chat reply catches it
and keeps its partial text, a round's column records it and stops the columns after it, the
load engine lets it end the level.

`on_chunk` sees every chunk after the meter has counted it (so `timed.meter` and `timed.live()`
are up to date): what to draw, or a live counter to move, and nothing else.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Callable, Sequence

from backends.base import Backend, ChatMessage, GenerationParams, PreparedRequest, StreamChunk
from backends.errors import BackendError
from core.timing import RequestRecord, TimedStream


@dataclass(frozen=True)
class StreamOutcome:
    """How a consumed stream ended: the text received, the frozen record, and the error if any."""

    text: str
    record: RequestRecord
    error: BackendError | None = None

    @property
    def status(self) -> str:
        return self.record.status


class Stopped(asyncio.CancelledError):
    """The consuming task was cancelled (Stop, Ctrl-C) after the stream was closed and measured:
    `outcome` holds the partial text and the record, status "stopped"."""

    def __init__(self, outcome: StreamOutcome) -> None:
        super().__init__("stopped")
        self.outcome = outcome


async def consume(timed: TimedStream, on_chunk: Callable[[StreamChunk], None] | None = None) -> StreamOutcome:
    """Consume `timed` to its end, an error or cancellation; always close it and freeze its record.
    Raises `Stopped` (a CancelledError) when cancelled, after the record is frozen."""
    parts: list[str] = []
    status, failure, cancelled = "completed", None, False
    try:
        async for chunk in timed:
            if chunk.text:
                parts.append(chunk.text)
            if on_chunk is not None:
                on_chunk(chunk)
    except BackendError as error:
        status, failure = "error", error
    except asyncio.CancelledError:
        status, cancelled = "stopped", True
    finally:
        try:
            await timed.aclose()
        finally:  # even if closing is cut short, the figures are kept
            record = timed.finish(status, error=failure.describe() if failure else None)
    outcome = StreamOutcome("".join(parts), record, failure)
    if cancelled:
        raise Stopped(outcome)
    return outcome


async def measure_prepared(backend: Backend, request: PreparedRequest, *,
                           label: str | None = None) -> tuple[str, RequestRecord]:
    """Stream and measure an already prepared request (no watchdog); its text and record.
    A backend error is raised, as a script or a test wants it."""
    outcome = await consume(TimedStream(backend.stream(request), backend=label or backend.label,
                                        model=request.model))
    if outcome.error is not None:
        raise outcome.error
    return outcome.text, outcome.record


async def measure(backend: Backend, messages: Sequence[ChatMessage], params: GenerationParams, *,
                  label: str | None = None) -> tuple[str, RequestRecord]:
    """Prepare (not measured), then stream and measure one whole reply; its text and record."""
    return await measure_prepared(backend, await backend.prepare(messages, params), label=label)
