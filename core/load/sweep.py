"""A capacity sweep: one engine under growing load until it saturates, and what holds under an SLO.

Each level is run by the one load engine (`core.load.runner`) and measured by the
one timing module, like a chat reply: a *concurrency* level keeps N requests in
flight (N people at once), a *rate* level sends requests at a mean rate with
vLLM's gamma arrivals (`core.load.arrivals`; 1.0 = Poisson). During a level the
engine's own state is sampled (running and waiting requests, KV-cache use,
preemptions, where it reports them; and, for every engine, the requests sent
but still without a first token: the queue as the client sees it).

A level counts replies meeting the SLO (`core.load.slo`, vLLM's goodput
definition) and an engine's sweep stops at saturation:
- a rate level whose achieved rate (completions per second) falls below 0.98 of
  the offered one (GuideLLM's rule);
- a concurrency level whose output tokens/s rose by less than 5% of the rise in
  people over the previous level (twice the people, under 5% more tokens/s);
- either, when TTFT and the queue were both still rising through the level.
`capacity` turns an engine's levels into the plain answer (`core.load.capacity_text`).
"""

from __future__ import annotations

import asyncio
import statistics
import time
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from typing import Callable, Literal, Sequence

from backends.base import Backend, GenerationParams
from backends.engine_metrics import EngineSnapshot, MetricsFormatError
from backends.errors import BackendError
from backends.registry import Registry
from core.load.arrivals import gamma_arrivals
from core.load.runner import (LevelResult, LiveCounters, RequestOutcome, Workload, conversations_needed,
                              is_conversations, run_level, warm_up_prompts)
from core.load.slo import Slo, meets
from core.load.stats import LevelSummary, summarise
from core.timing import percentile_of

Mode = Literal["concurrency", "rate"]

SATURATION_RATE_RATIO = 0.98  # achieved / offered request rate below this: the engine fell behind
# A concurrency level whose tokens/s grew by less than 5% of the growth in people did no more work:
# doubling the people (+100%) must add at least 5% tokens/s (2 -> 3 people, +50%: at least 2.5%).
THROUGHPUT_GAIN = 0.05
RISING_FACTOR = 1.25  # second half of a level above the first by a quarter ...
RISING_TTFT_MS = 50.0  # ... and by at least this much TTFT ...
RISING_QUEUE = 0.5  # ... and this many more requests waiting, on average
KV_CACHE_FULL = 0.9  # AIPerf's flag
SAMPLE_INTERVAL_S = 0.5
SNAPSHOT_TIMEOUT_S = 2.0
DEFAULT_CONCURRENCY = (1, 2, 4, 8, 16)
DEFAULT_REQUESTS = 16
DEFAULT_MAX_SECONDS = 90.0
DEFAULT_MAX_NEW_TOKENS = 64


@dataclass(frozen=True)
class SweepSettings:
    """What a sweep asks: the levels (people at once, or requests/s), how much per level, and the SLO."""

    mode: Mode
    levels: tuple[float, ...]
    slo: Slo
    requests: int = DEFAULT_REQUESTS  # per level (at least the level's concurrency in concurrency mode)
    max_seconds: float = DEFAULT_MAX_SECONDS  # per level: no request is sent after this
    max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS
    burstiness: float = 1.0
    max_concurrency: int | None = None  # rate mode: at most this many in flight (vLLM's --max-concurrency)
    warmup: int = 1
    seed: int = 0
    prompt_set: str = "en"
    conversations: bool = False  # `prompt_set` names a conversation set (core.load.runner: people talk)
    think_time_s: float = 0.0  # between a person's turns

    def __post_init__(self) -> None:
        if not self.levels or any(not level > 0 for level in self.levels):
            raise ValueError("a sweep needs levels above 0")
        if list(self.levels) != sorted(set(self.levels)):
            raise ValueError("a sweep's levels must grow: give them in increasing order, each once")
        if self.mode == "concurrency" and any(level != int(level) for level in self.levels):
            raise ValueError("concurrency levels are whole numbers of people")

    def requests_at(self, level: float) -> int:
        """Requests sent at a level: every person of a concurrency level sends at least one."""
        return max(self.requests, int(level)) if self.mode == "concurrency" else self.requests

    def level_label(self, level: float) -> str:
        return f"{level:g}" if self.mode == "concurrency" else f"{level:g} req/s"


