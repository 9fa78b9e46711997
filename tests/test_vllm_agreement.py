"""The verdict of experiments/vllm_agreement.py (the script itself needs vLLM for minutes): it can fail."""

from __future__ import annotations

import pytest

from experiments.vllm_agreement import agreement_failures


def test_all_checks_met_is_no_failure():
    assert agreement_failures(1.04, counts_equal=64, completed=64, sent=64) == []
    assert agreement_failures(0.96, counts_equal=64, completed=64, sent=64) == []


@pytest.mark.parametrize("ratio", [1.06, 0.94])
def test_throughput_outside_the_goal_fails_and_says_by_how_much(ratio):
    (failure,) = agreement_failures(ratio, counts_equal=64, completed=64, sent=64)
    assert f"{ratio:.3f}" in failure and "outside the 5% goal" in failure


def test_a_token_count_that_differs_fails():
    (failure,) = agreement_failures(1.0, counts_equal=63, completed=64, sent=64)
    assert failure == "token counts: 1 of 64 requests differ from vLLM's usage"


def test_failed_requests_and_a_missing_figure_fail():
    failures = agreement_failures(None, counts_equal=60, completed=60, sent=64)
    assert failures == ["4 of 64 requests failed", "output tokens/s: no figure from one side to compare"]


def test_our_total_output_tokens_must_equal_vllm_bench_serves_own_count():
    assert agreement_failures(1.0, counts_equal=64, completed=64, sent=64,
                              output_tokens=[(1904, 1904), (1904, 1904)]) == []
    (failure,) = agreement_failures(1.0, counts_equal=64, completed=64, sent=64,
                                    output_tokens=[(1904, 1904), (1903, 1904)])
    assert failure == "output tokens, run 2: ours 1903, vllm bench serve 1904"
    (failure,) = agreement_failures(1.0, counts_equal=64, completed=64, sent=64, output_tokens=[(1904, None)])
    assert failure == "output tokens, run 1: ours 1904, vllm bench serve None"
