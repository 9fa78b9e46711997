""""Would today's class fit?": a class's trace (core/load/trace.py) sent to an engine at its real pace or
scaled, and the answer in the capacity sweep's plain words, per engine.

`replay_trace` sends each request at its time (scaled), each conversation's turns in order: a turn
leaves at its time or when the turn before it has ended, whichever is later (a student cannot ask
again before the reply came; AIPerf's fixed schedule does the same). Every reply is as long as it
was in class (`ignore_eos`, max tokens = its output length), greedy, and measured by the one load
engine's request (`core.load.runner.measured_request`: the one stream loop, core/timing.py).

`answer` says it as the sweep does: "Today's class (28 students, 412 messages, at most 9 at once)
would have met TTFT under 500 ms for 97% of replies on vLLM and 41% on llama.cpp; at twice the
class, 88% and 12%."
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field, replace
from typing import Callable, Sequence

from backends.base import Backend, GenerationParams, display_label
from backends.errors import BackendError
from backends.registry import Registry
from core.concurrency import run_together
from core.load.prompt_sets import BenchPrompt
from core.load.runner import LevelResult, LiveCounters, RequestOutcome, measured_request
from core.load.slo import Slo, meets
from core.load.sweep_report import slo_phrase
from core.load.trace import ClassShape, TraceRequest, class_shape, scaled, synthetic_messages

TEXTS = {
    "en": {"class": "{title} ({students} students, {messages} messages, at most {at_once} at once)",
           "class_no_spans": "{title} ({students} students, {messages} messages; how many at once was not recorded)",
           "today": "Today's class", "window": "Today's busiest {minutes:g} minutes",
           "met": "{cls} would have met {slo} for {shares}",
           "share": "{share:.0%} of replies on {engine}", "scaled": "at {factor} the class, {shares}",
           "twice": "twice", "times": "{n:g} times", "and": " and ", "none": "no engine could be measured"},
    "zh": {"class": "{title}（{students} 名学生，{messages} 条消息，最多 {at_once} 条同时进行）",
           "class_no_spans": "{title}（{students} 名学生，{messages} 条消息；同时进行的条数没有记录）",
           "today": "今天的课", "window": "今天最忙的 {minutes:g} 分钟",
           "met": "{cls}在{shares}的回复能做到{slo}",
           "share": "{engine} 上有 {share:.0%}", "scaled": "学生数为 {factor}时，依次为{shares}",
           "twice": "两倍", "times": "{n:g} 倍", "and": "、", "none": "没有引擎能被测量"},
}


def _t(lang: str, key: str, **values) -> str:
    return TEXTS.get(lang, TEXTS["en"])[key].format(**values)


async def replay_trace(backend: Backend, trace: Sequence[TraceRequest], *, model: str = "",
                       live: LiveCounters | None = None,
                       on_done: Callable[[RequestOutcome], None] | None = None) -> LevelResult:
    """Send the trace's requests to `backend` at their times; each conversation's turns in order.
    Cancelled, it closes every open stream and returns what was measured, marked interrupted."""
    sessions: dict[str, list[tuple[int, TraceRequest]]] = {}
    for index, request in enumerate(sorted(trace, key=lambda r: r.timestamp_ms)):
        sessions.setdefault(request.session_id, []).append((index, request))
    outcomes: list[RequestOutcome] = []
    live = live or LiveCounters()
    conversation_numbers = {session: number for number, session in enumerate(sessions)}

    async def converse(session: str, requests: list[tuple[int, TraceRequest]]) -> None:
        for index, request in requests:
            await asyncio.sleep(max(0.0, started + request.timestamp_ms / 1000.0 - time.perf_counter()))
            messages = request.messages or synthetic_messages(request)
            params = GenerationParams(temperature=0.0, top_p=1.0, max_new_tokens=request.output_length,
                                      ignore_eos=True)
            prompt = BenchPrompt(messages, None, request.output_length, f"{session}#{request.turn}")
            outcome = await measured_request(backend, prompt, index, params, model=model, live=live)
            outcome = replace(outcome, turn=request.turn, conversation=conversation_numbers[session])
            outcomes.append(outcome)
            if on_done is not None:
                on_done(outcome)

    started = time.perf_counter()
    interrupted = False
    try:
        await run_together(converse(session, requests) for session, requests in sessions.items())
    except asyncio.CancelledError:
        interrupted = True
    duration = time.perf_counter() - started
    return LevelResult(backend.name, backend.label, model, len(sessions),
                       tuple(sorted(outcomes, key=lambda o: o.index)), duration, interrupted)


def slo_share(level: LevelResult, slo: Slo, sent: int) -> float | None:
    """Replies meeting the SLO over the requests of the trace (a failed or unsent one misses it)."""
    if not sent:
        return None
    return sum(1 for o in level.outcomes if o.ok and meets(o.record, slo)) / sent


@dataclass
class EngineReplay:
    """One engine's replays: at the class's size, then scaled."""

    name: str
    label: str
    model: str
    levels: dict[float, LevelResult] = field(default_factory=dict)  # by users factor
    shares: dict[float, float | None] = field(default_factory=dict)
    problem: str | None = None


@dataclass
class ClassFit:
    """A trace replayed on engines at the class's size and scaled, with the plain answer."""

    trace: list[TraceRequest]
    slo: Slo
    factors: tuple[float, ...] = (1.0, 2.0)
    speed: float = 1.0
    title: str = "today"  # "today" | "window"
    window_minutes: float | None = None
    engines: list[EngineReplay] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)
    running: dict | None = None
    interrupted: bool = False

    @property
    def shape(self) -> ClassShape:
        return class_shape(self.trace)

    async def run(self, registry: Registry, names: Sequence[str],
                  on_done: Callable[[str, RequestOutcome], None] | None = None) -> None:
        """Each engine that is up, one after another; for it each factor in turn."""
        try:
            for name in names:
                backend = registry.get(name)
                status = await registry.status(name)
                if not status.available or status.info is None:
                    self.skipped[name] = status.reason or "not available"
                    continue
                engine = EngineReplay(name, display_label(backend.label, status.info.stand_in), status.info.model_id)
                self.engines.append(engine)
                try:
                    await backend.warm_up()
                    for factor in self.factors:
                        requests = scaled(self.trace, speed=self.speed, users=factor)
                        live = LiveCounters()
                        stage = f"{engine.label} ×{factor:g}"
                        self.running = {"stage": stage, "finished": 0, "total": len(requests), "live": live}
                        level = await replay_trace(backend, requests, model=engine.model, live=live,
                                                   on_done=(lambda o, s=stage: on_done(s, o)) if on_done else None)
                        engine.levels[factor] = level
                        engine.shares[factor] = slo_share(level, self.slo, len(requests))
                        if level.interrupted:
                            raise asyncio.CancelledError
                except BackendError as error:
                    engine.problem = error.describe()
        except asyncio.CancelledError:
            self.interrupted = True
        finally:
            self.running = None

    def answer(self, lang: str = "en") -> str:
        """The plain answer over every engine measured, at the class's size and scaled."""
        measured = [e for e in self.engines if e.shares]
        if not measured:
            return _t(lang, "none")
        shape = self.shape
        title = _t(lang, "today") if self.title == "today" else _t(lang, "window", minutes=self.window_minutes or 0)
        cls = _t(lang, "class" if shape.most_at_once is not None else "class_no_spans", title=title,
                 students=shape.students, messages=shape.messages, at_once=shape.most_at_once)

        def shares(factor: float, full: bool) -> str:
            parts = []
            for engine in measured:
                share = engine.shares.get(factor)
                if share is None:
                    continue
                parts.append(_t(lang, "share", share=share, engine=engine.label) if full else
                             (f"{share:.0%}" if lang != "zh" else f"{engine.label} 上 {share:.0%}"))
            return _t(lang, "and").join(parts)

        sentence = _t(lang, "met", cls=cls, slo=slo_phrase(self.slo, lang), shares=shares(self.factors[0], True))
        for factor in self.factors[1:]:
            factor_text = _t(lang, "twice") if factor == 2 else _t(lang, "times", n=factor)
            scaled_shares = shares(factor, lang == "zh")
            if scaled_shares:
                sentence += ("；" if lang == "zh" else "; ") + _t(lang, "scaled", factor=factor_text, shares=scaled_shares)
        return sentence + ("。" if lang == "zh" else ".")

    def props(self, lang: str) -> dict:
        running = None
        if self.running is not None:
            live = self.running["live"]
            running = {"stage": self.running["stage"], "finished": live.finished, "total": self.running["total"]}
        done = self.running is None and (bool(self.engines) or bool(self.skipped))
        return {"title": _t(lang, "today") if self.title == "today" else
                _t(lang, "window", minutes=self.window_minutes or 0),
                "running": running, "done": done, "answer": self.answer(lang) if done else None,
                "problem": "; ".join(f"{name}: {why}" for name, why in self.skipped.items()) or None}