@dataclass(frozen=True)
class EngineSample:
    """The engine during a level, at `at_s` seconds from the level's start (None: not reported)."""

    at_s: float
    running: int | None
    waiting: int | None
    kv_cache_usage: float | None
    preemptions_total: float | None
    client_waiting: int  # sent, no first token yet
    in_flight: int


@dataclass(frozen=True)
class LevelFigures:
    """One engine at one level: the load engine's summary, the SLO terms, the engine's state, saturation."""

    level: float
    summary: LevelSummary
    sent: int
    not_sent: int
    offered_rate: float | None  # requests/s of the arrival schedule (rate mode)
    achieved_rate: float | None  # requests/s completed, over the span of completions
    good_requests: int
    slo_share: float | None  # replies meeting the SLO / replies sent
    request_goodput: float  # good requests / duration (vLLM's)
    output_goodput: float  # output tokens of good requests / duration
    median_tokens_per_s_per_user: float | None
    p10_tokens_per_s_per_user: float | None
    max_running: int | None
    max_waiting: int | None
    max_kv_cache_usage: float | None
    preemptions: int | None
    mean_client_waiting: float | None
    ttft_rising: bool
    queue_rising: bool
    saturation: str | None  # why this level counts as saturated, or None

    @property
    def meets_slo(self) -> bool:
        return self.slo_share is not None and self.slo_share * 100 >= self.summary_percentile

    summary_percentile: float = 90.0


@dataclass
class EngineSweep:
    """One engine's levels in order; the sweep stopped after the first saturated one."""

    name: str
    label: str
    model: str
    server_version: str | None
    stand_in: str | None
    in_process: bool
    reports_queue: bool = False
    levels: list[LevelFigures] = field(default_factory=list)
    raw: list[LevelResult] = field(default_factory=list)
    stopped: str | None = None  # why the sweep ended early (saturation, a failure, Ctrl-C)


@dataclass
class SweepRun:
    settings: SweepSettings
    engines: list[EngineSweep]
    skipped: dict[str, str]
    hardware: str
    started_at: datetime
    interrupted: bool = False


# ---------------------------------------------------------------- sampling


class EngineSampler:
    """Samples the engine's own state and the client-side queue every `interval_s` while a level runs."""

    def __init__(self, backend: Backend, live: LiveCounters, interval_s: float = SAMPLE_INTERVAL_S) -> None:
        self.backend = backend
        self.live = live
        self.interval_s = interval_s
        self.samples: list[EngineSample] = []
        self._started = time.perf_counter()

    async def _snapshot(self) -> EngineSnapshot | None:
        try:
            return await asyncio.wait_for(self.backend.engine_snapshot(), SNAPSHOT_TIMEOUT_S)
        except (BackendError, MetricsFormatError, asyncio.TimeoutError):
            return None

    async def run(self) -> None:
        while True:
            snapshot = await self._snapshot()
            live = self.live
            client_waiting = max(0, live.started - len(live.first_token_s) - live.failed)
            self.samples.append(EngineSample(
                at_s=time.perf_counter() - self._started,
                running=_first(snapshot, "running_requests", "batch_size"),
                waiting=_first(snapshot, "waiting_requests", "queue_size"),
                kv_cache_usage=snapshot.kv_cache_usage if snapshot else None,
                preemptions_total=snapshot.preemptions_total if snapshot else None,
                client_waiting=min(client_waiting, live.in_flight), in_flight=live.in_flight))
            await asyncio.sleep(self.interval_s)


def _first(snapshot: EngineSnapshot | None, *names: str) -> int | None:
    if snapshot is None:
        return None
    return next((getattr(snapshot, name) for name in names if getattr(snapshot, name) is not None), None)


# ---------------------------------------------------------------- one level's figures


