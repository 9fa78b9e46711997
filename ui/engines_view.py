"""The engine panel, "Simulate N users" and /bench: the Chainlit side.

The panel shows the session's backend(s) - the chosen one, or the compared ones
- refreshed about once a second while it is open (at most 10 minutes), from each
engine's own metrics (`core.engines`). A simulation sends N concurrent users'
requests through the one load engine, in the background, so the person's own
chat keeps working. A capacity sweep (`core.capacity`) grows the load on the
session's backend until it saturates, draws it live in the panel, ends with the
plain answer and stores it (listed in the panel later). /bench runs a short
`python -m bench` on the same backends and shows its table and chart. All are load: one load run (a simulation or a
/bench) at a time per app, with login on only teachers may start one (so a
classroom cannot multiply the load by 30), and none in blind mode (an engine's
load would show which column is which). A stand-in backend is labelled as one
wherever its numbers appear (`display_label`).

Each engine's live load is the plainest way to tell a blind round's columns apart (the engine
running a request while column A streams is column A), so the panel asks the person's blind
rule (core.disclosure) when it opens and before each refresh: it closes, without any engine's
figures, once a blind round of the person waits for its vote (in any tab or replica), and while
any blind round in the deployment is open only a teacher (with login on) may watch it.
"""

from __future__ import annotations

import asyncio
import os
import time
from datetime import datetime, timedelta, timezone
from dataclasses import dataclass, field

import chainlit as cl
import plotly.graph_objects as go

from backends.base import display_label
from backends.engine_metrics import EngineSnapshot
from config import ConfigurationError
from backends.llamacpp import PromptTokenizer
from core.capacity import APP_PROMPTS, TeacherSweep, app_sweep_settings, listed, slo_from_env
from core.load.class_fit import ClassFit
from core.load.trace import busiest_window, class_session, class_shape, trace_from_replies, trace_jsonl
from store import StoreError
from core.load.article import RunSettings, article_table, hardware_summary, run_benchmark
from core.load.stats import turns_line
from core.load.sweep_report import levels_table, slo_phrase
from core.load.prompt_sets import load_conversation_set, load_prompt_set
from core.engines import SIMULATION_USERS, CacheLesson, Simulation, SimulationPoint, panel_props
from config import cache_lesson_backends
from core.app_state import AppState, live_load_refusal, load_refusal
from core.notices import Notice
from core.texts import text
from ui.session_view import (MetricsElement, app_state, current_rule, current_user, lab, lang, say, screened,
                             session_settings)

REFRESH_S = 1.0
PANEL_OPEN_FOR_S = 600.0
CHAT_BENCH = RunSettings(concurrency=(1, 4), requests=8, max_new_tokens=64, warmup=1, prompt_set="en")


@dataclass
class Panel:
    """One session's open engine panel."""

    element: MetricsElement
    backends: list[str]
    task: asyncio.Task | None = None
    previous: dict[str, EngineSnapshot] = field(default_factory=dict)
    points: list[SimulationPoint] = field(default_factory=list)
    message: str | None = None
    sweeps: list[dict] = field(default_factory=list)  # earlier capacity sweeps (core.capacity.listed)


def _panel() -> Panel | None:
    return lab().engine_panel


def chosen_backends() -> list[str]:
    settings = session_settings()
    return list(settings.compare_backends) if settings.mode != "chat" else [settings.backend]


def close_rounds_action(lang_code: str) -> cl.Action:
    return cl.Action(name="close_rounds", payload={}, label=text("action_close_rounds", lang_code), icon="lock-open")


def _may_load(identifier: str | None) -> bool:
    return app_state().auth.is_teacher(identifier)


async def _panel_refusal() -> str | None:
    """Why the panel may not show live load now (core.app_state.live_load_refusal), in words."""
    refusal = await live_load_refusal(app_state(), session_settings().mode, current_user(), rule=await current_rule())
    return refusal.render(lang()) if refusal is not None else None


