"""The engines at work, without Chainlit: snapshots, the panel's rows, and simulated users.

`take_snapshot` asks a backend for its state (bounded in time, never raising
for an engine that cannot answer); `panel_props` turns each backend's latest
two snapshots into the rows the engine panel shows (public/elements/Metrics.jsx
with kind "engines"); `Simulation` runs N simulated users through the one load
engine (`core.load.runner`) and keeps the points of the "as N grows" chart.
Simulated users hold conversations (the shipped conversation set: a class's
system prompt, several turns, a think time between), so each point also has
its TTFT by turn number. `CacheLesson` runs the same conversations on two
configured backends of one engine, prefix caching on and off, one after the
other, and shows them side by side.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from dataclasses import dataclass, field, replace
from typing import Mapping, Sequence

from backends.base import Backend, GenerationParams, display_label
from backends.engine_metrics import EngineRates, EngineSnapshot, MetricsFormatError, rates
from backends.errors import BackendError
from core.load.runner import LiveCounters, Workload, planned_requests, run_level
from core.load.stats import TurnFigures, by_turn

SNAPSHOT_TIMEOUT_S = 2.0
SIMULATION_USERS = (1, 2, 4, 8, 16)
SIMULATION_REQUESTS_PER_USER = 2  # at least: each user holds one whole conversation of the set
SIMULATION_MAX_NEW_TOKENS = 64
SIMULATION_THINK_TIME_S = 1.0  # a simulated student reads each reply this long before the next turn
CACHE_LESSON_USERS = 2  # students talking at once in the prefix-cache lesson, on each backend


@dataclass(frozen=True)
class EngineReading:
    """One backend's state for the panel: its latest snapshot, or why there is none."""

    name: str
    label: str
    snapshot: EngineSnapshot | None
    problem: str | None = None  # "reports no metrics", or why it could not be read


async def take_snapshot(backend: Backend, timeout_s: float = SNAPSHOT_TIMEOUT_S) -> EngineReading:
    """The backend's engine state now; an engine that is down or reports nothing says so."""
    try:
        snapshot = await asyncio.wait_for(backend.engine_snapshot(), timeout_s)
    except BackendError as error:
        return EngineReading(backend.name, backend.label, None, error.describe())
    except MetricsFormatError as error:
        return EngineReading(backend.name, backend.label, None, str(error))
    except asyncio.TimeoutError:
        return EngineReading(backend.name, backend.label, None, f"its metrics did not answer within {timeout_s:g} s")
    if snapshot is None or snapshot.is_empty:
        return EngineReading(backend.name, backend.label, None, "this engine reports no metrics")
    return EngineReading(backend.name, backend.label, snapshot)


# One reading per engine per this interval serves every reply and panel of the process (a class of 30
# replying at once costs the engine one /metrics scrape, not 30, and the app one parse).
READING_MAX_AGE_S = 0.5


class EngineReadings:
    """The latest reading of each engine's state, shared by every session of this process.

    `reading_now(backend)` is what a reply asks as it starts: a reading at most `max_age_s` old if
    there is one, else the one being taken (started now if none is): never a wait before the
    request leaves. `read(backend, max_age_s)` awaits such a reading (the engine panel). A reply shows
    how old its reading was against when it left (`engine_summary`), since it may be a few hundred
    ms old, or taken a few ms after.
    """

    def __init__(self, max_age_s: float = READING_MAX_AGE_S, timeout_s: float = SNAPSHOT_TIMEOUT_S,
                 clock=time.monotonic) -> None:
        self.max_age_s = max_age_s
        self.timeout_s = timeout_s
        self.clock = clock
        self._latest: dict[str, tuple[float, EngineReading]] = {}
        self._taking: dict[str, asyncio.Task] = {}

    def reading_now(self, backend: Backend, max_age_s: float | None = None) -> asyncio.Future:
        """A future of the backend's reading: done at once with a fresh one, else the one being taken."""
        latest = self._latest.get(backend.name)
        limit = self.max_age_s if max_age_s is None else max_age_s
        if latest is not None and self.clock() - latest[0] <= limit:
            done = asyncio.get_running_loop().create_future()
            done.set_result(latest[1])
            return done
        task = self._taking.get(backend.name)
        if task is None:
            task = asyncio.create_task(self._take(backend))
            self._taking[backend.name] = task
        return task

    async def read(self, backend: Backend, max_age_s: float | None = None) -> EngineReading:
        """A reading at most `max_age_s` old (the shared default), taken now if there is none."""
        return await asyncio.shield(self.reading_now(backend, max_age_s))

    async def _take(self, backend: Backend) -> EngineReading:
        asked_at = self.clock()
        try:
            reading = await take_snapshot(backend, self.timeout_s)
        finally:
            self._taking.pop(backend.name, None)
        self._latest[backend.name] = (asked_at, reading)
        return reading