def _halves(values: Sequence[float]) -> tuple[float, float] | None:
    if len(values) < 4:
        return None
    middle = len(values) // 2
    return statistics.fmean(values[:middle]), statistics.fmean(values[middle:])


def ttft_rising(outcomes: Sequence[RequestOutcome]) -> bool:
    """TTFT of the later half of the requests (by send order) well above the earlier half's."""
    ttfts = [o.record.first_token_s * 1000 for o in sorted(outcomes, key=lambda o: o.record.started_at_unix_s)
             if o.ok and o.record.first_token_s is not None] if outcomes else []
    halves = _halves(ttfts)
    return bool(halves) and halves[1] > halves[0] * RISING_FACTOR and halves[1] - halves[0] >= RISING_TTFT_MS


def queue_rising(samples: Sequence[EngineSample], engine_queue: bool) -> bool:
    """The queue (the engine's waiting requests where it reports them, else the client's) growing."""
    values = [float(s.waiting) for s in samples if s.waiting is not None] if engine_queue else \
        [float(s.client_waiting) for s in samples]
    halves = _halves(values)
    return bool(halves) and halves[1] > halves[0] * RISING_FACTOR and halves[1] - halves[0] >= RISING_QUEUE


def achieved_rate(outcomes: Sequence[RequestOutcome]) -> float | None:
    """Completed requests per second over the span from the first completion to the last."""
    ends = sorted(o.record.started_at_unix_s + o.record.last_chunk_s for o in outcomes
                  if o.ok and o.record.last_chunk_s is not None)
    if len(ends) < 2 or ends[-1] <= ends[0]:
        return None
    return (len(ends) - 1) / (ends[-1] - ends[0])


def offered_rate(arrivals: Sequence[float]) -> float | None:
    """Requests per second of the schedule actually drawn (not the nominal rate: a short draw differs)."""
    if len(arrivals) < 2 or arrivals[-1] <= 0:
        return None
    return (len(arrivals) - 1) / arrivals[-1]


def saturation_reason(mode: Mode, figures: "LevelFigures", previous: "LevelFigures | None") -> str | None:
    """Why this level counts as saturated (the sweep stops after it), or None."""
    if mode == "rate" and figures.offered_rate and figures.achieved_rate is not None:
        ratio = figures.achieved_rate / figures.offered_rate
        if ratio < SATURATION_RATE_RATIO:
            return (f"achieved {figures.achieved_rate:.2f} of {figures.offered_rate:.2f} requests/s offered "
                    f"({ratio:.2f} < {SATURATION_RATE_RATIO})")
    if mode == "concurrency" and previous is not None and previous.summary.output_throughput > 0:
        gain = figures.summary.output_throughput / previous.summary.output_throughput - 1
        if gain < THROUGHPUT_GAIN * (figures.level / previous.level - 1):
            return (f"tokens/s stopped rising: {figures.summary.output_throughput:.1f} at {figures.level:g} "
                    f"vs {previous.summary.output_throughput:.1f} at {previous.level:g} ({gain:+.0%})")
    if figures.ttft_rising and figures.queue_rising:
        return "TTFT and the queue were both still rising through the level"
    return None


def level_figures(mode: Mode, level: float, result: LevelResult, samples: Sequence[EngineSample], slo: Slo,
                  arrivals: Sequence[float] | None, previous: LevelFigures | None, engine_queue: bool) -> LevelFigures:
    """A level's figures from its requests and the samples taken while it ran."""
    summary = summarise(result)
    sent = len(result.outcomes)
    good = [o for o in result.outcomes if o.ok and meets(o.record, slo)]
    duration = result.duration_s or 1e-9
    rates = [o.record.decode_tokens_per_s for o in result.outcomes if o.ok and o.record.decode_tokens_per_s]
    preemptions = [s.preemptions_total for s in samples if s.preemptions_total is not None]
    figures = LevelFigures(
        level=level, summary=summary, sent=sent, not_sent=result.not_sent,
        offered_rate=offered_rate(arrivals[:sent]) if arrivals is not None else None,
        achieved_rate=achieved_rate(result.outcomes),
        good_requests=len(good), slo_share=len(good) / sent if sent else None,
        request_goodput=len(good) / duration,
        output_goodput=sum(o.record.output_tokens for o in good) / duration,
        median_tokens_per_s_per_user=percentile_of(rates, 50), p10_tokens_per_s_per_user=percentile_of(rates, 10),
        max_running=max((s.running for s in samples if s.running is not None), default=None),
        max_waiting=max((s.waiting for s in samples if s.waiting is not None), default=None),
        max_kv_cache_usage=max((s.kv_cache_usage for s in samples if s.kv_cache_usage is not None), default=None),
        preemptions=int(max(preemptions) - min(preemptions)) if preemptions else None,
        mean_client_waiting=statistics.fmean(s.client_waiting for s in samples) if samples else None,
        ttft_rising=ttft_rising(result.outcomes), queue_rising=queue_rising(samples, engine_queue),
        saturation=None, summary_percentile=slo.percentile,
    )
    return replace(figures, saturation=saturation_reason(mode, figures, previous))