async def open_panel() -> None:
    """Show the engines of this chat's backend(s), refreshed every second."""
    lang_code = lang()
    refusal = await live_load_refusal(app_state(), session_settings().mode, current_user(), rule=await current_rule())
    if refusal is not None:
        # The class's open rounds hold it: whoever may close them gets the button beside the reason.
        closing = refusal.key == "panel_class_blind" and _may_load(current_user())
        await say(refusal.render(lang_code), actions=[close_rounds_action(lang_code)] if closing else [])
        return
    old = _panel()
    if old is not None and old.task is not None:
        old.task.cancel()
    panel = Panel(MetricsElement(name="Metrics", props={}, display="inline"), chosen_backends())
    panel.sweeps = listed(await app_state().earlier_sweeps(), lang_code)
    if not await _refresh(panel, send=False):
        await say(panel.element.props["message"])
        return
    lab().engine_panel = panel
    await say(text("panel_title", lang_code), author="Engines", elements=[panel.element])
    panel.task = asyncio.create_task(_refresh_loop(panel))


async def close_panel() -> None:
    """Stop refreshing (the person closed it, or the chat ended)."""
    panel = _panel()
    if panel is None or panel.task is None or panel.task.done():
        return
    panel.task.cancel()
    await _show_closed(panel, text("panel_closed", lang()))


async def _show_closed(panel: Panel, message: str, *, forget_engines: bool = False) -> None:
    """The panel's last update: closed, with `message`; without any engine's figures when the
    session turned blind (core.disclosure: they would show which column is which)."""
    props = {**panel.element.props, "message": message, "closed": True}
    if forget_engines:
        props.update(engines=[], simulation=None, points=[])
    panel.element.props = props
    await panel.element.update()


async def _refresh(panel: Panel, *, send: bool = True) -> bool:
    """Read every engine of the panel and draw it (`send`); False, with no engine's figures left in
    the element, when the panel may not show them any more (a blind round waits)."""
    state = app_state()
    backends = [state.registry.get(name) for name in panel.backends]
    readings = await asyncio.gather(*(state.readings.read(backend) for backend in backends))
    # An engine whose metrics answer is up: ask its status if none is known yet (cached a while).
    stand_ins = await _stand_ins(panel.backends, probe={r.name for r in readings if r.snapshot is not None})
    simulation = state.simulation
    if simulation is not None and simulation.result is None:
        simulation.sample()
    panel.element.props = panel_props(readings, panel.previous, lang(), simulation=simulation, points=panel.points,
                                      can_simulate=_may_load(current_user()), message=panel.message,
                                      stand_ins=stand_ins,
                                      sweep=state.capacity_sweep.props(lang()) if state.capacity_sweep else None,
                                      sweeps=panel.sweeps,
                                      lesson=state.cache_lesson.props() if state.cache_lesson else None,
                                      can_lesson=_lesson_pair() is not None,
                                      replay=state.class_replay.props(lang()) if state.class_replay else None)
    if state.auth.enabled and state.auth.is_teacher(current_user()):
        _add_queue_by_person(panel.element.props["engines"], backends)
    panel.previous = {reading.name: reading.snapshot for reading in readings if reading.snapshot is not None}
    if (refusal := await _panel_refusal()) is not None:  # it may have changed while reading
        panel.element.props = {"message": refusal, "closed": True, "engines": [], "simulation": None, "points": []}
        return False
    if send:
        await panel.element.update()
    return True


def _add_queue_by_person(engines: list[dict], backends: list) -> None:
    """The teacher's row on an engine that queues in this process (the embedded one): who waits, by
    login, as it serves them (in turn, backends/llamacpp.py). Students never see other names."""
    for entry, backend in zip(engines, backends):
        waiting = getattr(getattr(backend, "model", None), "waiting_by_person", None)
        if not callable(waiting) or "rows" not in entry:
            continue
        counts = waiting()
        shown = " · ".join(f"{person[len('user:'):] if person.startswith('user:') else '?'} {count}"
                           for person, count in sorted(counts.items(), key=lambda item: -item[1]))
        entry["rows"].append({"key": "people", "label": "queue by person", "value": shown or "nobody"})


