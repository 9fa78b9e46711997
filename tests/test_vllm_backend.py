"""The vLLM backend against a real vLLM server (fixture `vllm_base_url`).

Replies are kept short: this CPU decodes the 135M model at roughly 10-30 tokens/s.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import time
import urllib.request

import pytest

from backends.base import ChatMessage, GenerationParams, StreamChunk
from backends.engine_metrics import EngineSnapshot, parse_vllm_metrics
from backends.errors import BackendUnavailable, InputRejected
from backends.openai_compat import OpenAICompatBackend, server_root
from scripts.vllm_launch import BUNDLED_MODEL_NAME
from config import BackendConfig
from tests.fixtures_app import closed_loopback_port
from tests.fixtures_vllm import held_vllm
from tests.controls import reaches_the_cap
from tests.streams import prepared_stream
from core.timing import RequestRecord, TimedStream

# A prompt this model answers at length, so `max_new_tokens` is what ends the reply.
COUNTING_PROMPT = [ChatMessage("user", "Count from 1 to 100, separated by commas.")]
GREEDY = dict(temperature=0.0, top_p=1.0, seed=7)
LONG_STORY = [ChatMessage("user", "Write a very long story about a dragon and a knight.")]
ABORT_CAP = 300


def vllm_backend(base_url: str, **overrides) -> OpenAICompatBackend:
    config = BackendConfig(name="vllm", kind="vllm", label="vLLM", base_url=base_url, **overrides)
    return OpenAICompatBackend(config)


@pytest.fixture
async def vllm(vllm_base_url):
    backend = vllm_backend(vllm_base_url)
    yield backend
    await backend.aclose()


async def timed_reply(
    backend: OpenAICompatBackend, messages, params: GenerationParams
) -> tuple[list[StreamChunk], RequestRecord]:
    """Stream a whole reply through the app's measurement; return its chunks and record."""
    chunks: list[StreamChunk] = []
    request = await backend.prepare(messages, params)
    timed = TimedStream(backend.stream(request), backend=backend.name, model=request.model)
    try:
        async for chunk in timed:
            chunks.append(chunk)
    finally:
        await timed.aclose()
    return chunks, timed.finish("completed")


def metric_value(root_url: str, name: str, **labels: str) -> float:
    """Sum of the Prometheus samples of `name` on vLLM's /metrics that carry `labels`."""
    with urllib.request.urlopen(f"{root_url}/metrics", timeout=5) as response:
        text = response.read().decode()
    total = 0.0
    for line in text.splitlines():
        match = re.match(rf"^{re.escape(name)}(\{{[^}}]*\}})? (\S+)$", line)
        if match and all(f'{key}="{value}"' in (match.group(1) or "") for key, value in labels.items()):
            total += float(match.group(2))
    return total


def engine_state(root_url: str) -> EngineSnapshot:
    """vLLM's /metrics now, read the way the app reads it (prometheus_client's parser)."""
    with urllib.request.urlopen(f"{root_url}/metrics", timeout=5) as response:
        return parse_vllm_metrics(response.read().decode(), time.monotonic())


@pytest.mark.vllm
async def test_streamed_reply_has_exact_token_counts(vllm):
    chunks, record = await timed_reply(vllm, COUNTING_PROMPT, GenerationParams(max_new_tokens=12, **GREEDY))

    # The final usage comes on the finish chunk (continuous usage) and again in the closing usage chunk.
    server_figures = [c.server_figures for c in chunks if c.server_figures]
    assert server_figures and all(f.source.startswith("vLLM usage") for f in server_figures)
    counted = sum(c.token_count for c in chunks)
    assert counted == server_figures[-1].output_tokens == record.server_output_tokens == 12
    assert all(c.token_count is not None for c in chunks)
    assert record.tokens_exact and record.count_disagreement is None
    assert record.output_tokens == 12 and record.finish_reason == "length"
    assert record.first_token_s is not None and 0 < record.first_token_s < record.total_s
    assert record.decode_tokens_per_s and record.decode_tokens_per_s > 0
    assert "".join(c.text for c in chunks).strip()


