"""The teacher's capacity sweep without Chainlit: its objective from the environment, its live state,
its plain answer and the row it stores, against a real HTTP engine of known capacity (2 slots)."""

from __future__ import annotations

import asyncio
from dataclasses import replace

import pytest

from backends.registry import Registry
from config import ConfigurationError
from core.capacity import TeacherSweep, app_sweep_settings, listed, slo_from_env
from core.load.prompt_sets import load_prompt_set
from core.load.slo import Slo
from servers.app import backend_env
from servers.paced_openai import start_paced_server


def test_the_objective_comes_from_the_environment_with_a_clear_error_for_a_bad_one():
    assert slo_from_env({}) == Slo(ttft_ms=500, tpot_ms=50, percentile=90)
    assert slo_from_env({"CAPACITY_SLO": "ttft:300 e2el:4000", "CAPACITY_PERCENTILE": "95"}) == \
        Slo(ttft_ms=300, e2el_ms=4000, percentile=95)
    with pytest.raises(ConfigurationError, match="CAPACITY_SLO"):
        slo_from_env({"CAPACITY_SLO": "fast"})
    with pytest.raises(ConfigurationError, match="CAPACITY_PERCENTILE"):
        slo_from_env({"CAPACITY_PERCENTILE": "most"})
    settings = app_sweep_settings({})
    assert settings.levels == (1, 2, 4, 8, 16) and settings.requests == 8 and settings.max_seconds == 60


@pytest.mark.slow
def test_a_teacher_sweep_shows_each_level_as_it_ends_and_stores_its_answer():
    """2 slots, 1 s a reply (20 tokens at 20/s): 1 and 2 people get their first token at once, and from
    4 people on most requests wait a whole reply for it. The objective (TTFT under 500 ms, 200 ms a
    token) sits half a reply from both, so the answer (2 people) is fixed by the construction."""
    paced = start_paced_server(rate_tokens_per_s=20, tokens=20, name="paced-teacher-sweep")
    try:
        paced.set_faults(slots=2)
        registry = Registry.from_env({"BACKENDS": "paced", **backend_env("paced", kind="openai",
                                                                         base_url=paced.base_url, label="Paced")})
        settings = replace(app_sweep_settings({"CAPACITY_SLO": "ttft_ms=500,tpot_ms=200"}), requests=6)
        sweep = TeacherSweep("paced", "Paced", settings, user="teacher")
        seen: list[dict] = []

        async def main():
            running = asyncio.create_task(sweep.execute(registry, load_prompt_set("en"), "a CPU; no GPU"))
            while not running.done():
                seen.append(sweep.props("en"))
                await asyncio.sleep(0.1)
            await registry.aclose()
            return running.result()

        run = asyncio.run(main())
    finally:
        paced.stop()
    assert run.engines and not sweep.problem and sweep.done
    # Live: the level running and the points so far, growing one level at a time.
    assert any(p["running"] and p["running"]["level"] == 2 and len(p["points"]) == 1 for p in seen)
    assert [len(p["points"]) for p in seen] == sorted(len(p["points"]) for p in seen)
    final = sweep.props("zh")
    # Stopped at the first saturated level: 4, or 8 where 4 still gained from keeping both slots busy.
    assert [point["users"] for point in final["points"]] in ([1, 2, 4], [1, 2, 4, 8])
    assert final["points"][-1]["saturation"].startswith("tokens/s stopped rising")
    assert final["running"] is None and final["done"]
    assert final["answer"].startswith("Paced：最多 2 人同时使用时，90% 的回复能做到首字时间低于 500 ms")
    row = sweep.stored()
    assert row.answer_en.startswith("Paced: up to 2 people at once keep TTFT under 500 ms and at least 5 tokens/s")
    assert row.answer_en.endswith("the limit is the queue (requests wait for a place in the batch).")
    assert row.settings["slo"] == {"ttft_ms": 500, "tpot_ms": 200, "e2el_ms": None, "percentile": 90}
    assert row.summary["engines"][0]["capacity"]["holds_up_to"] == 2 and row.user_identifier == "teacher"
    assert listed([row], "zh")[0]["answer"] == row.answer_zh


def test_a_sweep_on_a_backend_that_is_down_says_why_and_stores_nothing():
    registry = Registry.from_env({"BACKENDS": "down", **backend_env("down", kind="openai",
                                                                    base_url="http://127.0.0.1:9/v1", label="Down")})
    sweep = TeacherSweep("down", "Down", app_sweep_settings({}))

    async def main():
        try:
            return await sweep.execute(registry, load_prompt_set("en"), "x")
        finally:
            await registry.aclose()

    asyncio.run(main())
    assert sweep.done and "not reachable" in sweep.problem and sweep.stored() is None
    assert sweep.props("en")["problem"] == sweep.problem and sweep.answer("en") is None