async def _refresh_loop(panel: Panel) -> None:
    closes_at = time.monotonic() + PANEL_OPEN_FOR_S
    while time.monotonic() < closes_at:
        await asyncio.sleep(REFRESH_S)
        if (refusal := await _panel_refusal()) is not None:
            # The session switched to blind mode, a blind round of the person waits, or one is open in
            # the deployment and this is no teacher: not one more reading.
            await _show_closed(panel, refusal, forget_engines=True)
            return
        if not await _refresh(panel):
            await panel.element.update()  # closed, without any engine's figures
            return
    panel.message = text("panel_timed_out", lang())
    await _refresh(panel)


async def _stand_ins(names: list[str], probe: set[str] | frozenset[str] = frozenset()) -> dict[str, str | None]:
    """Each backend's `stand_in` (what it only stands in for, or None) from its last known status;
    the names in `probe` are asked when none is known (the answer is cached a while)."""
    state = app_state()
    known = state.cached_statuses()
    stand_ins = {}
    for name in names:
        status = known.get(name)
        if (status is None or status.info is None) and name in probe:
            status = await state.status(name)
        stand_ins[name] = status.info.stand_in if status is not None and status.info is not None else None
    return stand_ins


async def _not_a_teacher() -> dict | None:
    """A load action's refusal for a student, before the action says anything of its own setup."""
    if app_state().auth.is_teacher(current_user()):
        return None
    return await _refuse(Notice("simulate_teachers_only").render(lang()))


async def simulate(payload: object) -> dict:
    """Start N simulated users on this chat's backend(s), in the background. Returns {"ok", "message"}."""
    state, lang_code = app_state(), lang()
    if (refused := await _not_a_teacher()) is not None:
        return refused
    users = payload.get("users") if isinstance(payload, dict) else None
    if users not in SIMULATION_USERS:
        return await _refuse(text("simulate_bad_users", lang_code, users=str(users)[:20],
                                  allowed=", ".join(map(str, SIMULATION_USERS))))
    names = chosen_backends()
    backends = [state.registry.get(name) for name in names]
    async with state.load_lock:
        if (refusal := await load_refusal(state, session_settings().mode, current_user(),
                                          rule=await current_rule())) is not None:
            return await _refuse(refusal.render(lang_code))
        stand_ins = await _stand_ins(names, probe=set(names))
        labels = ", ".join(display_label(b.label, stand_ins[b.name]) for b in backends)
        if (refusal := await state.start_load(Notice("simulate_busy", {"users": users, "backend": labels}),
                                              _run_simulations(backends, users, stand_ins))) is not None:
            return await _refuse(refusal.render(lang_code))  # another replica's run started first
        # Before the next await, so the run (started at it) finds the simulation the panel shows.
        state.simulation = Simulation(backends[0], users, stand_ins[backends[0].name])
        if _panel() is None:
            await open_panel()
    message = text("simulate_started", lang_code, users=users, backends=labels)
    await say(message)
    return {"ok": True, "message": message}


def class_conversations(lang_code: str):
    """The shipped conversation set in the person's language: what simulated students say."""
    return load_conversation_set("zh" if lang_code == "zh" else "en")


