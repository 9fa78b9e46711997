"""Capacity sweeps: saturation rules, the plain answer and its numbers on known inputs, the CLI's files and
verdict, and a sweep against a real HTTP engine whose capacity is known (the paced server with 2 slots)."""

from __future__ import annotations

import csv
import json
import os
import re
import subprocess
import sys
from dataclasses import replace

import pytest

from bench.sweep import parse_args, settings_from, sweep_goals
from bench.verdict import exit_status
from config import REPO
from core.load.runner import LevelResult, RequestOutcome
from core.load.slo import Slo
from core.load.sweep import (EngineSample, EngineSweep, LevelFigures, SweepRun, SweepSettings, capacity,
                             level_figures, queue_rising)
from core.load.sweep_report import plain_answer, slo_phrase
from servers.app import backend_env
from servers.paced_openai import start_paced_server
from tests.test_bench_stats import record

SLO = Slo(ttft_ms=500, tpot_ms=50)


def _outcomes(ttfts_s: list[float], gap_s: float = 0.04, tokens: int = 11, spacing_s: float = 1.0):
    outcomes = []
    for index, ttft in enumerate(ttfts_s):
        r = replace(record(ttft, gap_s, tokens), started_at_unix_s=1.8e9 + index * spacing_s)
        outcomes.append(RequestOutcome(index, f"en:{index}", r, input_tokens=10))
    return tuple(outcomes)


def _level(mode: str, level: float, ttfts_s: list[float], *, duration_s: float = 8.0, samples=(),
           arrivals=None, previous=None, gap_s: float = 0.04, spacing_s: float = 1.0, reports_queue=True):
    result = LevelResult("e", "Engine", "m", int(level) if mode == "concurrency" else 64,
                         _outcomes(ttfts_s, gap_s, spacing_s=spacing_s), duration_s)
    return level_figures(mode, level, result, list(samples), SLO, arrivals, previous, reports_queue)


def _sample(at_s: float, waiting: int, kv: float | None = None, preemptions: float | None = None) -> EngineSample:
    return EngineSample(at_s, 2, waiting, kv, preemptions, client_waiting=waiting, in_flight=2 + waiting)


def test_a_level_counts_replies_meeting_the_slo_and_vllms_goodput():
    figures = _level("concurrency", 4, [0.2, 0.3, 0.6, 0.45], duration_s=4.0)
    assert figures.good_requests == 3 and figures.slo_share == pytest.approx(0.75)
    assert figures.request_goodput == pytest.approx(3 / 4.0)
    assert figures.output_goodput == pytest.approx(33 / 4.0)
    assert not figures.meets_slo  # 75% < 90%
    assert figures.median_tokens_per_s_per_user == pytest.approx(25.0)  # 40 ms between tokens


def test_a_rate_level_that_falls_behind_is_saturated_and_one_that_keeps_up_is_not():
    arrivals = [float(i) for i in range(8)]  # 1 request/s offered
    keeping_up = _level("rate", 1.0, [0.2] * 8, arrivals=arrivals, spacing_s=1.0)
    assert keeping_up.offered_rate == pytest.approx(1.0) and keeping_up.achieved_rate == pytest.approx(1.0)
    assert keeping_up.saturation is None
    behind = _level("rate", 1.0, [0.2] * 8, arrivals=arrivals, spacing_s=1.1)  # completions 1.1 s apart
    assert behind.achieved_rate == pytest.approx(1 / 1.1)
    assert "achieved 0.91 of 1.00 requests/s offered (0.91 < 0.98)" == behind.saturation


def test_a_concurrency_level_without_more_tokens_per_second_is_saturated():
    two = _level("concurrency", 2, [0.2] * 8, duration_s=4.0)
    four_flat = _level("concurrency", 4, [0.2] * 8, duration_s=4.0 / 1.04, previous=two)  # twice the people, +4%
    assert four_flat.saturation.startswith("tokens/s stopped rising: 22.9 at 4 vs 22.0 at 2 (+4%)")
    four_more = _level("concurrency", 4, [0.2] * 8, duration_s=4.0 / 1.06, previous=two)  # +6%
    assert four_more.saturation is None
    three_flat = _level("concurrency", 3, [0.2] * 8, duration_s=4.0 / 1.02, previous=two)  # +50% people, +2%
    assert three_flat.saturation is not None


