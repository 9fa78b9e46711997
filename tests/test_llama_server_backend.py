"""The llama.cpp server kind (backends/llama_server.py): on recorded answers, then against a real
`llama-server` serving the bundled GGUF (the session fixture `llama_server`)."""

from __future__ import annotations

import asyncio
import csv
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from backends.base import ChatMessage, GenerationParams
from backends.errors import BackendUnavailable, InputRejected
from backends.llama_server import KIND, LlamaServerBackend, engine_snapshot_of, sampling_fields
from backends.registry import Registry, backend_configs
from config import REPO, BackendConfig
from core.engines import engine_rows
from core.load.engine_memory import measure_memory
from core.replies import plan_reply
from core.rounds import Column, RoundRun, assign_labels, run_order_for, RoundSettings
from core.settings import SessionSettings
from core.streaming import measure
from core.timing import TimedStream
from tests.fakes import fake_state
from servers.app import backend_env
from tests.controls import reaches_the_cap
from tests.fixtures_app import closed_loopback_url

RECORDINGS = Path(__file__).resolve().parent / "recordings"
STORY = [ChatMessage("user", "Write a long story about a cat.")]
SHORT = GenerationParams(temperature=0.7, top_p=0.95, max_new_tokens=32)


def backend_on(base_url: str, **fields) -> LlamaServerBackend:
    return LlamaServerBackend(BackendConfig(name="llama_server", kind=KIND.name, label="llama.cpp server",
                                            base_url=base_url, **fields))


def sse_chunks(recording: str) -> list[dict]:
    lines = (RECORDINGS / recording).read_text(encoding="utf-8").splitlines()
    return [json.loads(line[len("data: "):]) for line in lines if line.startswith("data: {")]


# ---------------------------------------------------------------- without a server


def test_the_kind_is_configured_by_its_name_and_aliases_with_its_own_port_and_label():
    configs = {c.name: c for c in backend_configs({"BACKENDS": "llamacpp_server,llama-server,box",
                                                   "BOX_KIND": "llama_server"})}
    assert {c.kind for c in configs.values()} == {"llamacpp_server"}
    assert configs["llamacpp_server"].base_url == "http://127.0.0.1:8081/v1"
    assert configs["llama-server"].label == "llama.cpp server" and configs["box"].label == "box"
    assert isinstance(Registry.from_env({"BACKENDS": "llama_server"}).get("llama_server").inner, LlamaServerBackend)


def test_every_sampling_setting_is_sent_explicitly_neutral_where_the_panel_left_it_empty():
    backend = backend_on("http://127.0.0.1:9/v1")
    shape = backend.shape(GenerationParams(temperature=0.7, top_p=0.9, max_new_tokens=64))
    assert shape.sent == {"temperature": 0.7, "top_p": 0.9, "top_k": 0, "min_p": 0.0, "typical_p": 1.0,
                          "repeat_penalty": 1.0, "frequency_penalty": 0.0, "presence_penalty": 0.0, "max_tokens": 64}
    # Not the OpenAI API's fields travel as extra body fields, timings_per_token for exact running counts.
    assert shape.extra_body == {"top_k": 0, "min_p": 0.0, "typical_p": 1.0, "repeat_penalty": 1.0,
                                "timings_per_token": True}
    assert shape.stream_options == {"include_usage": True} and shape.ignored == ()
    assert any("not llama-server's defaults (top-k 40, min-p 0.05)" in note for note in shape.notes)
    chosen = sampling_fields(GenerationParams(temperature=0.0, top_k=7, min_p=0.1, repetition_penalty=1.3, seed=42))
    # llama-server's name is repeat_penalty: vLLM's repetition_penalty would be ignored there.
    assert (chosen["top_k"], chosen["min_p"], chosen["repeat_penalty"], chosen["seed"]) == (7, 0.1, 1.3, 42)
    assert "repetition_penalty" not in chosen
    assert any("greedy" in note for note in backend.shape(GenerationParams(temperature=0.0)).notes)