async def _run_simulations(backends, users: int, stand_ins: dict[str, str | None]) -> None:
    state = app_state()
    try:
        prompts = class_conversations(lang())
        results = []
        try:
            for backend in backends:
                simulation = state.simulation
                if simulation is None or simulation.backend is not backend:
                    simulation = Simulation(backend, users, stand_ins.get(backend.name))
                state.simulation = simulation
                results.append(await simulation.run(prompts))
                panel = _panel()
                if panel is not None:
                    panel.points.append(simulation.result)
        finally:
            if state.simulation is not None and state.simulation.result is None:
                state.simulation.result = SimulationPoint(state.simulation.label, users, 0.0, None, 0, 0)
        lines = [f"| {p.backend} | {p.users} | {p.output_tokens_per_s:.1f} | "
                 f"{'–' if p.mean_ttft_ms is None else f'{p.mean_ttft_ms:.0f}'} | {p.completed} | {p.failed} |"
                 for p in results]
        by_turn = [f"- {p.backend}: {turns_line(p.turns)}" for p in results if p.turns]
        await say(text("simulate_done", lang(), users=users) + "\n\n| backend | users | tokens/s (all) | "
                  "mean TTFT ms | replies | failed |\n|---|---|---|---|---|---|\n" + "\n".join(lines)
                  + ("\n\n" + text("ttft_by_turn", lang()) + "\n" + "\n".join(by_turn) if by_turn else ""))
    finally:
        await state.end_load(asyncio.current_task())


async def capacity_sweep(_payload: object = None) -> dict:
    """Start a capacity sweep on this chat's backend (the first compared one), in the background, with
    a live chart in the engine panel; the plain answer ends it and is stored. Returns {"ok", "message"}."""
    state, lang_code = app_state(), lang()
    if (refused := await _not_a_teacher()) is not None:
        return refused
    name = chosen_backends()[0]
    backend = state.registry.get(name)
    try:
        settings = app_sweep_settings()
    except ConfigurationError as error:
        return await _refuse(str(error))
    async with state.load_lock:
        if (refusal := await load_refusal(state, session_settings().mode, current_user(),
                                          rule=await current_rule())) is not None:
            return await _refuse(refusal.render(lang_code))
        stand_ins = await _stand_ins([name], probe={name})
        label = display_label(backend.label, stand_ins[name])
        sweep = TeacherSweep(name, label, settings, user=current_user())
        if (refusal := await state.start_load(Notice("sweep_busy", {"backend": label}),
                                              _run_capacity_sweep(sweep))) is not None:
            return await _refuse(refusal.render(lang_code))  # another replica's run started first
        state.capacity_sweep = sweep
        if _panel() is None:
            await open_panel()
    message = text("sweep_started", lang_code, backend=label, slo=slo_phrase(settings.slo, lang_code),
                   percentile=settings.slo.percentile)
    await say(message)
    return {"ok": True, "message": message}


async def _run_capacity_sweep(sweep: TeacherSweep) -> None:
    state, lang_code = app_state(), lang()
    try:
        try:
            run = await sweep.execute(state.registry, load_prompt_set(APP_PROMPTS), hardware_summary())
        except asyncio.CancelledError:
            await say(text("sweep_stopped", lang_code))
            raise
        row = sweep.stored()
        if row is None:
            await say(text("sweep_failed", lang_code, problem=sweep.problem or "–"))
            return
        notice = await state.save_sweep(row)
        panel = _panel()
        if panel is not None:
            panel.sweeps = listed(await state.earlier_sweeps(), lang_code)
        table = levels_table(run)
        await say(text("sweep_done", lang_code, answer=sweep.answer(lang_code)) + "\n\n" + table
                  + (f"\n\n{notice.render(lang_code)}" if notice else ""), author="Engines")
    finally:
        await state.end_load(asyncio.current_task())


def _lesson_pair() -> tuple[str, str] | None:
    """The two backends of the prefix-cache lesson (CACHE_LESSON_BACKENDS), or None when not configured."""
    try:
        return cache_lesson_backends(dict(os.environ), app_state().registry.names)
    except ConfigurationError:
        return None


