"""Arrival schedules (vLLM's --request-rate/--burstiness), the SLO and goodput, rate levels in the load engine."""

from __future__ import annotations

import asyncio
import math
import statistics
from dataclasses import replace

import numpy
import pytest

from backends.base import ChatMessage, GenerationParams
from core.load.arrivals import gamma_arrivals
from core.load.prompt_sets import BenchPrompt
from core.load.runner import run_level
from core.load.slo import Slo, SloError, meets, parse_slo, request_tpot_ms
from tests.fakes import FakeBackend, FakeReply
from tests.test_bench_stats import record


def test_poisson_arrivals_have_the_asked_mean_rate_and_the_spread_of_an_exponential():
    times = gamma_arrivals(4.0, 1.0, 4001, seed=1)
    gaps = numpy.diff(times)
    assert times[0] == 0.0 and len(times) == 4001
    assert numpy.mean(gaps) == pytest.approx(0.25, rel=0.05)
    assert numpy.std(gaps) / numpy.mean(gaps) == pytest.approx(1.0, rel=0.1)  # exponential: cv = 1


def test_burstiness_changes_the_spread_not_the_rate_and_the_seed_repeats_the_schedule():
    bursty = numpy.diff(gamma_arrivals(2.0, 0.25, 4001, seed=3))
    even = numpy.diff(gamma_arrivals(2.0, 4.0, 4001, seed=3))
    assert numpy.mean(bursty) == pytest.approx(0.5, rel=0.1) and numpy.mean(even) == pytest.approx(0.5, rel=0.05)
    assert numpy.std(bursty) / numpy.mean(bursty) == pytest.approx(2.0, rel=0.1)  # cv = 1/sqrt(shape)
    assert numpy.std(even) / numpy.mean(even) == pytest.approx(0.5, rel=0.1)
    assert gamma_arrivals(2.0, 1.0, 10, seed=7) == gamma_arrivals(2.0, 1.0, 10, seed=7)
    assert gamma_arrivals(2.0, 1.0, 10, seed=7) != gamma_arrivals(2.0, 1.0, 10, seed=8)
    assert gamma_arrivals(math.inf, 1.0, 3) == (0.0, 0.0, 0.0)
    for rate, burstiness in ((0, 1.0), (-1, 1.0), (1.0, 0)):
        with pytest.raises(ValueError):
            gamma_arrivals(rate, burstiness, 3)


def test_an_objective_reads_our_form_and_vllms_and_rejects_the_rest_clearly():
    assert parse_slo("ttft_ms=500,tpot_ms=50") == Slo(ttft_ms=500, tpot_ms=50)
    assert parse_slo("ttft:500 tpot:50 e2el:3000", percentile=95) == Slo(500, 50, 3000, 95)
    assert Slo(ttft_ms=500, tpot_ms=50).as_vllm_goodput() == ["ttft:500", "tpot:50"]
    assert Slo(tpot_ms=50).min_tokens_per_s == 20
    for bad, said in (("", "ttft_ms=500"), ("ttft_ms=fast", "milliseconds"), ("latency=3", "ttft_ms=500"),
                      ("ttft_ms=500,ttft_ms=400", "twice"), ("ttft_ms=0", "above 0")):
        with pytest.raises(SloError, match=said):
            parse_slo(bad)
    with pytest.raises(SloError, match="percentile"):
        parse_slo("ttft_ms=500", percentile=0)


def test_a_reply_meets_the_objective_as_vllms_goodput_counts_it():
    slo = Slo(ttft_ms=500, tpot_ms=50)
    fast = record(0.2, 0.04, 11)  # TTFT 200 ms, TPOT 40 ms
    assert meets(fast, slo) and request_tpot_ms(fast) == pytest.approx(40)
    assert not meets(record(0.6, 0.04, 11), slo)  # TTFT 600 ms
    assert not meets(record(0.2, 0.06, 11), slo)  # TPOT 60 ms
    assert meets(record(0.5, 0.05, 11), slo)  # at the bounds is good, as in vLLM (s >= r)
    one_token = record(0.2, 0.0, 1)
    assert request_tpot_ms(one_token) == 0.0 and meets(one_token, slo)  # vLLM: TPOT 0 for one token
    assert not meets(replace(fast, status="failed"), slo) and not meets(None, slo)
    assert meets(fast, Slo(e2el_ms=601)) and not meets(fast, Slo(e2el_ms=599))  # E2EL = 0.2 + 10 * 0.04


def _prompts() -> list[BenchPrompt]:
    return [BenchPrompt(messages=(ChatMessage("user", f"question {i}"),), category=None, output_tokens=None, source=f"en:{i}") for i in range(3)]


def test_a_rate_level_sends_each_request_at_its_arrival_time():
    backend = FakeBackend("fake", replies=[FakeReply(["a", "b"], interval_s=0.01) for _ in range(4)])
    arrivals = (0.0, 0.1, 0.25, 0.4)

    async def main():
        loop = asyncio.get_running_loop()
        begun = loop.time()
        level = await run_level(backend, _prompts(), concurrency=8, requests=4,
                                params=GenerationParams(max_new_tokens=4), arrival_times_s=arrivals)
        return level, [t - begun for t in backend.started_at]

    level, sent = asyncio.run(main())
    assert [o.ok for o in level.outcomes] == [True] * 4 and not level.cut_short
    # Never before its arrival time (the behaviour); how late is only a safety bound.
    for expected, actual in zip(arrivals, sent):
        assert expected - 0.005 <= actual < expected + 0.5, (arrivals, sent)
    # The clock starts at each send: from the level's start, the mean would be the arrivals' (0.19 s) and more.
    assert statistics.fmean(r.record.first_token_s for r in level.outcomes) < statistics.fmean(arrivals) / 2


def test_a_level_that_runs_out_of_time_sends_no_more_and_says_so():
    backend = FakeBackend("fake", replies=[FakeReply(["a"], interval_s=0.01) for _ in range(5)])
    level = asyncio.run(run_level(backend, _prompts(), concurrency=8, requests=5,
                                  params=GenerationParams(max_new_tokens=4),
                                  arrival_times_s=(0.0, 0.05, 0.1, 5.0, 6.0), send_for_s=0.5))
    assert len(level.outcomes) == 3 and level.not_sent == 2 and level.cut_short
    assert level.duration_s < 1.0