@pytest.mark.vllm
async def test_prompt_token_count_matches_what_the_server_charged(vllm):
    _, record = await timed_reply(vllm, COUNTING_PROMPT, GenerationParams(max_new_tokens=2, **GREEDY))
    assert await vllm.count_prompt_tokens(COUNTING_PROMPT) == record.server_input_tokens > 0


@pytest.mark.vllm
async def test_info_and_health(vllm):
    await vllm.health()
    info = await vllm.info()
    assert info.model_id == BUNDLED_MODEL_NAME
    assert info.context_length == 2048
    assert re.fullmatch(r"vLLM \d+\.\d+.*", info.server_version or "")


@pytest.mark.vllm
async def test_too_long_prompt_is_rejected_with_the_context_length(vllm):
    too_long = [ChatMessage("user", "hello " * 3000)]
    with pytest.raises(InputRejected) as raised:
        async for _ in prepared_stream(vllm, too_long, GenerationParams(max_new_tokens=4)):
            pass
    message = str(raised.value)
    assert "maximum context length is 2048 tokens" in message
    assert vllm.url in message


async def test_unreachable_server_names_its_url_and_how_to_start_it():
    url = f"http://127.0.0.1:{closed_loopback_port()}/v1"
    backend = vllm_backend(url, options={"model": BUNDLED_MODEL_NAME})
    try:
        with pytest.raises(BackendUnavailable) as raised:
            async for _ in prepared_stream(backend, COUNTING_PROMPT, GenerationParams(max_new_tokens=4)):
                pass
        with pytest.raises(BackendUnavailable):
            await backend.health()
    finally:
        await backend.aclose()
    assert url in str(raised.value)
    assert "scripts/vllm_server.sh" in str(raised.value) and "VLLM_BASE_URL" in str(raised.value)


async def read_while_held(step_until, reader: asyncio.Task, root: str) -> None:
    """Let the held vLLM server on, a step at a time, until `reader` is done and the request is
    still running on it (the step loop is blocking: it runs in a thread, the reader on the loop)."""
    await asyncio.to_thread(step_until, lambda: reader.done() and engine_state(root).running_requests == 1, 120)
    await reader


@pytest.mark.vllm
async def test_closing_the_stream_aborts_the_request_on_the_server(vllm):
    root = server_root(vllm.url)
    params = GenerationParams(max_new_tokens=ABORT_CAP, **GREEDY)
    await reaches_the_cap(vllm, LONG_STORY, params)  # left alone, this request ends at the cap
    generated_before = metric_value(root, "vllm:generation_tokens_total")
    stream = prepared_stream(vllm, LONG_STORY, params)
    texts = []

    async def read_three() -> None:
        async for chunk in stream:
            if chunk.text:
                texts.append(chunk.text)
            if len(texts) == 3:
                return

    # vLLM is held (its own pause) and let on a step at a time: the request is still running when
    # the stream closes, on any machine (a GPU could otherwise finish the whole reply first).
    with held_vllm(root) as step_until:
        await read_while_held(step_until, asyncio.create_task(read_three()), root)
        assert metric_value(root, "vllm:num_requests_running") == 1
        await stream.aclose()  # what the UI's Stop does

    closed_at = time.monotonic()
    while await asyncio.to_thread(metric_value, root, "vllm:num_requests_running") != 0:
        # Safety bound: the whole reply would take ~100 s here.
        assert time.monotonic() - closed_at < 15, "vLLM kept generating after the client closed"
        await asyncio.sleep(0.1)
    generated = await asyncio.to_thread(metric_value, root, "vllm:generation_tokens_total") - generated_before
    # The control run showed that a request that was not aborted ends at exactly the cap.
    assert 3 <= generated < ABORT_CAP


@pytest.mark.vllm
async def test_two_concurrent_streams_both_complete(vllm):
    prompts = [COUNTING_PROMPT, [ChatMessage("user", "List ten colours, one per line.")]]
    params = GenerationParams(max_new_tokens=10, **GREEDY)
    results = await asyncio.gather(*(timed_reply(vllm, p, params) for p in prompts))
    for chunks, record in results:
        assert record.tokens_exact and record.count_disagreement is None
        assert record.output_tokens == record.server_output_tokens <= 10
        assert "".join(c.text for c in chunks).strip()


