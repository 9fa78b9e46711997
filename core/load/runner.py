"""The one load engine: N requests at a concurrency, measured by `timing`, failures recorded.

`python -m bench`, the chat's `/bench` and its "Simulate N users" all run their
requests through `run_level`, so a table, a chart and a live classroom demo
measure the same way. Each request is prepared first (not measured: lookups,
templating), then streamed under the backend's first-token and stall limits
(`backends.watchdog`) through `timing.TimedStream` exactly like a chat
reply; a backend error is recorded with the request, never raised, so one
failure cannot hide the rest. `LiveCounters` is updated per chunk, for
dashboards that show the aggregate rate while a level runs.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Callable, Sequence

from backends.base import Backend, GenerationParams, StreamChunk
from backends.errors import BackendError
from backends.watchdog import watched
from core.concurrency import run_together
from core.load.prompt_sets import BenchPrompt
from core.streaming import consume
from core.timing import RequestRecord, TimedStream


@dataclass(frozen=True)
class RequestOutcome:
    """One request of a level: its measurement, or why it failed."""

    index: int
    prompt_source: str
    record: RequestRecord | None
    error: str | None = None
    input_tokens: int | None = None  # the engine's own count (server usage, else its tokenizer)

    @property
    def ok(self) -> bool:
        return self.error is None and self.record is not None and self.record.status == "completed"


@dataclass
class LiveCounters:
    """Running totals while a level runs (read by a live chart; written only by the event loop)."""

    in_flight: int = 0
    started: int = 0
    finished: int = 0
    failed: int = 0
    output_tokens: int = 0
    first_token_s: list[float] = field(default_factory=list)


@dataclass(frozen=True)
class LevelResult:
    """Every request of one backend at one concurrency, and the level's wall time."""

    backend: str
    label: str
    model: str
    concurrency: int
    outcomes: tuple[RequestOutcome, ...]
    duration_s: float
    interrupted: bool = False
    not_sent: int = 0  # requests left unsent when the level's time (`send_for_s`) ran out

    @property
    def cut_short(self) -> bool:
        return self.not_sent > 0


async def _input_tokens(backend: Backend, prompt: BenchPrompt, cache: dict[str, int | None]) -> int | None:
    """The prompt's length in the engine's own tokens (cached per prompt); None if it cannot tell."""
    if prompt.source not in cache:
        try:
            cache[prompt.source] = await backend.count_prompt_tokens(prompt.messages)
        except BackendError:
            cache[prompt.source] = None
    return cache[prompt.source]


async def run_level(
    backend: Backend,
    prompts: Sequence[BenchPrompt],
    *,
    concurrency: int,
    requests: int,
    params: GenerationParams,
    model: str = "",
    on_done: Callable[[RequestOutcome], None] | None = None,
    live: LiveCounters | None = None,
    token_cache: dict[str, int | None] | None = None,
    arrival_times_s: Sequence[float] | None = None,
    send_for_s: float | None = None,
) -> LevelResult:
    """Send `requests` requests (prompts in order, repeating) with at most `concurrency` in flight.

    `arrival_times_s`: when each request arrives, in seconds from the level's start
    (`core.load.arrivals`; a rate level); it then waits for a place among the
    `concurrency` in flight, and its clock starts when it is sent, as in `vllm bench
    serve`. Without it every request arrives at once (a concurrency level).
    `send_for_s`: requests that have not arrived by then are not sent (the level is
    `cut_short`); those in flight finish under the backend's own limits.
    Cancelling it (Ctrl-C, Stop) closes every open stream and returns what was
    measured so far, marked `interrupted`.
    """
    if concurrency < 1 or requests < 1 or not prompts:
        raise ValueError("a level needs concurrency >= 1, requests >= 1 and at least one prompt")
    if arrival_times_s is not None and len(arrival_times_s) < requests:
        raise ValueError("a rate level needs an arrival time for every request")
    gate = asyncio.Semaphore(concurrency)
    live = live or LiveCounters()
    cache = token_cache if token_cache is not None else {}
    outcomes: list[RequestOutcome] = []

    not_sent = 0

    async def one(index: int) -> None:
        nonlocal not_sent
        prompt = prompts[index % len(prompts)]
        arrives_at = arrival_times_s[index] if arrival_times_s is not None else 0.0
        if send_for_s is not None and arrives_at > send_for_s:
            not_sent += 1
            return
        if arrives_at > 0:
            await asyncio.sleep(max(0.0, started + arrives_at - time.perf_counter()))
        async with gate:
            if send_for_s is not None and time.perf_counter() - started > send_for_s:
                not_sent += 1  # waited for a place past the level's time
                return
            live.started += 1
            live.in_flight += 1
            try:
                outcome = await _one_request(backend, prompt, index, params, model, live, cache)
            finally:
                live.in_flight -= 1
        live.finished += 1
        live.failed += 0 if outcome.ok else 1
        outcomes.append(outcome)
        if on_done is not None:
            on_done(outcome)

    started = time.perf_counter()
    interrupted = False
    try:
        await run_together(one(index) for index in range(requests))
    except asyncio.CancelledError:
        interrupted = True
    duration_s = time.perf_counter() - started
    ordered = tuple(sorted(outcomes, key=lambda outcome: outcome.index))
    return LevelResult(backend.name, backend.label, model, concurrency, ordered, duration_s, interrupted,
                       not_sent=not_sent)


async def _one_request(backend: Backend, prompt: BenchPrompt, index: int, params: GenerationParams,
                       model: str, live: LiveCounters, cache: dict[str, int | None]) -> RequestOutcome:
    try:
        request = await backend.prepare(prompt.messages, params)
    except BackendError as error:
        return RequestOutcome(index, prompt.source, None, error.describe())
    timed = TimedStream(watched(backend, request), backend=backend.label, model=model or request.model)
    counted, first_seen = 0, False

    def count(_chunk: StreamChunk) -> None:
        # The meter's own count (estimated per chunk where the protocol says nothing) and first token.
        nonlocal counted, first_seen
        live.output_tokens += timed.meter.output_tokens - counted
        counted = timed.meter.output_tokens
        if not first_seen and timed.meter.first_token_s is not None:
            first_seen = True
            live.first_token_s.append(timed.meter.first_token_s)

    # Cancelled (Ctrl-C, Stop): Stopped ends the level; the request is dropped from the results.
    outcome = await consume(timed, on_chunk=count)
    record = outcome.record
    input_tokens = record.server_input_tokens
    if input_tokens is None:
        input_tokens = await _input_tokens(backend, prompt, cache)
    return RequestOutcome(index, prompt.source, record, outcome.error.describe() if outcome.error else None,
                          input_tokens)