@pytest.mark.parametrize("recording", ["llama-server-b11312-timings-per-token.sse",
                                       "llama-server-b11312-include-usage.sse",
                                       "llama-server-b11312-chinese-multi-token.sse"])
def test_recorded_streams_give_exact_counts_and_the_servers_timings(recording):
    backend = backend_on("http://127.0.0.1:9/v1")
    so_far, counted, figures = None, 0, None
    for data in sse_chunks(recording):
        chunk, so_far = backend.parse(data, so_far)
        if chunk is None:
            continue
        counted += chunk.token_count or 0
        figures = chunk.server_figures or figures
    usage = sse_chunks(recording)[-1]["usage"]["completion_tokens"]
    assert figures.output_tokens == usage and figures.source == "llama.cpp server usage + llama.cpp server timings"
    assert figures.time_per_output_token_s > 0 and figures.prompt_s > 0
    if "timings-per-token" in recording:
        assert counted == usage  # every chunk's count exact, from the running timings.predicted_n


def test_the_end_of_generation_token_its_usage_counts_is_held_by_the_closing_chunk():
    """Measured: a reply that ends with "stop" after 4 text chunks has usage 5 (the end token)."""
    chunks = sse_chunks("llama-server-b11312-timings-per-token.sse")
    chunks[-2]["choices"][0]["finish_reason"] = "stop"
    chunks[-1]["usage"]["completion_tokens"] = 5
    backend = backend_on("http://127.0.0.1:9/v1")
    so_far, counts = None, []
    for data in chunks:
        chunk, so_far = backend.parse(data, so_far)
        counts.append(chunk.token_count)
    assert counts == [0, 1, 1, 1, 1, 0, 1] and so_far == 5


def test_engine_panel_rows_from_the_recorded_metrics_and_slots():
    metrics = (RECORDINGS / "llama-server-b11312-metrics-busy.txt").read_text()
    slots = [json.loads((RECORDINGS / "llama-server-b11312-slots-busy.json").read_text())]
    slots += [{"id": n, "n_ctx": 2048, "is_processing": False} for n in range(3)]
    snapshot = engine_snapshot_of(metrics, slots, taken_at_s=10.0)
    assert snapshot.source == KIND.metrics_source  # what the kind declares is what the panel names
    assert (snapshot.running_requests, snapshot.waiting_requests, snapshot.prompt_tokens_total) == (1, 0, 64)
    rows = {row["key"]: row["value"] for row in engine_rows(snapshot, None)}
    assert rows == {"running": "1", "waiting": "0", "tokens_predicted": "340", "decode_calls": "344",
                    "ms_per_token": "41.6 ms", "slots": "1 busy / 3 idle"}
    idle = engine_snapshot_of((RECORDINGS / "llama-server-b11312-metrics-idle.txt").read_text(), None, 9.0)
    assert idle.running_requests == 0 and "slots" not in {f.key for f in idle.more}
    assert engine_snapshot_of(None, None, 1.0).is_empty


async def test_a_server_that_is_down_says_how_to_start_one():
    backend = backend_on(closed_loopback_url() + "/v1", connect_timeout_s=2.0)
    try:
        with pytest.raises(BackendUnavailable) as raised:
            await backend.health()
    finally:
        await backend.aclose()
    assert "not reachable" in str(raised.value) and "bash scripts/llama_server.sh" in str(raised.value)
    assert "LLAMA_SERVER_BASE_URL" in str(raised.value)


# ---------------------------------------------------------------- a real llama-server


def _get(server, path: str):
    response = httpx.get(f"{server.url}{path}", timeout=10)
    response.raise_for_status()
    return response.json() if path != "/metrics" else response.text


def _metric(server, name: str) -> float:
    return float(re.search(rf"^{re.escape(name)} (\S+)$", _get(server, "/metrics"), re.M).group(1))