def reading_age_note(snapshot: EngineSnapshot, request_at_s: float) -> str:
    """'read 0.2 s before the request' / 'read 0.01 s after': how far the shared reading is from it."""
    offset_s = snapshot.taken_at_s - request_at_s
    return f"read {abs(offset_s):.2f} s {'before' if offset_s <= 0 else 'after'} the request"


def state_summary(snapshot: EngineSnapshot | None) -> str | None:
    """'3 running · 2 waiting · KV cache 14%' - the engine's state in one line (None: not reported)."""
    if snapshot is None:
        return None
    parts = []
    if snapshot.running_requests is not None:
        parts.append(f"{snapshot.running_requests} running")
    if snapshot.waiting_requests is not None:
        parts.append(f"{snapshot.waiting_requests} waiting")
    if snapshot.kv_cache_usage is not None:
        parts.append(f"KV cache {snapshot.kv_cache_usage * 100:.0f}%")
    if snapshot.context_used_tokens is not None and snapshot.context_tokens:
        parts.append(f"context {snapshot.context_used_tokens}/{snapshot.context_tokens} tokens")
    return " · ".join(parts) or None


def _fmt(value: float | None, pattern: str) -> str | None:
    return None if value is None else pattern.format(value)


def engine_rows(snapshot: EngineSnapshot, change: EngineRates | None) -> list[dict]:
    """What the panel shows for one engine: (key, label, value) rows; keys are stable for tests."""
    rows = [
        ("running", "running requests", _fmt(snapshot.running_requests, "{}")),
        ("waiting", "waiting requests", _fmt(snapshot.waiting_requests, "{}")),
        ("kv", "KV-cache use", _fmt(None if snapshot.kv_cache_usage is None else snapshot.kv_cache_usage * 100, "{:.1f}%")),
        ("prefix", "prefix-cache hit rate", _fmt(
            None if change is None or change.prefix_cache_hit_rate is None else change.prefix_cache_hit_rate * 100,
            "{:.0f}% (last second)") or _fmt(None if snapshot.prefix_cache_hit_rate is None else
                                             snapshot.prefix_cache_hit_rate * 100, "{:.0f}% (since start)")),
        ("rate", "generation tokens/s", _fmt(None if change is None else change.generation_tokens_per_s, "{:.1f}")),
        ("preemptions", "preemptions", _fmt(snapshot.preemptions_total, "{:.0f}")),
        ("queue", "queue size", _fmt(snapshot.queue_size, "{}")),
        ("batch", "current batch size", _fmt(snapshot.batch_size, "{}")),
        ("tpot", "mean time per token", _fmt(
            None if change is None or change.mean_time_per_token_s is None else change.mean_time_per_token_s * 1000,
            "{:.1f} ms (last second)") or _fmt(None if snapshot.mean_time_per_token_s is None else
                                               snapshot.mean_time_per_token_s * 1000, "{:.1f} ms (since start)")),
        ("context", "context used", None if snapshot.context_used_tokens is None or not snapshot.context_tokens else
         f"{snapshot.context_used_tokens} / {snapshot.context_tokens} tokens"),
    ]
    for figure in snapshot.more:  # what only this engine reports, as it labels it
        value = figure.pattern.format(figure.value)
        per_s = None if change is None else change.more_per_s.get(figure.key)
        if per_s is not None:
            value += f" ({per_s:.1f}/s last second)"
        rows.append((figure.key, figure.label, value))
    return [{"key": key, "label": label, "value": value} for key, label, value in rows if value is not None]


