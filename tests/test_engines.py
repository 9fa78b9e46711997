"""The engines at work without a browser: the panel's labels, simulations and /bench as load
(one load run per app, none in blind mode, teachers only), on fake backends."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

from backends.engine_metrics import EngineFigure, EngineSnapshot
from core.load.prompt_sets import load_prompt_set
from ui import engines_view
from core.auth import AuthConfig
from core.engines import EngineReading, Simulation, SimulationPoint, panel_props
from core.app_state import load_refusal
from core.disclosure import Disclosure
from core.notices import Notice
from core.settings import SessionSettings
from tests.fakes import FakeBackend, FakeReply, fake_state

STAND_IN = "TGI-protocol test server, not TGI itself"


def settings(backend: str, mode: str = "chat", compare: tuple[str, ...] = ()) -> SessionSettings:
    return SessionSettings(backend=backend, temperature=0.7, top_p=0.95, max_new_tokens=32, system_preset="none",
                           mode=mode, compare_backends=compare)


def test_a_stand_ins_card_running_simulation_and_chart_points_say_stand_in():
    tgi = FakeBackend("tgi", label="TGI")
    readings = [EngineReading("tgi", "TGI", EngineSnapshot(source="TGI /metrics", taken_at_s=1.0, queue_size=2)),
                EngineReading("vllm", "vLLM", EngineSnapshot(source="vLLM /metrics", taken_at_s=1.0,
                                                             running_requests=1))]
    simulation = Simulation(tgi, 4, STAND_IN)
    points = [SimulationPoint(Simulation(tgi, 2, STAND_IN).label, 2, 10.0, 300.0, 4, 0)]
    props = panel_props(readings, {}, "en", simulation=simulation, points=points,
                        stand_ins={"tgi": STAND_IN, "vllm": None})
    assert [engine["label"] for engine in props["engines"]] == ["TGI (stand-in)", "vLLM"]
    assert props["simulation"]["backend"] == "TGI (stand-in)"
    assert props["points"][0]["backend"] == "TGI (stand-in)"


def test_figures_only_one_engine_reports_get_rows_after_the_common_ones_and_counters_a_rate():
    def snapshot(at_s: float, decodes: float) -> EngineSnapshot:
        return EngineSnapshot(source="Engine X /metrics", taken_at_s=at_s, running_requests=1, more=(
            EngineFigure("slots", "slots busy / idle", 1.0, "{:.0f} / 3"),
            EngineFigure("decodes", "decode calls", decodes, "{:.0f}", counter=True)))

    assert not EngineSnapshot(source="x", taken_at_s=0.0, more=snapshot(0, 0).more).is_empty
    props = panel_props([EngineReading("x", "Engine X", snapshot(2.0, 150.0))], {"x": snapshot(1.0, 100.0)}, "en")
    rows = [(row["key"], row["value"]) for row in props["engines"][0]["rows"]]
    assert rows == [("running", "1"), ("slots", "1 / 3"), ("decodes", "150 (50.0/s last second)")]
    first = panel_props([EngineReading("x", "Engine X", snapshot(2.0, 150.0))], {}, "en")
    assert first["engines"][0]["rows"][-1] == {"key": "decodes", "label": "decode calls", "value": "150"}


def _prompts():
    return load_prompt_set("en")[:2]


async def test_a_simulations_result_names_a_stand_in_as_one():
    point = await Simulation(FakeBackend("tgi", label="TGI"), 1, STAND_IN).run(_prompts())
    assert point.backend == "TGI (stand-in)" and point.completed == 2
    plain = await Simulation(FakeBackend("vllm", label="vLLM"), 1).run(_prompts())
    assert plain.backend == "vLLM"


async def test_who_may_start_load_and_when():
    state = fake_state(FakeBackend("a"))
    state.auth = AuthConfig(users={"teacher": "x", "student": "x"}, teachers=frozenset({"teacher"}))
    assert await load_refusal(state, "chat", "student", rule=Disclosure()) == Notice("simulate_teachers_only")
    assert await load_refusal(state, "blind", "teacher", rule=Disclosure()) == Notice("panel_blind")
    assert await load_refusal(state, "compare", "teacher", rule=Disclosure()) is None
    busy = Notice("simulate_busy", {"users": 4, "backend": "a"})
    release = asyncio.Event()
    assert await state.start_load(busy, release.wait()) is None
    run = state.load_task
    assert await load_refusal(state, "chat", "teacher", rule=Disclosure()) == busy
    other = asyncio.create_task(asyncio.sleep(0))
    await state.end_load(other)  # another task's end releases nothing
    assert await state.running_load() == busy
    release.set()
    await run
    await state.end_load(run)
    assert await state.running_load() is None and await load_refusal(state, "chat", "teacher", rule=Disclosure()) is None


@pytest.fixture
def view(monkeypatch):
    """ui.engines_view with its Chainlit helpers replaced; what it says is kept in `said`."""
    world = SimpleNamespace(state=None, settings=None, user=None, said=[])

    async def say(content: str, **kwargs):
        world.said.append(content)
        return SimpleNamespace(content=content, update=_nothing)

    monkeypatch.setattr(engines_view, "app_state", lambda: world.state)
    monkeypatch.setattr(engines_view, "session_settings", lambda: world.settings)
    monkeypatch.setattr(engines_view, "current_user", lambda: world.user)
    monkeypatch.setattr(engines_view, "lang", lambda: "en")
    world.rule = Disclosure()

    async def current_rule():
        return world.rule

    monkeypatch.setattr(engines_view, "current_rule", current_rule)
    monkeypatch.setattr(engines_view, "say", say)
    monkeypatch.setattr(engines_view, "_panel", lambda: None)
    monkeypatch.setattr(engines_view, "open_panel", _nothing)
    return world


async def _nothing(*args, **kwargs) -> None:
    return None


async def test_bench_is_refused_in_blind_mode_and_sends_nothing(view):
    a, b = FakeBackend("a"), FakeBackend("b")
    view.state, view.settings = fake_state(a, b), settings("a", mode="blind", compare=("a", "b"))
    await engines_view.run_bench()
    assert "/bench are off in blind mode" in view.said[-1]
    assert await view.state.running_load() is None and a.requests == [] and b.requests == []


async def test_bench_waits_its_turn_behind_a_simulation_which_the_app_keeps_until_it_ends(view):
    tgi = FakeBackend("tgi", label="TGI", stand_in=STAND_IN,
                      replies=[FakeReply(["word "] * 15, interval_s=0.02) for _ in range(2)])
    view.state, view.settings = fake_state(tgi), settings("tgi")
    started = await engines_view.simulate({"users": 1})
    assert started["ok"] and "TGI (stand-in)" in started["message"]
    task = view.state.load_task
    assert isinstance(task, asyncio.Task) and not task.done()  # the app holds the simulation's task
    await engines_view.run_bench()
    assert "A simulation is already running (1 users on TGI (stand-in))" in view.said[-1]
    await asyncio.wait_for(task, 30)
    assert view.state.load_task is None and await view.state.running_load() is None
    # The simulated student's one whole conversation of the class set (4 turns); /bench sent none.
    assert len(tgi.requests) == 4 and len(tgi.requests[-1].messages) == 8
    assert "| TGI (stand-in) | 1 |" in view.said[-1]  # the results table
    assert view.state.simulation.result.backend == "TGI (stand-in)"


class BenchStopped(Exception):
    pass


async def test_a_simulation_waits_its_turn_behind_a_bench_and_a_failed_bench_frees_the_app(view, monkeypatch):
    tgi = FakeBackend("tgi", label="TGI", stand_in=STAND_IN)
    view.state, view.settings = fake_state(tgi), settings("tgi")
    running, release = asyncio.Event(), asyncio.Event()

    async def run_benchmark(*args, **kwargs):
        running.set()
        await release.wait()
        raise BenchStopped

    monkeypatch.setattr(engines_view, "run_benchmark", run_benchmark)
    bench = asyncio.create_task(engines_view.run_bench())
    await asyncio.wait_for(running.wait(), 10)
    refused = await engines_view.simulate({"users": 2})
    assert not refused["ok"] and "A /bench is already running (on TGI (stand-in))" in refused["message"]
    await engines_view.run_bench()  # a second /bench too
    assert "A /bench is already running" in view.said[-1]
    release.set()
    with pytest.raises(BenchStopped):
        await bench
    assert await view.state.running_load() is None
    started = await engines_view.simulate({"users": 1})
    assert started["ok"]
    await asyncio.wait_for(view.state.load_task, 30)


async def test_the_panel_learns_a_stand_in_from_the_backends_status(view):
    tgi = FakeBackend("tgi", label="TGI", stand_in=STAND_IN)
    view.state = fake_state(tgi, FakeBackend("vllm", label="vLLM"))
    assert await engines_view._stand_ins(["tgi", "vllm"]) == {"tgi": None, "vllm": None}  # nothing known yet
    assert await engines_view._stand_ins(["tgi", "vllm"], probe={"tgi", "vllm"}) == {"tgi": STAND_IN, "vllm": None}
    tgi.stand_in = None  # known now: the cached status answers, without asking again
    assert await engines_view._stand_ins(["tgi"]) == {"tgi": STAND_IN}


async def test_a_reply_from_a_stand_in_is_labelled_one_in_its_figures_and_its_stored_row():
    from core.replies import plan_reply, stored_reply
    from core.figures import initial_props

    tgi = FakeBackend("tgi", label="TGI", stand_in=STAND_IN, replies=[FakeReply(["Hi", " there"])])
    vllm = FakeBackend("vllm", label="vLLM", replies=[FakeReply(["Hello"])])
    state = fake_state(tgi, vllm)
    for backend, shown in ((tgi, "TGI (stand-in)"), (vllm, "vLLM")):
        plan = await plan_reply(state, settings(backend.name), [], "hello")
        assert plan.label == shown
        assert initial_props(backend=plan.label, model=plan.model, request=plan.request, lang="en")["backend"] == shown
        timed = plan.open_stream()
        text = "".join([chunk.text async for chunk in timed])
        record = timed.finish("completed")
        assert text and record.backend == shown
        assert stored_reply(plan, record, user_text="hello", reply_text=text).backend_label == shown


class CountedEngine(FakeBackend):
    """A fake engine that counts how often its state is read, each reading taking a moment."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.readings = 0

    async def engine_snapshot(self):
        import time

        self.readings += 1
        taken_at_s = time.monotonic()
        await asyncio.sleep(0.05)
        return EngineSnapshot(source="fake /metrics", taken_at_s=taken_at_s, running_requests=self.readings)