async def _idle(server, timeout_s: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        busy = [slot for slot in _get(server, "/slots") if slot["is_processing"]]
        if not busy and _metric(server, "llamacpp:requests_processing") == 0:
            return True
        await asyncio.sleep(0.05)
    return False


@pytest.fixture
async def backend(llama_server):
    made = backend_on(llama_server.base_url)
    assert await _idle(llama_server)
    yield made
    await made.aclose()


@pytest.mark.llama_server
async def test_info_reads_the_context_from_props_and_counts_the_prompt_as_the_server_will(backend, llama_server):
    info = await backend.info()
    assert info.model_id == "smollm2-135m-instruct" and info.context_length == 2048
    assert info.server_version.startswith("llama.cpp server b11312") and info.details["slots"] == "4"
    counted = await backend.count_prompt_tokens(STORY)
    _, record = await measure(backend, STORY, GenerationParams(max_new_tokens=4))
    assert counted == record.server.input_tokens


@pytest.mark.llama_server
async def test_exact_counts_equal_its_usage_and_its_own_counter_and_its_timings_agree_with_ours(backend, llama_server):
    before = _metric(llama_server, "llamacpp:tokens_predicted_total")
    text, record = await measure(backend, STORY, GenerationParams(temperature=0.7, max_new_tokens=96))
    await _idle(llama_server)
    after = _metric(llama_server, "llamacpp:tokens_predicted_total")
    assert text.strip() and record.tokens_exact and record.count_disagreement is None
    assert record.output_tokens == record.server.output_tokens == after - before
    assert record.token_source == "per-chunk token counts from the backend"
    # Its own decode time per token beside ours: ours adds only the stream's delivery.
    ours_ms, theirs_ms = record.ms_per_output_token, record.server.time_per_output_token_s * 1000
    print(f"llama-server: {record.output_tokens} tokens, TTFT {record.first_token_s * 1000:.0f} ms "
          f"(its prompt {record.server.prompt_s * 1000:.0f} ms), decode {ours_ms:.1f} ms/token "
          f"vs its {theirs_ms:.1f} ms/token")
    assert 0.5 < ours_ms / theirs_ms < 2.0, (ours_ms, theirs_ms)
    assert record.first_token_s >= record.server.prompt_s


@pytest.mark.llama_server
async def test_the_settings_sent_are_the_ones_its_slot_uses(backend, llama_server):
    for params, expected in [
        (GenerationParams(temperature=0.7, top_p=0.9, max_new_tokens=300, seed=42),
         {"top_k": 0, "min_p": 0.0, "repeat_penalty": 1.0, "seed": 42, "n_predict": 300}),
        (GenerationParams(temperature=0.5, max_new_tokens=300, top_k=7, min_p=0.1, repetition_penalty=1.3),
         {"top_k": 7, "min_p": 0.1, "repeat_penalty": 1.3, "n_predict": 300}),
    ]:
        request = await backend.prepare(STORY, params)
        stream = backend.stream(request)
        try:
            async for chunk in stream:
                if chunk.text:
                    (slot,) = [slot for slot in _get(llama_server, "/slots") if slot["is_processing"]]
                    break
        finally:
            await stream.aclose()
        used = {name: slot["params"][name] for name in expected}
        assert used == pytest.approx(expected), used
        assert slot["params"]["temperature"] == pytest.approx(params.temperature)
        assert request.sent["repeat_penalty"] == expected["repeat_penalty"]
        assert await _idle(llama_server)


STOP_CAP = 200  # the control run writes all of them: keep it short on a busy machine


@pytest.mark.llama_server
async def test_stop_frees_its_slot_and_the_snapshot_shows_it_busy_then_idle(backend, llama_server):
    """The control run shows this story, greedy, left alone, runs to STOP_CAP tokens. The server is
    then held (SIGSTOP: frozen mid-reply, so it cannot finish first however fast it is) while Stop
    closes the stream; let go (SIGCONT), it ends the request at its next write: its slot is idle and
    it decoded far fewer than the cap."""
    params = GenerationParams(temperature=0.0, max_new_tokens=STOP_CAP)
    await reaches_the_cap(backend, STORY, params)
    decodes_before = _metric(llama_server, "llamacpp:n_decode_total")
    request = await backend.prepare(STORY, params)
    timed = TimedStream(backend.stream(request), backend=backend.label, model=request.model)
    texts = 0
    async for chunk in timed:
        texts += bool(chunk.text)
        if texts == 5:
            break
    busy = await backend.engine_snapshot()
    pid = llama_server.process.process.pid
    os.kill(pid, signal.SIGSTOP)  # hold the engine mid-reply
    try:
        await timed.aclose()  # the user's Stop
    finally:
        os.kill(pid, signal.SIGCONT)
    stopped_at = time.monotonic()
    record = timed.finish("stopped")
    assert busy.running_requests == 1
    assert {figure.key: figure.pattern.format(figure.value) for figure in busy.more}["slots"] == "1 busy / 3 idle"
    assert await _idle(llama_server, timeout_s=5.0), "the slot was still busy 5 s after Stop"
    print(f"llama-server: slot idle {time.monotonic() - stopped_at:.2f} s after Stop")
    assert record.tokens_exact and record.output_tokens >= 5
    # One decode for the prompt, one per generated token: Stop ended it well before the cap.
    decoded = _metric(llama_server, "llamacpp:n_decode_total") - decodes_before
    assert record.output_tokens <= decoded < STOP_CAP, (record.output_tokens, decoded)
    idle = await backend.engine_snapshot()
    assert idle.running_requests == 0


@pytest.mark.llama_server
async def test_a_prompt_longer_than_the_context_is_rejected_naming_the_context(backend):
    with pytest.raises(InputRejected) as raised:
        await measure(backend, [ChatMessage("user", "word " * 3000)], SHORT)
    assert "exceeds the available context size (2048 tokens)" in str(raised.value)
    assert "Shorten the conversation" in str(raised.value)


@pytest.mark.llama_server
async def test_it_joins_a_compare_round_and_its_memory_is_found_by_its_port(backend, llama_server):
    other = backend_on(llama_server.base_url)
    other.name, other.label = "llama_server_2", "llama.cpp server, second name"
    state = fake_state(backend, other)
    settings = SessionSettings.initial(state.defaults, state.presets, state.registry.names)
    columns = []
    for label, name in assign_labels(("llama_server", "llama_server_2"), blind=False):
        plan = await plan_reply(state, settings.for_backend(name), [], "Say hello in one short sentence.")
        columns.append(Column(label=label, backend=name, backend_label=state.registry.get(name).label, plan=plan))
    order = run_order_for(RoundSettings(("llama_server", "llama_server_2")), [backend, other])
    assert order == "sequential"  # both on this machine

    async def render() -> None:
        pass

    await RoundRun(columns, order, render, tick_s=0.05).run()
    for column in columns:
        assert column.state == "completed" and column.text.strip(), (column.state, column.error)
        assert column.record.tokens_exact and column.record.output_tokens == column.record.server.output_tokens
    memory = measure_memory(backend)
    assert memory.cpu_rss_mib > 50 and "port" in memory.cpu_note
    await other.aclose()


@pytest.mark.llama_server
@pytest.mark.slow
def test_python_m_bench_measures_it_as_its_own_column(llama_server, tmp_path):
    env = {"BACKENDS": "llama_cpp,llama_server", **backend_env("llama_server", kind="llamacpp_server",
                                                                base_url=llama_server.base_url)}
    result = subprocess.run([sys.executable, "-m", "bench", "--concurrency", "1", "--requests", "2",
                             "--max-new-tokens", "16", "--warmup", "0", "--output", str(tmp_path)],
                            cwd=REPO, env={**os.environ, **env}, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "| | llama.cpp (embedded) | llama.cpp server |" in result.stdout
    summary = json.loads((tmp_path / "summary.json").read_text())
    (server,) = [engine for engine in summary["engines"] if engine["backend"] == "llama_server"]
    assert server["levels"][0]["completed"] == 2 and server["levels"][0]["failed"] == 0
    assert "port" in server["memory"]["cpu_note"] and server["memory"]["cpu_rss_mib"] > 50
    rows = [row for row in csv.DictReader(open(tmp_path / "requests.csv", encoding="utf-8"))
            if row["backend"] == "llama_server"]
    assert len(rows) == 2 and all(row["tokens_exact"] == "True" for row in rows)