@dataclass(frozen=True)
class SimulationPoint:
    """One finished simulation: N users on one backend, and what it achieved."""

    backend: str  # the backend's display label: a stand-in says so
    users: int
    output_tokens_per_s: float
    mean_ttft_ms: float | None
    completed: int
    failed: int
    turns: tuple[TurnFigures, ...] = ()  # TTFT and cached prompt share by turn number

    def turn_props(self) -> list[dict]:
        return [turn_props(turn) for turn in self.turns]


def turn_props(turn: TurnFigures) -> dict:
    """One turn number's figures for the panel (None: not measured / not reported)."""
    return {"turn": turn.turn, "completed": turn.completed,
            "meanTtftMs": None if turn.ttft_ms.mean is None else round(turn.ttft_ms.mean, 1),
            "meanPromptTokens": None if turn.mean_input_tokens is None else round(turn.mean_input_tokens),
            "meanCachedTokens": None if turn.mean_cached_input_tokens is None else round(turn.mean_cached_input_tokens),
            "cachedShare": None if turn.cached_share is None else round(turn.cached_share, 3)}


@dataclass
class Simulation:
    """N simulated users (N concurrent requests, each user sending a few) on one backend."""

    backend: Backend
    users: int
    stand_in: str | None = None  # the backend's BackendInfo.stand_in
    live: LiveCounters = field(default_factory=LiveCounters)
    started_at_s: float = field(default_factory=time.monotonic)
    samples: list[tuple[float, int]] = field(default_factory=list)  # (seconds since start, output tokens so far)
    result: SimulationPoint | None = None
    workload: Workload | None = None

    @property
    def label(self) -> str:
        """The backend as its results are shown (a stand-in says so)."""
        return display_label(self.backend.label, self.stand_in)

    def sample(self) -> None:
        self.samples.append((time.monotonic() - self.started_at_s, self.live.output_tokens))

    def tokens_per_s_now(self, window_s: float = 2.0) -> float | None:
        """Aggregate output tokens/s over the last `window_s` of samples."""
        if len(self.samples) < 2:
            return None
        now, tokens = self.samples[-1]
        earlier = next(((t, n) for t, n in reversed(self.samples) if now - t >= window_s), self.samples[0])
        span = now - earlier[0]
        return (tokens - earlier[1]) / span if span > 0 else None

    @property
    def total(self) -> int:
        """Requests this simulation sends (whole conversations: at least one per user)."""
        return planned_requests(self.workload, self.users * SIMULATION_REQUESTS_PER_USER, self.users) \
            if self.workload else self.users * SIMULATION_REQUESTS_PER_USER

    async def run(self, workload: Workload, think_time_s: float = SIMULATION_THINK_TIME_S) -> SimulationPoint:
        self.workload = workload
        params = GenerationParams(temperature=0.7, top_p=0.95, max_new_tokens=SIMULATION_MAX_NEW_TOKENS)
        level = await run_level(self.backend, workload, concurrency=self.users,
                                requests=self.users * SIMULATION_REQUESTS_PER_USER, params=params, live=self.live,
                                think_time_s=think_time_s)
        done = [o.record for o in level.outcomes if o.ok]
        ttfts = [r.first_token_s * 1000 for r in done if r.first_token_s is not None]
        self.result = SimulationPoint(
            backend=self.label, users=self.users,
            output_tokens_per_s=sum(r.output_tokens for r in done) / level.duration_s if level.duration_s else 0.0,
            mean_ttft_ms=statistics.fmean(ttfts) if ttfts else None,
            completed=len(done), failed=len(level.outcomes) - len(done), turns=tuple(by_turn(level.outcomes)),
        )
        return self.result


