"""Every benchmark goal ends in a verdict that can fail: bench/verdict.py on known inputs."""

from __future__ import annotations

import io

import pytest

from bench.verdict import Goal, all_of, at_least, at_most, exit_status, missed, within_ratio


def run(goals):
    out, err = io.StringIO(), io.StringIO()
    return exit_status(goals, out=out, err=err), out.getvalue(), err.getvalue()


def test_goals_met_exit_0_and_say_so():
    status, out, err = run([at_most("TTFT bias (median)", 3.2, 15, unit="ms"),
                            at_least("decode ratio", 1.03, 0.95, digits=2),
                            within_ratio("tokens/s ours / vLLM's", 1.011, 0.05),
                            all_of("exact token counts", 64, 64)])
    assert status == 0 and err == ""
    assert "TTFT bias (median): 3.2 ms, goal <= 15.0 ms: met" in out
    assert "decode ratio: 1.03, goal >= 0.95: met" in out
    assert "tokens/s ours / vLLM's: 1.011, goal 0.950..1.050: met" in out
    assert "exact token counts: 64, goal all 64: met" in out
    assert "All 4 goals met." in out


@pytest.mark.parametrize("goal", [
    at_most("TTFT bias (median)", 24.0, 15, unit="ms"),  # the old per-request client
    at_least("decode ratio", 0.91, 0.95),
    within_ratio("tokens/s ours / vLLM's", 1.06, 0.05),
    within_ratio("tokens/s ours / vLLM's", 0.94, 0.05),
    all_of("exact token counts", 63, 64),
])
def test_one_missed_goal_exits_1_and_names_it_on_stderr(goal):
    status, out, err = run([at_most("fine", 1.0, 2.0), goal])
    assert status == 1
    assert f"MISSED: {goal.describe()}" in err
    assert goal.name in err and "fine" not in err
    assert "All" not in out


def test_a_figure_that_could_not_be_measured_is_a_miss_with_the_reason():
    goal = at_least("output tokens/s", None, 1.0, why_unmeasured="every request failed")
    assert not goal.met
    status, _, err = run([goal])
    assert status == 1 and "output tokens/s: every request failed, goal >= 1.0: MISSED" in err


def test_nothing_to_count_is_not_a_vacuous_pass():
    assert not all_of("exact token counts", 0, 0).met


def test_no_goal_at_all_is_a_miss():
    status, _, err = run([])
    assert status == 1 and "nothing was measured" in err


def test_bounds_are_inclusive_and_a_goal_needs_one():
    assert at_most("x", 15.0, 15.0).met and at_least("x", 0.95, 0.95).met
    assert missed([at_most("a", 1, 2), at_most("b", 3, 2)])[0].name == "b"
    with pytest.raises(ValueError):
        Goal("no bound", 1.0)


# ---------------------------------------------------------------- python -m bench's own verdict

from datetime import datetime, timezone  # noqa: E402

from bench.__main__ import benchmark_goals  # noqa: E402
from core.load.article import BenchmarkRun, EngineResult, RunSettings  # noqa: E402
from core.load.stats import Distribution, LevelSummary  # noqa: E402


def _summary(concurrency: int, completed: int, failed: int) -> LevelSummary:
    none = Distribution.of([])
    return LevelSummary(backend="vllm", label="vLLM", model="m", concurrency=concurrency, completed=completed,
                        failed=failed, duration=1.0, total_input_tokens=0, total_output_tokens=10 * completed,
                        mean_input_tokens=None, request_throughput=0.0, output_throughput=0.0,
                        total_token_throughput=0.0, mean_output_tokens_per_s_per_request=None, ttft_ms=none,
                        tpot_ms=none, itl_ms=none, e2el_ms=none, errors=())


def _run(engines=(), skipped=None) -> BenchmarkRun:
    return BenchmarkRun(RunSettings(), list(engines), dict(skipped or {}), "cpu", datetime.now(timezone.utc))


def _engine(*summaries: LevelSummary) -> EngineResult:
    return EngineResult("vllm", "vLLM", "m", None, None, summaries=list(summaries))


def test_bench_passes_when_every_measured_request_completed_even_with_an_unnamed_backend_down():
    run = _run([_engine(_summary(1, 16, 0), _summary(8, 16, 0))], skipped={"tgi": "not reachable"})
    assert exit_status(benchmark_goals(run), out=io.StringIO(), err=io.StringIO()) == 0


def test_bench_fails_when_every_backend_was_skipped_and_says_why():
    err = io.StringIO()
    run = _run(skipped={"vllm": "not reachable", "tgi": "not reachable"})
    assert exit_status(benchmark_goals(run), out=io.StringIO(), err=err) == 1
    assert "engines measured: none (vllm: not reachable; tgi: not reachable)" in err.getvalue()


def test_bench_fails_when_every_request_failed_or_some_did():
    err = io.StringIO()
    run = _run([_engine(_summary(1, 0, 16), _summary(8, 15, 1))])
    assert exit_status(benchmark_goals(run), out=io.StringIO(), err=err) == 1
    assert "vLLM at 1 concurrent: requests completed: 0, goal all 16: MISSED" in err.getvalue()
    assert "vLLM at 8 concurrent: requests completed: 15, goal all 16: MISSED" in err.getvalue()


def test_bench_fails_when_a_backend_named_on_the_command_line_was_skipped():
    run = _run([_engine(_summary(1, 16, 0))], skipped={"tgi": "not reachable"})
    err = io.StringIO()
    assert exit_status(benchmark_goals(run, required=["vllm", "tgi"]), out=io.StringIO(), err=err) == 1
    assert "tgi measured: skipped (not reachable)" in err.getvalue()
