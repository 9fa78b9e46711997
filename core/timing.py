"""The one place that measures a streamed reply.

Wrap any backend stream in `TimedStream`; read `live()` while it runs and
`finish()` once it ends. The chat UI and the benchmark both use this module,
so their figures agree by construction.

Definitions (the names follow `vllm bench serve`; `docs/engineers/figures.md` maps them to
GuideLLM's and GenAI-Perf/AIPerf's, which use the same words differently):
- the clock starts just before the request is sent (first iteration of the
  prepared request's stream; all lookups happened before, in `prepare`), and
  every time is taken where the event happened, not when the app's busy loop
  got to it: a remote backend's chunks are stamped on arrival on its own loop
  (backends/offloop.py: `StreamChunk.arrived_at_s`, and the first chunk's
  `request_sent_at_s` re-bases the start), the embedded model's on its thread;
- first byte = the first event from the server of any kind (an OpenAI
  server's empty role chunk counts; a local queue status does not);
- TTFT (time to first token) = arrival of the first chunk that carries a
  token: text, or an exact token count above 0 with its text held back (vLLM
  sends a multi-byte character's first byte-level tokens with empty text and
  their count; its own TTFT, in `vllm bench serve` and its histogram, is the
  first token too). Measuring the first *text* instead put such a reply's TTFT
  two decode steps late: +55 ms mean at 8 concurrent on CPU vLLM, where 4 of
  32 English prompts get replies that open with a Chinese character;
- end of generation = the last chunk carrying text, tokens or a finish
  reason (a trailing usage-only chunk does not count) - vLLM's request end;
- TPOT (ms per output token) = (end of generation - TTFT) / (tokens - 1);
- ITL (inter-token latency) = the gaps between successive chunks that carry
  tokens, after the first; reported as median, p90, p99 and the longest stall;
- decode tokens/s = (tokens - 1) / (last token chunk - first token chunk),
  so TTFT is never part of the rate;
- output tokens are counted from what the backend says each chunk holds,
  never as one chunk = one token. Where the protocol does not say, the count
  is an estimate until the server's own count arrives, which then wins.
  Where both are exact and disagree, the disagreement is flagged.
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass, fields, is_dataclass, replace
from typing import AsyncIterator, Callable, Iterable, Literal, Sequence

from backends.base import ServerFigures, StreamChunk

Clock = Callable[[], float]
Status = Literal["streaming", "completed", "stopped", "error"]
FINAL_STATES: tuple[Status, ...] = ("completed", "stopped", "error")


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0..100) with linear interpolation between ranks (numpy's default)."""
    if not values:
        raise ValueError("percentile of no values")
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100.0
    low, high = math.floor(rank), math.ceil(rank)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def percentile_of(values: Iterable[float | None], q: float) -> float | None:
    """`percentile` over the values that are known (None left out); None when none is."""
    known = [value for value in values if value is not None]
    return percentile(known, q) if known else None


def median_of(values: Iterable[float | None]) -> float | None:
    """The median of the known values (None left out); None when none is."""
    return percentile_of(values, 50)


@dataclass(frozen=True)
class InterTokenLatency:
    """Gaps between successive token-carrying chunks after the first, in milliseconds."""

    count: int
    median_ms: float
    p90_ms: float
    p99_ms: float
    max_ms: float
    longest_stall_after_tokens: int  # output tokens already received when the longest gap began
    longest_stall_ended_s: float  # when the longest gap ended, from the clock start

    @classmethod
    def of(cls, chunk_times_s: Sequence[float], chunk_tokens: Sequence[int]) -> "InterTokenLatency | None":
        if len(chunk_times_s) < 2:
            return None
        gaps_ms = [(b - a) * 1000.0 for a, b in zip(chunk_times_s, chunk_times_s[1:])]
        longest = max(range(len(gaps_ms)), key=gaps_ms.__getitem__)
        return cls(
            count=len(gaps_ms),
            median_ms=percentile(gaps_ms, 50),
            p90_ms=percentile(gaps_ms, 90),
            p99_ms=percentile(gaps_ms, 99),
            max_ms=gaps_ms[longest],
            longest_stall_after_tokens=sum(chunk_tokens[: longest + 1]),
            longest_stall_ended_s=chunk_times_s[longest + 1],
        )