async def cache_lesson(_payload: object = None) -> dict:
    """The prefix-cache lesson: the class's conversations on CACHE_LESSON_BACKENDS (cache on, then off),
    side by side in the engine panel, TTFT by turn. The same load rules as a simulation."""
    state, lang_code = app_state(), lang()
    if (refused := await _not_a_teacher()) is not None:
        return refused
    try:
        pair = cache_lesson_backends(dict(os.environ), state.registry.names)
    except ConfigurationError as error:
        return await _refuse(str(error))
    if pair is None:
        return await _refuse(text("lesson_not_configured", lang_code))
    backends = (state.registry.get(pair[0]), state.registry.get(pair[1]))
    async with state.load_lock:
        if (refusal := await load_refusal(state, session_settings().mode, current_user(),
                                          rule=await current_rule())) is not None:
            return await _refuse(refusal.render(lang_code))
        stand_ins = await _stand_ins(list(pair), probe=set(pair))
        labels = (display_label(backends[0].label, stand_ins[pair[0]]), display_label(backends[1].label, stand_ins[pair[1]]))
        lesson = CacheLesson(backends, labels)
        if (refusal := await state.start_load(Notice("lesson_busy", {"backends": " / ".join(labels)}),
                                              _run_lesson(lesson))) is not None:
            return await _refuse(refusal.render(lang_code))
        state.cache_lesson = lesson
        if _panel() is None:
            await open_panel()
    message = text("lesson_started", lang_code, on=labels[0], off=labels[1], users=lesson.users)
    await say(message)
    return {"ok": True, "message": message}


async def _run_lesson(lesson: CacheLesson) -> None:
    state, lang_code = app_state(), lang()
    try:
        await lesson.run(class_conversations(lang_code))
        answer = lesson.answer()
        lines = [f"- {label}: {turns_line(point.turns)}" for label, point in lesson.results.items()]
        await say(text("lesson_done", lang_code, answer=answer or "–") + "\n\n" + "\n".join(lines), author="Engines")
    finally:
        await state.end_load(asyncio.current_task())


CLASS_FIT_WINDOW_S = 120.0  # the panel replays the class's busiest two minutes, at its real pace
CLASS_FIT_DAYS = 1  # the latest class session within this many days


async def _class_trace(texts: bool) -> tuple[list, str | None]:
    """The latest class session's trace (core/load/trace.py) from the stored replies of every student,
    or why there is none."""
    state, lang_code = app_state(), lang()
    store = await state.storage()
    if store is None:
        return [], text("storage_unavailable", lang_code, problem=state.storage_problem)
    try:
        replies = await store.replies(limit=50_000, since=datetime.now(timezone.utc) - timedelta(days=CLASS_FIT_DAYS))
    except StoreError as error:
        return [], text("storage_failed", lang_code, problem=str(error))
    session = class_session(replies)
    if not session:
        return [], text("trace_empty", lang_code)
    tokenizer = await asyncio.to_thread(PromptTokenizer)
    trace = await asyncio.to_thread(trace_from_replies, session, tokenizer.tokens, texts=texts)
    return trace, None


async def export_trace(arguments: str = "") -> None:
    """/trace: the latest class session as a trace (JSONL, core/load/trace.py), texts left out with
    "/trace notext". Teachers only: it holds every student's messages and timing."""
    lang_code = lang()
    if not _may_load(current_user()):
        await say(text("trace_teachers_only", lang_code))
        return
    texts = arguments.strip().lower() not in ("notext", "no-text", "without-texts")
    trace, problem = await _class_trace(texts)
    if problem:
        await say(problem)
        return
    shape = class_shape(trace)
    name = f"class-trace-{datetime.now(timezone.utc):%Y-%m-%d}{'' if texts else '-notext'}.jsonl"
    await say(text("trace_ready", lang_code, students=shape.students, messages=shape.messages, name=name,
                   conversations=shape.conversations), author="Engines",
              elements=[cl.File(name=name, content=trace_jsonl(trace), mime="application/jsonl", display="inline")])