# ---------------------------------------------------------------- the plain answer's numbers


@dataclass(frozen=True)
class Capacity:
    """An engine's answer: the most load meeting the SLO, where it saturates, and what limits it."""

    holds_up_to: float | None  # the highest level (from the lowest, none missed below) meeting the SLO
    first_miss: float | None  # the first level that missed it
    saturates_near: float | None  # None: it did not saturate within the levels tried
    saturation: str | None
    highest_tried: float
    limit: Literal["kv_cache", "queue", "one_at_a_time", "compute"] | None
    people_at_rate: float | None  # rate mode: mean requests in flight at `holds_up_to` (Little's law)


def capacity(mode: Mode, sweep: EngineSweep) -> Capacity | None:
    """The plain answer's numbers from an engine's measured levels (None: nothing was measured)."""
    levels = sweep.levels
    if not levels:
        return None
    holds = None
    first_miss = None
    for figures in levels:
        if figures.meets_slo:
            holds = figures.level
        else:
            first_miss = figures.level
            break
    saturated = next((f for f in levels if f.saturation), None)
    if saturated is None:
        near = None
    elif mode == "concurrency":
        # More people gave no more tokens/s: the knee is the level before (or this one, if first).
        index = levels.index(saturated)
        near = levels[index - 1].level if index and "stopped rising" in saturated.saturation else saturated.level
    else:
        near = saturated.level
    at = saturated or levels[-1]
    people = None
    if mode == "rate" and holds is not None:
        held = next(f for f in levels if f.level == holds)
        mean_e2el_s = (held.summary.e2el_ms.mean or 0) / 1000
        people = (held.achieved_rate or held.level) * mean_e2el_s
    return Capacity(holds, first_miss, near, saturated.saturation if saturated else None, levels[-1].level,
                    _limit(at, sweep, saturated is not None), people)


def _limit(at: LevelFigures, sweep: EngineSweep, saturated: bool):
    if (at.max_kv_cache_usage is not None and at.max_kv_cache_usage >= KV_CACHE_FULL) or (at.preemptions or 0) > 0:
        return "kv_cache"
    if sweep.in_process:
        return "one_at_a_time"
    if sweep.reports_queue and (at.max_waiting or 0) >= 1:
        return "queue"
    if not sweep.reports_queue and (at.mean_client_waiting or 0) >= 1:
        return "queue"
    return "compute" if saturated else None


# ---------------------------------------------------------------- running it

ProgressCallback = Callable[[str, RequestOutcome | None], None]
LevelCallback = Callable[[EngineSweep, LevelFigures], None]