async def test_a_class_of_replies_shares_one_reading_of_the_engine():
    """30 replies starting together cost the engine one reading, not 30; a reading younger than
    the shared age serves later replies; an older one is taken again."""
    from core.engines import EngineReadings

    engine = CountedEngine("vllm")
    readings = EngineReadings(max_age_s=0.3)
    futures = [readings.reading_now(engine) for _ in range(30)]
    results = await asyncio.gather(*futures)
    assert engine.readings == 1 and {result.snapshot.running_requests for result in results} == {1}
    assert (await readings.read(engine)).snapshot.running_requests == 1 and engine.readings == 1
    await asyncio.sleep(0.35)
    assert (await readings.read(engine)).snapshot.running_requests == 2 and engine.readings == 2


async def test_a_replys_engine_state_is_the_shared_reading_and_says_when_it_was_read():
    from core.replies import plan_reply

    engine = CountedEngine("vllm", replies=[FakeReply(["a"])])
    state = fake_state(engine)
    first = await plan_reply(state, settings("vllm"), [], "hi")
    second = await plan_reply(state, settings("vllm"), [], "hi")
    assert first.engine_at_start is None  # nothing waited for it before the request could leave
    assert (await first.engine_state()).running_requests == 1 and (await second.engine_state()).running_requests == 1
    assert engine.readings == 1
    assert first.engine_summary().startswith("1 running (read 0.0") and "the request)" in first.engine_summary()