@dataclass(frozen=True)
class LiveFigures:
    """A snapshot while the reply streams."""

    elapsed_s: float
    first_token_s: float | None
    output_tokens: int
    decode_tokens_per_s: float | None
    queue_position: int | None
    tokens_exact: bool
    server: ServerFigures | None = None  # what the engine reported so far (its prompt cost, once it says)


@dataclass(frozen=True)
class RequestRecord:
    """The frozen measurement of one request: figures, the server's own, and the timeline."""

    backend: str
    model: str
    status: Status
    started_at_unix_s: float
    total_s: float  # until the stream was closed
    first_byte_s: float | None
    first_token_s: float | None
    last_chunk_s: float | None  # end of generation
    output_tokens: int
    decode_tokens_per_s: float | None
    ms_per_output_token: float | None  # TPOT
    itl: InterTokenLatency | None
    finish_reason: str | None
    tokens_exact: bool
    token_source: str
    server: ServerFigures | None
    count_disagreement: str | None
    chunk_times_s: tuple[float, ...]  # arrival of each token-carrying chunk, from the clock start
    chunk_tokens: tuple[int, ...]  # tokens each of those chunks carried (estimated where not exact)
    error: str | None = None

    @property
    def server_output_tokens(self) -> int | None:
        return self.server.output_tokens if self.server else None

    @property
    def server_input_tokens(self) -> int | None:
        return self.server.input_tokens if self.server else None

    @property
    def chunk_gaps_s(self) -> tuple[float, ...]:
        times = self.chunk_times_s
        return tuple(b - a for a, b in zip(times, times[1:]))

    def as_dict(self, include_timeline: bool = False) -> dict:
        """JSON-ready; the per-chunk timeline only when asked (it can be thousands of numbers).

        What `dataclasses.asdict` gives, without its copy of every number of the timeline (the
        tuples are immutable: they are handed as they are), which took a class burst's event loop
        1-2 ms per reply, twice (once to be dropped)."""
        data = {}
        for field in fields(self):
            if not include_timeline and field.name in _TIMELINE:
                continue
            value = getattr(self, field.name)
            data[field.name] = asdict(value) if is_dataclass(value) else value
        return data


_TIMELINE = ("chunk_times_s", "chunk_tokens")


