"""The verdict of experiments/vllm_agreement.py on known inputs (the script itself needs vLLM for minutes):
every goal can fail, and each miss names the mode and the figure."""

from __future__ import annotations

import numpy as np
import pytest

from experiments.vllm_agreement import FIGURES, Mode, agreement_goal, arrival_gap_ms, mode_goals, vllm_arrival_times


def run(**overrides) -> dict:
    """One run's figures under vLLM's names (8 concurrent, 32 requests, as measured on CPU vLLM)."""
    return {"completed": 32, "counts_equal_usage": 32, "total_output_tokens": 1904, "duration": 24.0,
            "output_throughput": 80.0, "mean_ttft_ms": 600.0, "p90_ttft_ms": 900.0, "mean_tpot_ms": 90.0,
            "p90_tpot_ms": 100.0, "request_goodput": 0.5} | overrides


def missed_names(goals) -> list[str]:
    return [goal.name for goal in goals if not goal.met]


def test_equal_runs_meet_every_goal():
    goals = mode_goals("8 concurrent", [run(), run()], [run(), run()], sent_per_run=32)
    assert missed_names(goals) == []
    # completed x2, counts, totals, then one goal per figure
    assert len(goals) == 4 + len(FIGURES)


@pytest.mark.parametrize("key", ["output_throughput", "mean_tpot_ms", "p90_tpot_ms"])
@pytest.mark.parametrize("factor, met", [(1.049, True), (0.951, True), (1.06, False), (0.94, False)])
def test_each_figure_must_be_within_5_percent(key, factor, met):
    ours = [run(**{key: run()[key] * factor})] * 2
    goals = mode_goals("8 concurrent", ours, [run(), run()], sent_per_run=32)
    assert missed_names(goals) == ([] if met else [f"8 concurrent: {key}, ours / vllm bench serve"])


def test_the_mean_of_the_runs_is_compared():
    # 1.10 and 0.98 average to 1.04 of vLLM's mean: met; vLLM's own runs are averaged too.
    ours = [run(output_throughput=88.0), run(output_throughput=78.4)]
    assert missed_names(mode_goals("8 concurrent", ours, [run(), run()], sent_per_run=32)) == []
    theirs = [run(output_throughput=70.0), run(output_throughput=70.0)]
    assert missed_names(mode_goals("8 concurrent", ours, theirs, sent_per_run=32)) == [
        "8 concurrent: output_throughput, ours / vllm bench serve"]


def test_ttft_passes_within_5_percent_or_10_ms_whichever_is_larger():
    # At 600 ms, 5 % (30 ms) is the allowance: +29 ms passes, +31 ms (the old client's +61) fails.
    assert agreement_goal("8", "mean_ttft_ms", 629.0, 600.0, floor=10.0, unit="ms").met
    goal = agreement_goal("8", "mean_ttft_ms", 631.0, 600.0, floor=10.0, unit="ms")
    assert not goal.met and "600.0 +- 30.0 ms" in goal.describe()
    # At 140 ms, 5 % is 7 ms: the 10 ms floor applies, on both sides.
    assert agreement_goal("1", "mean_ttft_ms", 149.5, 140.0, floor=10.0, unit="ms").met
    assert agreement_goal("1", "mean_ttft_ms", 130.5, 140.0, floor=10.0, unit="ms").met
    assert not agreement_goal("1", "mean_ttft_ms", 150.5, 140.0, floor=10.0, unit="ms").met


def test_ttft_goals_at_one_concurrent_use_the_floor_and_name_the_figure():
    ours = [run(mean_ttft_ms=148.0, p90_ttft_ms=165.0)] * 2
    theirs = [run(mean_ttft_ms=140.0, p90_ttft_ms=150.0)] * 2
    goals = mode_goals("1 concurrent", ours, theirs, sent_per_run=32)
    assert missed_names(goals) == ["1 concurrent: p90_ttft_ms, ours vs vllm bench serve"]
    (p90,) = [goal for goal in goals if not goal.met]
    assert p90.describe() == ("1 concurrent: p90_ttft_ms, ours vs vllm bench serve: 165.0 ms, "
                              "goal 150.0 +- 10.0 ms (5% or 10 ms): MISSED")