async def run_sweep(registry: Registry, names: Sequence[str], prompts: Workload,
                    settings: SweepSettings, hardware: str, *, progress: ProgressCallback | None = None,
                    on_level: LevelCallback | None = None, live: LiveCounters | None = None) -> SweepRun:
    """Sweep every chosen backend that is up, one at a time; cancelled, it returns what was measured."""
    run = SweepRun(settings, [], {}, hardware, datetime.now(timezone.utc))
    try:
        for name in names:
            backend = registry.get(name)
            status = await registry.status(name)
            if not status.available or status.info is None:
                run.skipped[name] = status.reason or "not available"
                continue
            info = status.info
            sweep = EngineSweep(name, backend.label, info.model_id, info.server_version, info.stand_in,
                                backend.in_process)
            run.engines.append(sweep)
            try:
                await sweep_engine(backend, sweep, prompts, settings, progress=progress, on_level=on_level, live=live)
            except BackendError as error:
                sweep.stopped = f"failed: {error.describe()}"
                if not sweep.levels:
                    run.engines.remove(sweep)
                    run.skipped[name] = f"failed during the sweep: {error.describe()}"
    except asyncio.CancelledError:
        run.interrupted = True
    return run


async def sweep_engine(backend: Backend, sweep: EngineSweep, prompts: Workload,
                       settings: SweepSettings, *, progress: ProgressCallback | None = None,
                       on_level: LevelCallback | None = None, live: LiveCounters | None = None) -> None:
    """Warm up, then run the levels in order until one saturates. Cancelled: raises CancelledError
    after keeping the level measured so far (marked interrupted)."""
    params = GenerationParams(temperature=0.0, top_p=1.0, max_new_tokens=settings.max_new_tokens)
    token_cache: dict[str, int | None] = {}

    def report(stage: str):
        return (lambda outcome: progress(stage, outcome)) if progress else None

    await backend.warm_up()
    if settings.warmup:
        warm_up = await run_level(backend, warm_up_prompts(prompts), concurrency=1, requests=settings.warmup,
                                  params=params,
                                  model=sweep.model, on_done=report(f"{sweep.label}: warm-up"),
                                  token_cache=token_cache)
        if warm_up.interrupted:
            sweep.stopped = "interrupted during the warm-up"
            raise asyncio.CancelledError
    first = await _snapshot_or_none(backend)
    sweep.reports_queue = first is not None and _first(first, "waiting_requests", "queue_size") is not None
    previous: LevelFigures | None = None
    for index, level in enumerate(settings.levels):
        count = settings.requests_at(level)
        if settings.mode == "rate":
            # With conversations, the arrivals are the conversations' starts.
            arriving = conversations_needed(prompts, count, 1) if is_conversations(prompts) else count
            arrivals = gamma_arrivals(level, settings.burstiness, arriving, seed=settings.seed + index)
            concurrency = settings.max_concurrency or arriving
        else:
            arrivals, concurrency = None, int(level)
        counters = live if live is not None else LiveCounters()
        _reset(counters)
        sampler = EngineSampler(backend, counters)
        sampling = asyncio.create_task(sampler.run())
        try:
            result = await run_level(backend, prompts, concurrency=concurrency, requests=count, params=params,
                                     model=sweep.model, live=counters, token_cache=token_cache,
                                     arrival_times_s=arrivals, send_for_s=settings.max_seconds,
                                     on_done=report(f"{sweep.label}: {settings.level_label(level)}"),
                                     think_time_s=settings.think_time_s)
        finally:
            sampling.cancel()
            await asyncio.gather(sampling, return_exceptions=True)
        figures = level_figures(settings.mode, level, result, sampler.samples, settings.slo, arrivals, previous,
                                sweep.reports_queue)
        sweep.raw.append(result)
        sweep.levels.append(figures)
        if on_level is not None:
            on_level(sweep, figures)
        if result.interrupted:
            sweep.stopped = "interrupted"
            raise asyncio.CancelledError
        if figures.saturation:
            sweep.stopped = f"saturated at {settings.level_label(level)}: {figures.saturation}"
            return
        if figures.summary.completed == 0:
            sweep.stopped = f"no request completed at {settings.level_label(level)}"
            return
        previous = figures


async def _snapshot_or_none(backend: Backend) -> EngineSnapshot | None:
    try:
        return await asyncio.wait_for(backend.engine_snapshot(), SNAPSHOT_TIMEOUT_S)
    except (BackendError, MetricsFormatError, asyncio.TimeoutError):
        return None


def _reset(counters: LiveCounters) -> None:
    counters.in_flight = counters.started = counters.finished = counters.failed = counters.output_tokens = 0
    counters.first_token_s.clear()