async def class_fit(_payload: object = None) -> dict:
    """"Would today's class fit?": the busiest two minutes of the latest class session replayed on this
    chat's backend(s) at its real pace, then at twice the class, answered in plain words. The same load
    rules as a simulation."""
    state, lang_code = app_state(), lang()
    if (refused := await _not_a_teacher()) is not None:
        return refused
    names = chosen_backends()
    try:
        slo = slo_from_env()
    except ConfigurationError as error:
        return await _refuse(str(error))
    async with state.load_lock:
        if (refusal := await load_refusal(state, session_settings().mode, current_user(),
                                          rule=await current_rule())) is not None:
            return await _refuse(refusal.render(lang_code))
        trace, problem = await _class_trace(texts=True)
        if problem:
            return await _refuse(problem)
        window = busiest_window(trace, CLASS_FIT_WINDOW_S)
        fit = ClassFit(window, slo, title="today" if len(window) == len(trace) else "window",
                       window_minutes=CLASS_FIT_WINDOW_S / 60)
        if (refusal := await state.start_load(Notice("class_fit_busy", {}), _run_class_fit(fit, names))) is not None:
            return await _refuse(refusal.render(lang_code))
        state.class_replay = fit
        if _panel() is None:
            await open_panel()
    message = text("class_fit_started", lang_code, messages=len(window), backends=", ".join(names))
    await say(message)
    return {"ok": True, "message": message}


async def _run_class_fit(fit: ClassFit, names: list[str]) -> None:
    state, lang_code = app_state(), lang()
    try:
        await fit.run(state.registry, names)
        await say(text("class_fit_done", lang_code, answer=fit.answer(lang_code)), author="Engines")
    finally:
        await state.end_load(asyncio.current_task())


async def _refuse(message: str) -> dict:
    await say(f"⚠️ {message}")
    return {"ok": False, "message": message}


async def run_bench() -> None:
    """A short benchmark of this chat's backend(s) with the app's load engine, with progress."""
    state, lang_code = app_state(), lang()
    names = chosen_backends()
    async with state.load_lock:
        if (refusal := await load_refusal(state, session_settings().mode, current_user(),
                                          rule=await current_rule())) is not None:
            await _refuse(refusal.render(lang_code))
            return
        stand_ins = await _stand_ins(names, probe=set(names))
        if (refusal := await state.start_load(Notice("bench_busy", {"backends": ", ".join(
                display_label(state.registry.get(name).label, stand_ins[name]) for name in names)}))) is not None:
            await _refuse(refusal.render(lang_code))
            return
    try:
        await _bench(state, names, lang_code)
    finally:
        await state.end_load(asyncio.current_task())


async def _bench(state: AppState, names: list[str], lang_code: str) -> None:
    total = len(names) * (CHAT_BENCH.warmup + CHAT_BENCH.requests * len(CHAT_BENCH.concurrency))
    progress = await say(text("bench_progress", lang_code, done=0, total=total, bar="░" * 20, stage="…"))
    done = 0
    last_update = 0.0

    def report(stage: str, _outcome) -> None:
        nonlocal done, last_update
        done += 1
        now = time.monotonic()
        if now - last_update > 0.5 or done == total:
            last_update = now
            filled = round(20 * done / total)
            progress.content = screened(text("bench_progress", lang_code, done=done, total=total,
                                             bar="▓" * filled + "░" * (20 - filled), stage=stage))
            asyncio.get_running_loop().create_task(progress.update())

    run = await run_benchmark(state.registry, names, load_prompt_set(CHAT_BENCH.prompt_set), CHAT_BENCH, report)
    figure = go.Figure()
    for engine in run.engines:
        name = display_label(engine.label, engine.stand_in)
        figure.add_trace(go.Bar(name=f"{name} tokens/s", x=[f"{s.concurrency} concurrent" for s in engine.summaries],
                                y=[round(s.output_throughput, 1) for s in engine.summaries]))
    figure.update_layout(yaxis_title="output tokens/s (all requests)", barmode="group", height=360, margin=dict(t=30))
    await say(text("bench_title", lang_code) + "\n\n" + article_table(run), author="Benchmark",
              elements=[cl.Plotly(name="bench_chart", figure=figure, display="inline")])