class StreamMeter:
    """Accumulates timestamps and token counts for one request."""

    def __init__(self, clock: Clock = time.perf_counter, wall_clock: Clock = time.time) -> None:
        self._clock = clock
        self._wall_clock = wall_clock
        self._start: float | None = None
        self._started_at_unix_s = 0.0
        self._first_byte_at: float | None = None
        self._first_token_at: float | None = None
        self._last_chunk_at: float | None = None
        self._tokens = 0
        self._tokens_exact = True
        self._finish_reason: str | None = None
        self._server: ServerFigures | None = None
        self._queue_position: int | None = None
        self._chunk_times: list[float] = []
        self._chunk_tokens: list[int] = []

    @property
    def started(self) -> bool:
        return self._start is not None

    @property
    def output_tokens(self) -> int:
        """Output tokens received so far (as counted for the figures)."""
        return self._tokens

    @property
    def first_token_s(self) -> float | None:
        """Seconds from the clock's start to the first text, once it came."""
        return self._since_start(self._first_token_at)

    def start(self, at: float | None = None) -> None:
        self._start = self._clock() if at is None else at
        self._started_at_unix_s = self._wall_clock()

    def observe(self, chunk: StreamChunk, at: float | None = None) -> None:
        """Record one chunk as it arrives: at `at`, else where it arrived (`chunk.arrived_at_s`, stamped
        off the app's loop), else now. A first chunk that says when its request left moves the clock's
        start there (the request left on the backend's own loop, after this meter started)."""
        if at is not None:
            now = at
        elif chunk.arrived_at_s is not None:
            now = chunk.arrived_at_s
        else:
            now = self._clock()
        if self._start is None:
            self.start(now)
        sent = chunk.request_sent_at_s
        if sent is not None and self._first_byte_at is None and self._start <= sent <= now:
            self._started_at_unix_s += sent - self._start
            self._start = sent
        local_status_only = (chunk.queue_position is not None and not chunk.text and not chunk.token_count
                             and chunk.finish_reason is None and chunk.server_figures is None)
        if chunk.queue_position is not None:
            self._queue_position = chunk.queue_position or None
        if local_status_only:
            return
        if self._first_byte_at is None:
            self._first_byte_at = now
        tokens = chunk.token_count
        if tokens is None:
            # The protocol did not say: one per chunk with text is the best guess, and we say so.
            tokens = 1 if chunk.text else 0
            if chunk.text:
                self._tokens_exact = False
        carries_output = tokens > 0 or bool(chunk.text)
        if carries_output and self._first_token_at is None:
            self._first_token_at = now
            self._queue_position = None
        if carries_output:
            self._chunk_times.append(now)
            self._chunk_tokens.append(tokens)
            self._tokens += tokens
        if tokens > 0 or chunk.text or chunk.finish_reason:
            self._last_chunk_at = now
        if chunk.finish_reason:
            self._finish_reason = chunk.finish_reason
        figures = chunk.server_figures
        if figures is not None:
            self._server = figures if self._server is None else self._server.merged(figures)
            if figures.finish_reason and not self._finish_reason:
                self._finish_reason = figures.finish_reason

    def _since_start(self, at: float | None) -> float | None:
        if at is None or self._start is None:
            return None
        return at - self._start

    def _decode_rate(self, tokens: int) -> float | None:
        if tokens < 2 or len(self._chunk_times) < 2 or self._first_token_at is None:
            return None
        span = self._chunk_times[-1] - self._first_token_at
        return (tokens - 1) / span if span > 0 else None

    def live(self, at: float | None = None) -> LiveFigures:
        now = self._clock() if at is None else at
        return LiveFigures(
            elapsed_s=self._since_start(now) or 0.0,
            first_token_s=self._since_start(self._first_token_at),
            output_tokens=self._tokens,
            decode_tokens_per_s=self._decode_rate(self._tokens),
            queue_position=self._queue_position,
            tokens_exact=self._tokens_exact,
            server=self._server,
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
        tokens = self._tokens
        tokens_exact = self._tokens_exact
        token_source = "per-chunk token counts from the backend"
        disagreement = None
        server = self._server
        server_tokens = server.output_tokens if server else None
        if server_tokens is not None and not tokens_exact:
            # Our count was an estimate; the server's closing count is exact, so it is final.
            tokens, tokens_exact = server_tokens, True
            token_source = f"{server.source} (the stream's chunks did not carry counts)"
        elif server_tokens is not None and server_tokens != tokens:
            disagreement = f"client counted {tokens} tokens, {server.source} reports {server_tokens}"
        elif not tokens_exact:
            token_source = "estimated: one token per chunk with text (the server reported no counts)"
        first_token_s = self._since_start(self._first_token_at)
        last_chunk_s = self._since_start(self._last_chunk_at)
        # TPOT (vLLM's: end of generation - TTFT over the tokens after the first) and tokens/s over the
        # same span, so each is the other's inverse; the end of generation is the last token or the
        # chunk that says it finished, whichever came last (live, tokens/s runs to the latest token).
        ms_per_output_token = decode_rate = None
        if first_token_s is not None and last_chunk_s is not None and tokens >= 2 and last_chunk_s > first_token_s:
            ms_per_output_token = (last_chunk_s - first_token_s) / (tokens - 1) * 1000.0
            decode_rate = 1000.0 / ms_per_output_token
        server = possible_server_figures(server, first_token_s)
        start = self._start if self._start is not None else now
        chunk_times = tuple(t - start for t in self._chunk_times)
        chunk_tokens = tuple(self._chunk_tokens)
        return RequestRecord(
            backend=backend,
            model=model,
            status=status,
            started_at_unix_s=self._started_at_unix_s,
            total_s=now - start,
            first_byte_s=self._since_start(self._first_byte_at),
            first_token_s=first_token_s,
            last_chunk_s=last_chunk_s,
            output_tokens=tokens,
            decode_tokens_per_s=decode_rate,
            ms_per_output_token=ms_per_output_token,
            itl=InterTokenLatency.of(chunk_times, chunk_tokens),
            finish_reason=self._finish_reason,
            tokens_exact=tokens_exact,
            token_source=token_source,
            server=server,
            count_disagreement=disagreement,
            chunk_times_s=chunk_times,
            chunk_tokens=chunk_tokens,
            error=error,
        )


# How far two figures may disagree and still be the same fact (rounding, float error).
RELATION_TOLERANCE = 0.01


def possible_server_figures(server: ServerFigures | None, first_token_s: float | None) -> ServerFigures | None:
    """The engine's report without what cannot be true of this reply: a prefill that took longer
    than the first token took to arrive here (its counter included other time) is "not reported",
    and so is a cached count above the prompt's. Every engine's report passes here."""
    if server is None:
        return None
    if (server.cached_prompt_tokens is not None and server.input_tokens is not None
            and server.cached_prompt_tokens > server.input_tokens):
        server = replace(server, cached_prompt_tokens=None)
    if first_token_s and server.prompt_s is not None and server.prompt_s > first_token_s * (1 + RELATION_TOLERANCE):
        server = replace(server, prompt_s=None, prompt_tokens_per_s=None)
    rate, computed = server.prompt_tokens_per_s, server.computed_prompt_tokens
    if rate and computed and first_token_s and rate < computed / first_token_s * (1 - RELATION_TOLERANCE):
        server = replace(server, prompt_tokens_per_s=None)
    return server


def figure_problems(record: dict) -> list[str]:
    """The relations a reply's figures must keep (`RequestRecord.as_dict()`, as stored), broken:
    cached at most the prompt; prefill speed at least the computed prompt over TTFT; tokens/s times
    the span from the first token to the end of generation = the tokens after the first; TPOT the
    inverse of tokens/s; the engine's own TPOT the inverse of its tokens/s. Empty when every one
    holds or is not defined."""
    problems = []
    server = record.get("server") or {}
    first, tokens = record.get("first_token_s"), record.get("output_tokens") or 0
    prompt, cached = server.get("input_tokens"), server.get("cached_prompt_tokens")
    if prompt is not None and cached is not None and cached > prompt:
        problems.append(f"cached {cached} > prompt {prompt} tokens")
    rate = server.get("prompt_tokens_per_s")
    if rate and prompt is not None and cached is not None and first:
        computed = max(prompt - cached, 0)
        if computed and rate < computed / first * (1 - RELATION_TOLERANCE):
            problems.append(f"prefill {rate:.1f} tokens/s < {computed} computed tokens / TTFT {first * 1000:.0f} ms")
    speed, tpot, last = record.get("decode_tokens_per_s"), record.get("ms_per_output_token"), record.get("last_chunk_s")
    if speed and first is not None and last is not None and tokens >= 2:
        span = last - first
        if abs(speed * span - (tokens - 1)) > max(0.5, (tokens - 1) * RELATION_TOLERANCE):
            problems.append(f"{speed:.2f} tokens/s x {span:.3f} s != {tokens - 1} tokens after the first")
    if speed and tpot and abs(speed * tpot / 1000.0 - 1) > RELATION_TOLERANCE:
        problems.append(f"TPOT {tpot:.2f} ms is not the inverse of {speed:.2f} tokens/s")
    server_speed, server_tpot = server.get("decode_tokens_per_s"), server.get("time_per_output_token_s")
    if server_speed and server_tpot and abs(server_speed * server_tpot - 1) > RELATION_TOLERANCE:
        problems.append(f"the engine's TPOT {server_tpot * 1000:.2f} ms is not the inverse of its "
                        f"{server_speed:.2f} tokens/s")
    return problems


class TimedStream:
    """An async iterator over a backend stream that measures as it goes.

    The clock starts just before the first `__anext__`, which is when a
    backend's stream sends its (already prepared) request. `aclose()` closes
    the backend stream (and with it the HTTP stream or the worker thread).
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