def test_goodput_passes_within_one_request_over_the_duration():
    # 0.5 req/s over 24 s is 12 good requests; one request is 1/24 = 0.042 req/s, more than 5 % (0.025).
    assert missed_names(mode_goals("8", [run(request_goodput=0.5 + 1 / 24)] * 2, [run()] * 2,
                                   sent_per_run=32)) == []
    assert missed_names(mode_goals("8", [run(request_goodput=0.5 + 2 / 24)] * 2, [run()] * 2,
                                   sent_per_run=32)) == ["8: request_goodput, ours vs vllm bench serve"]


def test_no_good_request_on_either_side_agrees_but_one_side_with_two_does_not():
    # An SLO out of the hardware's reach (vLLM's tpot:50 on CPU): both tools count 0 good requests.
    goals = mode_goals("16", [run(request_goodput=0.0)] * 2, [run(request_goodput=0.0)] * 2, sent_per_run=32)
    assert missed_names(goals) == []
    goals = mode_goals("16", [run(request_goodput=2 / 24)] * 2, [run(request_goodput=0.0)] * 2, sent_per_run=32)
    assert missed_names(goals) == ["16: request_goodput, ours vs vllm bench serve"]


def test_a_missing_figure_is_a_miss_that_says_so():
    goals = mode_goals("8", [run(p90_tpot_ms=None)] * 2, [run()] * 2, sent_per_run=32)
    (goal,) = [goal for goal in goals if not goal.met]
    assert goal.name == "8: p90_tpot_ms, ours / vllm bench serve" and "no figure to compare" in goal.describe()


def test_failed_requests_and_token_counts_are_goals_too():
    goals = mode_goals("8", [run(completed=31, counts_equal_usage=30), run()], [run(), run(completed=30)],
                       sent_per_run=32)
    assert missed_names(goals) == ["8: our requests completed", "8: vllm bench serve's requests completed",
                                   "8: token counts equal to vLLM's usage"]


def test_each_pair_of_runs_must_produce_the_same_output_tokens():
    goals = mode_goals("8", [run(), run(total_output_tokens=1903)], [run(), run()], sent_per_run=32)
    (goal,) = [goal for goal in goals if not goal.met]
    assert goal.describe() == "8: runs whose total output tokens equal vllm bench serve's: 1, goal all 2: MISSED"


def test_vllm_arrival_times_are_vllms_own_draws():
    # vLLM: np.random.seed(seed), one np.random.gamma per request, cumulative, last one scaled to count / rate.
    np.random.seed(7)
    delays = np.cumsum([np.random.gamma(shape=1.0, scale=1.0 / 0.5) for _ in range(16)])
    expected = delays * (16 / 0.5) / delays[-1]
    assert vllm_arrival_times(0.5, 1.0, 16, seed=7) == pytest.approx(tuple(expected))
    times = vllm_arrival_times(1.0, 1.0, 16, seed=0)
    assert times[0] > 0 and times[-1] == pytest.approx(16.0) and list(times) == sorted(times)


def test_send_times_are_compared_from_the_first_send():
    arrivals = (0.5, 1.0, 3.0)
    assert arrival_gap_ms({"start_times": [100.5, 101.0, 103.002]}, arrivals) == pytest.approx(2.0)
    assert arrival_gap_ms({"start_times": [100.5, 101.0]}, arrivals) is None
    assert arrival_gap_ms({}, arrivals) is None


def test_a_mode_is_a_concurrency_or_a_rate():
    assert Mode(concurrency=8).vllm_args(0) == ["--max-concurrency", "8"]
    assert Mode(rate=0.5).vllm_args(3) == ["--request-rate", "0.5", "--burstiness", "1", "--seed", "3"]
    assert Mode(rate=1.0).label == "1 req/s" and Mode(concurrency=16).label == "16 concurrent"
    assert Mode(rate=0.5).slug == "rate-0.5" and "/" not in Mode(rate=1.0).slug
    with pytest.raises(ValueError):
        Mode(concurrency=8, rate=1.0)
    with pytest.raises(ValueError):
        Mode()
