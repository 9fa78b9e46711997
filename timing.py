"""The one place that measures a streamed reply.

Wrap any backend stream in `TimedStream`; read `live()` while it runs and
`finish()` once it ends. The chat UI and the benchmark both use this module,
so their figures agree by construction.

Definitions (the same as vLLM's and llama.cpp's benchmark tools):
- the clock starts just before the request is sent (first iteration);
- time to first token (TTFT) = arrival of the first chunk with non-empty text;
- decode tokens/s = (output tokens - 1) / (last token time - first token time),
  so TTFT is never part of the rate;
- ms per output token (TPOT) = (total time - TTFT) / (output tokens - 1);
- output tokens are counted exactly from what the backend says each chunk
  holds, never as one chunk = one token. Where the protocol does not say,
  the count is marked estimated. Where the server reports its own count, it is
  kept beside ours and a disagreement is flagged.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from typing import AsyncIterator, Callable, Literal

from backends.base import StreamChunk

Clock = Callable[[], float]
Status = Literal["streaming", "completed", "stopped", "error"]


@dataclass(frozen=True)
class LiveFigures:
    """A snapshot while the reply streams."""

    elapsed_s: float
    first_token_s: float | None
    output_tokens: int
    decode_tokens_per_s: float | None
    queue_position: int | None
    tokens_exact: bool


@dataclass(frozen=True)
class RequestRecord:
    """The frozen measurement of one request."""

    backend: str
    model: str
    status: Status
    total_s: float
    first_token_s: float | None
    output_tokens: int
    decode_tokens_per_s: float | None
    ms_per_output_token: float | None
    finish_reason: str | None
    tokens_exact: bool
    token_source: str
    server_output_tokens: int | None
    server_input_tokens: int | None
    count_disagreement: str | None
    chunk_gaps_s: tuple[float, ...]
    error: str | None = None

    def as_dict(self, include_gaps: bool = False) -> dict:
        data = asdict(self)
        if not include_gaps:
            data.pop("chunk_gaps_s")
        return data


class StreamMeter:
    """Accumulates timestamps and token counts for one request."""

    def __init__(self, clock: Clock = time.perf_counter) -> None:
        self._clock = clock
        self._start: float | None = None
        self._first_token_at: float | None = None
        self._last_token_at: float | None = None
        self._previous_chunk_at: float | None = None
        self._tokens = 0
        self._tokens_exact = True
        self._finish_reason: str | None = None
        self._server_output_tokens: int | None = None
        self._server_input_tokens: int | None = None
        self._server_source: str | None = None
        self._queue_position: int | None = None
        self._gaps: list[float] = []

    @property
    def started(self) -> bool:
        return self._start is not None

    def start(self, at: float | None = None) -> None:
        self._start = self._clock() if at is None else at

    def observe(self, chunk: StreamChunk, at: float | None = None) -> None:
        """Record one chunk as it arrives."""
        now = self._clock() if at is None else at
        if self._start is None:
            self._start = now
        if chunk.queue_position is not None:
            self._queue_position = chunk.queue_position or None
        tokens = chunk.token_count
        if tokens is None:
            # The protocol did not say: one per chunk with text is the best guess, and we say so.
            tokens = 1 if chunk.text else 0
            if chunk.text:
                self._tokens_exact = False
        if chunk.text and self._first_token_at is None:
            self._first_token_at = now
            self._queue_position = None
        if tokens > 0 or chunk.text:
            if self._previous_chunk_at is not None:
                self._gaps.append(now - self._previous_chunk_at)
            self._previous_chunk_at = now
            self._last_token_at = now
            self._tokens += tokens
        if chunk.finish_reason:
            self._finish_reason = chunk.finish_reason
        figures = chunk.server_figures
        if figures is not None:
            self._server_source = figures.source
            if figures.output_tokens is not None:
                self._server_output_tokens = figures.output_tokens
            if figures.input_tokens is not None:
                self._server_input_tokens = figures.input_tokens
            if figures.finish_reason and not self._finish_reason:
                self._finish_reason = figures.finish_reason

    def _elapsed(self, now: float) -> float:
        return 0.0 if self._start is None else now - self._start

    def _first_token_s(self) -> float | None:
        if self._first_token_at is None or self._start is None:
            return None
        return self._first_token_at - self._start

    def _decode_rate(self, tokens: int) -> float | None:
        if tokens < 2 or self._first_token_at is None or self._last_token_at is None:
            return None
        span = self._last_token_at - self._first_token_at
        return (tokens - 1) / span if span > 0 else None

    def live(self, at: float | None = None) -> LiveFigures:
        now = self._clock() if at is None else at
        return LiveFigures(
            elapsed_s=self._elapsed(now),
            first_token_s=self._first_token_s(),
            output_tokens=self._tokens,
            decode_tokens_per_s=self._decode_rate(self._tokens),
            queue_position=self._queue_position,
            tokens_exact=self._tokens_exact,
        )

    def finish(
        self,
        status: Status,
        *,
        backend: str,
        model: str,
        error: str | None = None,
        at: float | None = None,
    ) -> RequestRecord:
        """Freeze the measurement. Call once the stream has ended, stopped or failed."""
        now = self._clock() if at is None else at
        total_s = self._elapsed(now)
        tokens = self._tokens
        tokens_exact = self._tokens_exact
        token_source = "per-chunk token counts from the backend"
        disagreement = None
        server_tokens = self._server_output_tokens
        if server_tokens is not None and not tokens_exact:
            # Our count was an estimate; the server's count is exact, so it wins.
            tokens, tokens_exact = server_tokens, True
            token_source = f"{self._server_source} (stream chunks did not carry counts)"
        elif server_tokens is not None and server_tokens != tokens:
            disagreement = f"client counted {tokens} tokens, {self._server_source} reports {server_tokens}"
        elif not tokens_exact:
            token_source = "estimated: one token per chunk (the server reported no counts)"
        first_token_s = self._first_token_s()
        ms_per_output_token = None
        if first_token_s is not None and tokens >= 2:
            ms_per_output_token = (total_s - first_token_s) / (tokens - 1) * 1000.0
        return RequestRecord(
            backend=backend,
            model=model,
            status=status,
            total_s=total_s,
            first_token_s=first_token_s,
            output_tokens=tokens,
            decode_tokens_per_s=self._decode_rate(tokens),
            ms_per_output_token=ms_per_output_token,
            finish_reason=self._finish_reason,
            tokens_exact=tokens_exact,
            token_source=token_source,
            server_output_tokens=server_tokens,
            server_input_tokens=self._server_input_tokens,
            count_disagreement=disagreement,
            chunk_gaps_s=tuple(self._gaps),
            error=error,
        )


class TimedStream:
    """An async iterator over a backend stream that measures as it goes.

    The clock starts just before the first `__anext__`, which is when an async
    generator backend sends its request. `aclose()` closes the backend stream
    (and with it the HTTP connection or the worker thread).
    """

    def __init__(
        self,
        stream: AsyncIterator[StreamChunk],
        *,
        backend: str,
        model: str,
        clock: Clock = time.perf_counter,
    ) -> None:
        self._stream = stream
        self.backend = backend
        self.model = model
        self.meter = StreamMeter(clock)
        self._closed = False

    def __aiter__(self) -> "TimedStream":
        return self

    async def __anext__(self) -> StreamChunk:
        if not self.meter.started:
            self.meter.start()
        chunk = await self._stream.__anext__()
        self.meter.observe(chunk)
        return chunk

    async def aclose(self) -> None:
        if not self._closed:
            self._closed = True
            aclose = getattr(self._stream, "aclose", None)
            if aclose is not None:
                await aclose()

    def live(self) -> LiveFigures:
        return self.meter.live()

    def finish(self, status: Status, error: str | None = None) -> RequestRecord:
        return self.meter.finish(status, backend=self.backend, model=self.model, error=error)


async def measure(stream: AsyncIterator[StreamChunk], *, backend: str, model: str) -> tuple[str, RequestRecord]:
    """Consume a whole stream; return its text and record. Backend errors propagate."""
    timed = TimedStream(stream, backend=backend, model=model)
    parts: list[str] = []
    try:
        async for chunk in timed:
            parts.append(chunk.text)
    finally:
        await timed.aclose()
    return "".join(parts), timed.finish("completed")
