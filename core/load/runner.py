"""The one load engine: N requests (or N people's conversations) at a concurrency, measured by `timing`.

`python -m bench`, the chat's `/bench` and its "Simulate N users" all run their
requests through `run_level`, so a table, a chart and a live classroom demo
measure the same way. Each request is prepared first (not measured: lookups,
templating), then streamed under the backend's first-token and stall limits
(`backends.watchdog`) through `timing.TimedStream` exactly like a chat
reply; a backend error is recorded with the request, never raised, so one
failure cannot hide the rest. `LiveCounters` is updated per chunk, for
dashboards that show the aggregate rate while a level runs.

A workload of conversations (`core.load.prompt_sets.Conversation`) is run the
way a class talks: each of the `concurrency` people takes a whole conversation,
sends turn 1, reads the reply for `think_time_s`, sends turn 2 with the
conversation so far (the engine's own replies included), and so on; a person
keeps their place for the whole conversation. Every request is measured alone
and carries its turn number, so the effect of the engine's prefix cache shows
turn by turn (`core.load.stats.by_turn`).
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field, replace
from typing import Callable, Sequence

from backends.base import Backend, GenerationParams, StreamChunk
from backends.errors import BackendError
from backends.watchdog import watched
from core.concurrency import run_together
from core.load.prompt_sets import BenchPrompt, Conversation
from core.streaming import consume
from core.timing import RequestRecord, TimedStream

Workload = Sequence[BenchPrompt] | Sequence[Conversation]


@dataclass(frozen=True)
class RequestOutcome:
    """One request of a level: its measurement, or why it failed."""

    index: int
    prompt_source: str
    record: RequestRecord | None
    error: str | None = None
    input_tokens: int | None = None  # the engine's own count (server usage, else its tokenizer)
    turn: int = 1  # which turn of its conversation (a single prompt is turn 1)
    conversation: int | None = None  # the conversation it belongs to (None: a single prompt)
    text: str = field(default="", repr=False, compare=False)  # the reply (the next turn carries it)

    @property
    def ok(self) -> bool:
        return self.error is None and self.record is not None and self.record.status == "completed"

    @property
    def cached_input_tokens(self) -> int | None:
        """Prompt tokens the engine took from its cache, as it reported (None: not reported)."""
        return self.record.server.cached_prompt_tokens if self.record and self.record.server else None


def is_conversations(workload: Workload) -> bool:
    return bool(workload) and isinstance(workload[0], Conversation)


def conversations_needed(workload: Sequence[Conversation], requests: int, people: int) -> int:
    """Whole conversations (taken in order, repeating) that make at least `requests` requests,
    and at least one per person."""
    count, turns = 0, 0
    while count < people or turns < requests:
        turns += len(workload[count % len(workload)].turns)
        count += 1
    return count


def warm_up_prompts(workload: Workload) -> Sequence[BenchPrompt]:
    """What a warm-up sends: the prompts themselves, or the first turn of a conversation set's last
    conversation (one request; a level's first conversations do not find themselves cached by it)."""
    if not is_conversations(workload):
        return workload
    last = workload[-1]
    return [BenchPrompt(last.messages([]), last.category, last.output_tokens, last.source)]


def planned_requests(workload: Workload, requests: int, people: int = 1) -> int:
    """How many requests a level of `requests` sends: exactly that for prompts; for conversations,
    the turns of the whole conversations it takes."""
    if not is_conversations(workload):
        return requests
    count = conversations_needed(workload, requests, people)
    return sum(len(workload[index % len(workload)].turns) for index in range(count))


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
    prompts: Workload,
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
    think_time_s: float = 0.0,
) -> LevelResult:
    """Send `requests` requests (prompts in order, repeating) with at most `concurrency` in flight;
    or, for conversations, whole conversations making at least `requests` requests, `concurrency`
    people at once, each reading a reply for `think_time_s` before their next turn.

    `arrival_times_s`: when each request (each conversation) arrives, in seconds from the level's
    start (`core.load.arrivals`; a rate level); it then waits for a place among the `concurrency`
    in flight, and its clock starts when it is sent, as in `vllm bench serve`. Without it every
    one arrives at once (a concurrency level). `send_for_s`: requests that have not arrived by then
    are not sent (the level is `cut_short`); those in flight finish under the backend's own limits.
    Cancelling it (Ctrl-C, Stop) closes every open stream and returns what was measured so far,
    marked `interrupted`.
    """
    if concurrency < 1 or requests < 1 or not prompts:
        raise ValueError("a level needs concurrency >= 1, requests >= 1 and at least one prompt")
    conversational = is_conversations(prompts)
    scripts = conversations_needed(prompts, requests, concurrency) if conversational else requests
    if arrival_times_s is not None and len(arrival_times_s) < scripts:
        raise ValueError("a rate level needs an arrival time for every request")
    if think_time_s < 0:
        raise ValueError(f"the think time must be 0 or more seconds (got {think_time_s})")
    gate = asyncio.Semaphore(concurrency)
    live = live or LiveCounters()
    cache = token_cache if token_cache is not None else {}
    outcomes: list[RequestOutcome] = []

    not_sent = 0
    sent_count = 0

    def too_late() -> bool:
        return send_for_s is not None and time.perf_counter() - started > send_for_s

    async def send(prompt: BenchPrompt, index: int, turn: int = 1, conversation: int | None = None) -> RequestOutcome:
        live.started += 1
        live.in_flight += 1
        try:
            outcome = await _one_request(backend, prompt, index, params, model, live,
                                         cache if conversation is None else None)
        finally:
            live.in_flight -= 1
        outcome = replace(outcome, turn=turn, conversation=conversation)
        live.finished += 1
        live.failed += 0 if outcome.ok else 1
        outcomes.append(outcome)
        if on_done is not None:
            on_done(outcome)
        return outcome

    async def talk(conversation: Conversation, number: int) -> None:
        """One person's whole conversation, turn after turn, their place kept throughout."""
        nonlocal not_sent, sent_count
        replies: list[str] = []
        for turn in range(1, len(conversation.turns) + 1):
            if too_late():
                not_sent += len(conversation.turns) - turn + 1
                return
            prompt = BenchPrompt(conversation.messages(replies), conversation.category, conversation.output_tokens,
                                 conversation.source)
            sent_count += 1
            outcome = await send(prompt, sent_count - 1, turn, number)
            if not outcome.ok:
                not_sent += len(conversation.turns) - turn  # a failed turn ends the conversation
                return
            replies.append(outcome.text)
            if turn < len(conversation.turns) and think_time_s > 0:
                await asyncio.sleep(think_time_s)

    async def one(index: int) -> None:
        nonlocal not_sent
        item = prompts[index % len(prompts)]
        arrives_at = arrival_times_s[index] if arrival_times_s is not None else 0.0
        size = len(item.turns) if conversational else 1
        if send_for_s is not None and arrives_at > send_for_s:
            not_sent += size
            return
        if arrives_at > 0:
            await asyncio.sleep(max(0.0, started + arrives_at - time.perf_counter()))
        async with gate:
            if too_late():
                not_sent += size  # waited for a place past the level's time
                return
            if conversational:
                await talk(item, index)
            else:
                await send(item, index)

    started = time.perf_counter()
    interrupted = False
    try:
        await run_together(one(index) for index in range(scripts))
    except asyncio.CancelledError:
        interrupted = True
    duration_s = time.perf_counter() - started
    ordered = tuple(sorted(outcomes, key=lambda outcome: outcome.index))
    return LevelResult(backend.name, backend.label, model, concurrency, ordered, duration_s, interrupted,
                       not_sent=not_sent)


async def _one_request(backend: Backend, prompt: BenchPrompt, index: int, params: GenerationParams,
                       model: str, live: LiveCounters, cache: dict[str, int | None] | None) -> RequestOutcome:
    """One measured request. `cache`: prompt token counts by prompt source (None: the prompt is a
    conversation's turn, its messages are new each time: counted alone if the engine did not say)."""
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
        input_tokens = await _input_tokens(backend, prompt, cache if cache is not None else {})
    return RequestOutcome(index, prompt.source, record, outcome.error.describe() if outcome.error else None,
                          input_tokens, text=outcome.text)


async def measured_request(backend: Backend, prompt: BenchPrompt, index: int, params: GenerationParams, *,
                           model: str = "", live: LiveCounters | None = None) -> RequestOutcome:
    """One request measured as every level's are (prepared, then streamed under the backend's limits
    through the one stream loop): what a trace replay sends, one request at its own time."""
    counters = live or LiveCounters()
    counters.started += 1
    counters.in_flight += 1
    try:
        outcome = await _one_request(backend, prompt, index, params, model, counters, None)
    finally:
        counters.in_flight -= 1
    counters.finished += 1
    counters.failed += 0 if outcome.ok else 1
    return outcome