@pytest.mark.vllm
async def test_stop_closes_the_connection_even_when_the_consumer_is_cancelled(vllm):
    """A cancelled task (the UI's Stop) must not leave the request running on the server. The
    control run shows the same request, left alone, writes to its cap; the server is held while
    the task is cancelled, so the request is running then on any machine."""
    root = server_root(vllm.url)
    params = GenerationParams(max_new_tokens=ABORT_CAP, **GREEDY)
    await reaches_the_cap(vllm, LONG_STORY, params)
    generated_before = (await asyncio.to_thread(engine_state, root)).generation_tokens_total
    first_chunk = asyncio.Event()

    async def consume() -> None:
        async with contextlib.aclosing(prepared_stream(vllm, LONG_STORY, params)) as stream:
            async for chunk in stream:
                if chunk.text:
                    first_chunk.set()

    with held_vllm(root) as step_until:
        task = asyncio.create_task(consume())
        await read_while_held(step_until, asyncio.create_task(first_chunk.wait()), root)
        # The request is running on the server (not finished, not queued) when it is cancelled.
        assert (await asyncio.to_thread(engine_state, root)).running_requests == 1
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if (await asyncio.to_thread(engine_state, root)).running_requests == 0:
            break
        await asyncio.sleep(0.1)
    after = await asyncio.to_thread(engine_state, root)
    assert after.running_requests == 0, "vLLM kept generating after the consumer was cancelled"
    # Left alone it would have written ABORT_CAP tokens (the control run); cancelled, fewer.
    assert 1 <= after.generation_tokens_total - generated_before < ABORT_CAP


@pytest.mark.vllm
async def test_the_servers_own_timings_ride_beside_ours(vllm):
    """vLLM started with --enable-per-request-metrics reports its own TTFT, queue and decode time."""
    _, record = await timed_reply(vllm, COUNTING_PROMPT, GenerationParams(max_new_tokens=16, **GREEDY))
    server = record.server
    assert "vLLM usage" in server.source and "vLLM per-request metrics" in server.source
    assert server.output_tokens == record.output_tokens == 16
    # The server's TTFT counts from scheduling, ours from sending: ours is the larger, by the
    # transport and the queue, and both are the same order of magnitude.
    assert 0 < server.first_token_s <= record.first_token_s
    assert server.queue_s is not None and server.queue_s >= 0
    assert server.decode_s == pytest.approx(record.last_chunk_s - record.first_token_s, rel=0.5, abs=0.05)
    assert server.time_per_output_token_s == pytest.approx(server.decode_s / 15, rel=0.01)


@pytest.mark.vllm
async def test_optional_sampling_settings_reach_vllm_and_a_seed_makes_replies_repeat(vllm, vllm_server):
    """Every sampling setting is in the request bodies vLLM itself logged (not only in what the
    client says it sent), and the seed makes the two sampled replies the same."""
    params = GenerationParams(temperature=1.0, top_p=0.9, max_new_tokens=12, top_k=20, min_p=0.05,
                              repetition_penalty=1.1, seed=1234)
    expected = {"temperature": 1.0, "top_p": 0.9, "max_tokens": 12, "top_k": 20, "min_p": 0.05,
                "repetition_penalty": 1.1, "seed": 1234}
    request = await vllm.prepare(COUNTING_PROMPT, params)
    assert request.ignored == ()
    assert request.sent == expected
    seen = len(vllm_server.chat_requests())
    first, _ = await timed_reply(vllm, COUNTING_PROMPT, params)
    second, _ = await timed_reply(vllm, COUNTING_PROMPT, params)
    received = vllm_server.chat_requests()[seen:]
    assert len(received) == 2, received
    for body in received:
        assert {key: body.get(key) for key in expected} == expected, body
        assert body["messages"] == [message.as_dict() for message in COUNTING_PROMPT]
    assert "".join(c.text for c in first) == "".join(c.text for c in second)