@dataclass
class CacheLesson:
    """The same conversations on two configured backends of one engine - its prefix cache on, then off -
    one after the other (so neither slows the other), for the engine panel's side-by-side view.

    A teacher sees each backend's TTFT by turn: with the cache, turn 2 onwards reuses the conversation
    so far and its first token comes sooner as the conversation grows; without it, every turn
    computes its whole prompt again."""

    backends: tuple[Backend, Backend]  # cache on, cache off
    labels: tuple[str, str]  # as shown (a stand-in says so)
    users: int = CACHE_LESSON_USERS
    results: dict[str, SimulationPoint] = field(default_factory=dict)  # by label
    current: Simulation | None = None
    problem: str | None = None

    @property
    def done(self) -> bool:
        return len(self.results) == len(self.backends) or self.problem is not None

    async def run(self, workload: Workload, think_time_s: float = SIMULATION_THINK_TIME_S) -> None:
        for backend, label in zip(self.backends, self.labels):
            self.current = Simulation(backend, self.users)
            self.current.workload = workload
            point = await self.current.run(workload, think_time_s)
            self.results[label] = replace(point, backend=label)
        self.current = None

    def answer(self) -> str | None:
        """'Turn 4's first token: 180 ms with the prefix cache (88% of its prompt from the cache),
        420 ms without (0%).' - None until both ran."""
        if len(self.results) < 2:
            return None
        on, off = (self.results.get(label) for label in self.labels)
        last = min(max((t.turn for t in on.turns), default=0), max((t.turn for t in off.turns), default=0))
        if not last:
            return None

        def said(point: SimulationPoint) -> str:
            turn = next(t for t in point.turns if t.turn == last)
            ttft = "–" if turn.ttft_ms.mean is None else f"{turn.ttft_ms.mean:.0f} ms"
            share = "cache not reported" if turn.cached_share is None else f"{turn.cached_share:.0%} of its prompt cached"
            return f"{ttft} on {point.backend} ({share})"

        return f"Turn {last}'s first token came in {said(on)}, against {said(off)}."

    def props(self) -> dict:
        running = None
        if self.current is not None and self.current.result is None:
            running = {"backend": self.current.label, "finished": self.current.live.finished,
                       "total": self.current.total, "inFlight": self.current.live.in_flight}
        return {"labels": list(self.labels), "running": running, "done": self.done, "problem": self.problem,
                "columns": [{"label": label, "turns": self.results[label].turn_props() if label in self.results else [],
                             "failed": self.results[label].failed if label in self.results else None}
                            for label in self.labels],
                "answer": self.answer()}


def panel_props(readings: Sequence[EngineReading], previous: dict[str, EngineSnapshot], lang: str, *,
                simulation: Simulation | None = None, points: Sequence[SimulationPoint] = (),
                can_simulate: bool = True, message: str | None = None,
                stand_ins: Mapping[str, str | None] = {}, sweep: dict | None = None,
                sweeps: Sequence[dict] = (), lesson: dict | None = None, can_lesson: bool = False,
                replay: dict | None = None) -> dict:
    """Props for the engine panel: one card per backend, the running simulation, the N-users chart, the
    capacity sweep running or last run (`core.capacity.TeacherSweep.props`) and earlier ones (`listed`).

    `stand_ins`: backend name -> its BackendInfo.stand_in, so a stand-in's card says so.
    """
    engines = []
    for reading in readings:
        entry: dict = {"name": reading.name, "label": display_label(reading.label, stand_ins.get(reading.name)),
                       "problem": reading.problem}
        if reading.snapshot is not None:
            before = previous.get(reading.name)
            change = None
            if before is not None and before.source == reading.snapshot.source:
                try:
                    change = rates(before, reading.snapshot)
                except ValueError:
                    change = None
            entry["source"] = reading.snapshot.source
            entry["rows"] = engine_rows(reading.snapshot, change)
        engines.append(entry)
    running = None
    if simulation is not None and simulation.result is None:
        ttfts = simulation.live.first_token_s
        running = {"backend": simulation.label, "users": simulation.users,
                   "inFlight": simulation.live.in_flight, "finished": simulation.live.finished,
                   "total": simulation.total, "failed": simulation.live.failed,
                   "tokensPerS": simulation.tokens_per_s_now(),
                   "medianTtftMs": statistics.median(ttfts) * 1000 if ttfts else None}
    return {
        "kind": "engines", "lang": lang, "engines": engines, "simulation": running,
        "points": [{"backend": p.backend, "users": p.users, "tokensPerS": round(p.output_tokens_per_s, 1),
                    "meanTtftMs": None if p.mean_ttft_ms is None else round(p.mean_ttft_ms, 1),
                    "completed": p.completed, "failed": p.failed, "turns": p.turn_props()} for p in points],
        "users": list(SIMULATION_USERS), "canSimulate": can_simulate, "message": message,
        "sweep": sweep, "sweeps": list(sweeps), "lesson": lesson, "canLesson": can_lesson, "replay": replay,
    }