def test_ttft_and_queue_both_rising_through_a_level_is_saturation_either_alone_is_not():
    rising_ttft = [0.2, 0.2, 0.3, 0.3, 0.9, 1.0, 1.2, 1.4]
    growing = [_sample(t, w) for t, w in ((0, 0), (0.5, 1), (1, 1), (1.5, 3), (2, 4), (2.5, 6))]
    flat = [_sample(t, 2) for t in (0, 0.5, 1, 1.5, 2, 2.5)]
    assert queue_rising(growing, True) and not queue_rising(flat, True)
    assert _level("concurrency", 8, rising_ttft, samples=growing).saturation == \
        "TTFT and the queue were both still rising through the level"
    assert _level("concurrency", 8, rising_ttft, samples=flat).saturation is None
    assert _level("concurrency", 8, [0.3] * 8, samples=growing).saturation is None


def _engine(levels: list[LevelFigures], *, in_process=False, reports_queue=True) -> EngineSweep:
    return EngineSweep("vllm", "vLLM", "m", None, None, in_process, reports_queue, levels=levels)


def test_capacity_is_the_highest_level_meeting_the_slo_from_below_and_the_knee_of_tokens_per_s():
    one = _level("concurrency", 1, [0.1] * 8, duration_s=8.0)
    two = _level("concurrency", 2, [0.2] * 8, duration_s=4.0, previous=one)
    four = _level("concurrency", 4, [0.3] * 8, duration_s=2.0, previous=two)
    eight = _level("concurrency", 8, [0.6, 0.7] * 4, duration_s=2.0, previous=four,
                   samples=[_sample(0, 3, kv=0.4)])  # TTFT misses; tokens/s flat: saturated
    answer = capacity("concurrency", _engine([one, two, four, eight]))
    assert (answer.holds_up_to, answer.first_miss, answer.saturates_near) == (4, 8, 4)
    assert answer.limit == "queue"  # the engine's waiting queue was not empty at saturation
    full = replace(eight, max_kv_cache_usage=0.95)
    assert capacity("concurrency", _engine([one, two, four, full])).limit == "kv_cache"
    compute = replace(eight, max_waiting=0)
    assert capacity("concurrency", _engine([one, two, four, compute])).limit == "compute"
    assert capacity("concurrency", _engine([one, two, four, eight], in_process=True)).limit == "one_at_a_time"
    unsaturated = capacity("concurrency", _engine([one, two, four]))
    assert (unsaturated.saturates_near, unsaturated.limit, unsaturated.highest_tried) == (None, None, 4)
    # A miss below a pass does not count: capacity is from the lowest level up.
    missed_low = replace(one, slo_share=0.5)
    assert capacity("concurrency", _engine([missed_low, two])).holds_up_to is None


def test_the_plain_answer_in_english_and_chinese():
    one = _level("concurrency", 1, [0.1] * 8, duration_s=8.0)
    two = _level("concurrency", 2, [0.2] * 8, duration_s=4.0, previous=one)
    flat = _level("concurrency", 4, [0.6] * 8, duration_s=4.0, previous=two, samples=[_sample(0, 2)])
    answer = capacity("concurrency", _engine([one, two, flat]))
    hardware = "Some CPU, 2 cores, 24 GiB RAM; no GPU (NVML not available)"
    assert plain_answer("vLLM", "concurrency", answer, SLO, hardware) == (
        "vLLM: up to 2 people at once keep TTFT under 500 ms and at least 20 tokens/s each for 90% of replies; "
        "it saturates near 2; the limit is the queue (requests wait for a place in the batch).")
    assert plain_answer("vLLM", "concurrency", answer, SLO, hardware, "zh") == (
        "vLLM：最多 2 人同时使用时，90% 的回复能做到首字时间低于 500 ms、每人每秒至少 20 个 token；约 2 人时饱和；"
        "瓶颈是排队（请求等待进入批次）。")
    none = capacity("concurrency", _engine([replace(one, slo_share=0.0)]))
    assert plain_answer("llama.cpp", "concurrency", none, SLO, hardware).startswith(
        "llama.cpp: even at 1 person at once, fewer than 90% of replies keep TTFT under 500 ms")
    assert slo_phrase(Slo(e2el_ms=3000), "en") == "whole replies within 3 s"


def test_a_rate_answer_says_requests_per_second_and_people_by_littles_law():
    arrivals = [i * 0.5 for i in range(8)]
    two = _level("rate", 2.0, [0.2] * 8, arrivals=arrivals, spacing_s=0.5)
    answer = capacity("rate", _engine([two]))
    people = 2.0 * 0.6  # 2 requests/s x 0.6 s per reply
    assert answer.people_at_rate == pytest.approx(people)
    assert plain_answer("vLLM", "rate", answer, SLO, "x; no GPU").startswith(
        "vLLM: up to 2 requests/s (about 1.2 people at once) keep TTFT under 500 ms")


def test_arguments_follow_vllm_and_bad_ones_are_refused(capsys):
    args = parse_args(["--rates", "0.5,1,2", "--burstiness", "0.5", "--goodput", "ttft:400", "tpot:40"])
    settings = settings_from(args)
    assert (settings.mode, settings.levels, settings.burstiness) == ("rate", (0.5, 1.0, 2.0), 0.5)
    assert settings.slo == Slo(ttft_ms=400, tpot_ms=40)
    default = settings_from(parse_args([]))
    assert default.mode == "concurrency" and default.levels == (1, 2, 4, 8, 16) and default.slo == SLO
    for bad, said in ((["--concurrency", "4,2"], "increasing order"), (["--rates", "fast"], "numbers"),
                      (["--burstiness", "2"], "give --rates too"), (["--concurrency", "1", "--rates", "1"], "not allowed"),
                      (["--requests", "0"], "outside")):
        with pytest.raises(SystemExit):
            parse_args(bad)
        assert said in capsys.readouterr().err
    result = subprocess.run([sys.executable, "-m", "bench", "sweep", "--slo", "latency=3"], cwd=REPO,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 2 and "ttft_ms=500" in result.stderr


def test_the_verdict_misses_an_engine_not_swept_a_failing_lowest_level_and_a_capacity_short_of_the_goal():
    one = _level("concurrency", 1, [0.1] * 8, duration_s=8.0)
    settings = SweepSettings("concurrency", (1.0, 2.0), SLO)
    run = SweepRun(settings, [_engine([one])], {"tgi": "not reachable"}, "x", None)
    assert exit_status(sweep_goals(run, ["vllm"])) == 0
    assert exit_status(sweep_goals(run, ["vllm", "tgi"])) == 1
    assert exit_status(sweep_goals(run, ["vllm"], expect_capacity=2)) == 1
    failing = replace(one, summary=replace(one.summary, failed=2))
    assert exit_status(sweep_goals(SweepRun(settings, [_engine([failing])], {}, "x", None))) == 1
    assert exit_status(sweep_goals(SweepRun(settings, [], {}, "x", None))) == 1


@pytest.mark.slow
def test_a_sweep_finds_the_known_capacity_of_a_real_engine_with_two_slots(tmp_path):
    """The paced server generates at most 2 replies at once (20 tokens/s each, 20 tokens: 1 s a reply); the
    rest wait before their first token, and its /metrics says so under vLLM's names. So 1 and 2 people get
    their first token at once, and from 4 people on most requests wait a whole reply (1 s) for it. The
    objective (TTFT under 500 ms, 200 ms a token) sits half a reply away from both, so the capacity (2) is
    fixed by the construction, not by how fast this machine is; how close the throughput ratios come on
    fast replies is experiments/sweep_known_capacity.py's verdict."""
    paced = start_paced_server(rate_tokens_per_s=20, tokens=20, name="paced-sweep")
    try:
        paced.set_faults(slots=2)
        env = {"BACKENDS": "paced", **backend_env("paced", kind="openai", base_url=paced.base_url, label="Paced")}
        result = subprocess.run(
            [sys.executable, "-m", "bench", "sweep", "--concurrency", "1,2,4,8", "--requests", "8",
             "--max-new-tokens", "20", "--warmup", "0", "--slo", "ttft_ms=500,tpot_ms=200",
             "--expect-capacity", "2", "--output", str(tmp_path)],
            cwd=REPO, env={**os.environ, **env}, capture_output=True, text=True, timeout=300)
    finally:
        paced.stop()
    assert sorted(path.name for path in tmp_path.iterdir()) == [
        "capacity.md", "latency.html", "latency.png", "pareto.html", "pareto.png", "plotly.min.js", "requests.csv",
        "summary.json", "sweep.csv"]
    rows = list(csv.DictReader(open(tmp_path / "sweep.csv", encoding="utf-8")))
    # It stops at the first saturated level: 4 (twice the people, no more tokens/s), or 8 where 4 still
    # gained from keeping both slots busy between a person's requests (a real effect of closed loops).
    assert [row["level"] for row in rows] in (["1.0", "2.0", "4.0"], ["1.0", "2.0", "4.0", "8.0"])
    one, two, last = rows[0], rows[1], rows[-1]
    assert last["saturation"].startswith("tokens/s stopped rising")
    assert all(row["saturation"] == "" for row in rows[:-1])
    # 4 people, 8 requests, 2 slots: the first 2 start at once and the others wait for a slot, most of
    # them a whole reply. One person whose requests left a little after the first two (a busy machine
    # starts the four apart) can find a slot freed within the objective: 3 of 8 met in a CI run, never
    # the 90 % a level needs to count as held.
    assert float(one["slo_share"]) == 1.0 and float(two["slo_share"]) == 1.0
    assert 0.25 <= float(rows[2]["slo_share"]) <= 0.5
    # The engine's own gauges, sampled: one reply at a time for 1 person, never more than its 2 slots.
    assert int(one["max_running"]) == 1 and int(last["max_waiting"]) >= 1 and int(last["max_running"]) == 2
    summary = json.loads((tmp_path / "summary.json").read_text())
    engine = summary["engines"][0]
    assert engine["capacity"]["holds_up_to"] == 2 and engine["capacity"]["saturates_near"] == float(rows[-2]["level"])
    assert engine["capacity"]["limit"] == "queue"
    assert {"request_goodput", "output_throughput", "p90_ttft_ms", "max_concurrency"} <= set(engine["levels"][0])
    answer = re.search(r"Paced: up to 2 people at once keep TTFT under 500 ms and at least 5 tokens/s each for 90% "
                       r"of replies; it saturates near [24]; the limit is the queue[^\n]*", result.stdout)
    assert answer, result.stdout[-2000:]
    markdown = (tmp_path / "capacity.md").read_text()
    assert answer.group(0) in markdown and "Paced：最多 2 人同时使用时" in markdown
    assert "Load: concurrency 1, 2, 4, 8" in markdown and "All 3 goals met." in result.stdout


def test_the_conditions_say_which_level_ran_out_of_time_and_what_was_swept():
    from datetime import datetime, timezone

    from core.load.sweep_report import conditions

    one = replace(_level("concurrency", 1, [0.1] * 8, duration_s=8.0), not_sent=3)
    settings = SweepSettings("concurrency", (1.0, 2.0), SLO, requests=11, max_seconds=90)
    run = SweepRun(settings, [_engine([one])], {"tgi": "not reachable"}, "a CPU; no GPU",
                   datetime(2026, 12, 4, tzinfo=timezone.utc))
    text = "\n".join(conditions(run))
    assert "- vLLM at 1: 3 of 11 requests not sent (the level's 90 s were up); its figures are over the 8 sent." in text
    assert "Load: concurrency 1, 2 (people at once, closed loop); 11 requests per level" in text
    assert "Not measured: tgi: not reachable" in text and "ttft:500, tpot:50" in text


@pytest.mark.slow
def test_ctrl_c_keeps_the_levels_measured_and_writes_every_file(tmp_path):
    import signal
    import time

    from tests.test_bench_cli import _ctrl_c_as_in_a_terminal

    paced = start_paced_server(rate_tokens_per_s=20, tokens=60, name="paced-sweep-interrupt")
    try:
        env = {"BACKENDS": "paced", **backend_env("paced", kind="openai", base_url=paced.base_url, label="Paced")}
        process = subprocess.Popen([sys.executable, "-m", "bench", "sweep", "--concurrency", "1,2", "--requests", "2",
                                    "--max-new-tokens", "60", "--warmup", "0", "--output", str(tmp_path)],
                                   cwd=REPO, env={**os.environ, **env}, stdout=subprocess.PIPE,
                                   stderr=subprocess.PIPE, text=True, preexec_fn=_ctrl_c_as_in_a_terminal)
        deadline = time.monotonic() + 60
        while len(paced.requests()) < 3:  # level 1 done (2 requests), level 2 running
            assert time.monotonic() < deadline and process.poll() is None, "the sweep did not start"
            time.sleep(0.2)
        process.send_signal(signal.SIGINT)
        stdout, stderr = process.communicate(timeout=60)
    finally:
        paced.stop()
    assert process.returncode == 130, stderr[-2000:]
    rows = list(csv.DictReader(open(tmp_path / "sweep.csv", encoding="utf-8")))
    assert [row["level"] for row in rows][0] == "1.0" and rows[0]["completed"] == "2"
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["interrupted"] and summary["engines"][0]["stopped"] == "interrupted"
    assert "Interrupted: the sweep was stopped" in (tmp_path / "capacity.md").read_text()
