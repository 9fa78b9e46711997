"""The real llama-server (built from llama-cpp-python's vendored llama.cpp) behaves as recorded.

These pin the facts a llama.cpp-server backend relies on (see the comment at the
top of scripts/llama_server_launch.py) against the binary itself.
"""

from __future__ import annotations

import http.client
import json
import re
import time
from urllib.parse import urlsplit

import pytest

from scripts.llama_server_launch import DEFAULT_CTX, LLAMA_SERVER_VERSION


MESSAGES = [{"role": "user", "content": "Write a long story about a cat."}]
METRICS = (
    "llamacpp:prompt_tokens_total", "llamacpp:prompt_seconds_total", "llamacpp:tokens_predicted_total",
    "llamacpp:tokens_predicted_seconds_total", "llamacpp:n_decode_total", "llamacpp:prompt_tokens_seconds",
    "llamacpp:predicted_tokens_seconds", "llamacpp:requests_processing", "llamacpp:requests_deferred",
)


def _connection(server) -> http.client.HTTPConnection:
    parts = urlsplit(server.url)
    return http.client.HTTPConnection(parts.hostname, parts.port, timeout=60)


def _get(server, path: str) -> tuple[int, str]:
    connection = _connection(server)
    try:
        connection.request("GET", path)
        response = connection.getresponse()
        return response.status, response.read().decode()
    finally:
        connection.close()


def _metric(text: str, name: str) -> float:
    return float(re.search(rf"^{re.escape(name)} (\S+)$", text, re.M).group(1))


def _open_stream(server, payload: dict):
    connection = _connection(server)
    connection.request("POST", "/v1/chat/completions", body=json.dumps({"stream": True, **payload}),
                       headers={"Content-Type": "application/json"})
    return connection, connection.getresponse()


def _events(response):
    """The JSON of each `data:` line until [DONE]."""
    while True:
        line = response.readline()
        if not line:
            return
        line = line.decode().rstrip("\n")
        if line.startswith("data: "):
            if line == "data: [DONE]":
                return
            yield json.loads(line[len("data: "):])


def test_health_props_models(llama_server):
    assert _get(llama_server, "/health") == (200, '{"status":"ok"}')
    props = json.loads(_get(llama_server, "/props")[1])
    assert props["default_generation_settings"]["n_ctx"] == DEFAULT_CTX
    assert props["build_info"] == LLAMA_SERVER_VERSION
    assert props["endpoint_metrics"] is True and props["endpoint_slots"] is True and props["ui"] is False
    models = json.loads(_get(llama_server, "/v1/models")[1])
    assert models["data"][0]["id"] == "smollm2-135m-instruct"
    assert models["data"][0]["meta"]["n_ctx"] == DEFAULT_CTX
    status, metrics = _get(llama_server, "/metrics")
    assert status == 200 and all(f"\n{name} " in metrics for name in METRICS)


def test_usage_and_timings_arrive_on_a_last_chunk_without_choices(llama_server):
    connection, response = _open_stream(llama_server, {
        "messages": MESSAGES, "max_tokens": 8, "stream_options": {"include_usage": True}})
    try:
        assert response.status == 200 and response.getheader("Content-Type") == "text/event-stream"
        chunks = list(_events(response))
    finally:
        connection.close()
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": None}
    finish, last = chunks[-2], chunks[-1]
    assert finish["choices"][0]["finish_reason"] == "length" and "usage" not in finish and "timings" not in finish
    assert last["choices"] == []
    assert last["usage"]["completion_tokens"] == 8
    assert {"prompt_n", "prompt_ms", "predicted_n", "predicted_ms", "predicted_per_token_ms",
            "predicted_per_second", "cache_n"} <= set(last["timings"])
    assert last["timings"]["predicted_n"] == 8
    assert last["system_fingerprint"] == LLAMA_SERVER_VERSION


def test_sampling_defaults_can_be_turned_off(llama_server):
    """top_k=0, min_p=0 and repeat_penalty=1 reach the slot; vLLM's `repetition_penalty` is ignored."""
    seen = []
    for payload in ({"top_k": 0, "min_p": 0, "repeat_penalty": 1.0, "seed": 42},
                    {"repetition_penalty": 1.3, "top_k": 7}):
        connection, response = _open_stream(llama_server, {
            "messages": MESSAGES, "max_tokens": 200, "ignore_eos": True, **payload})
        try:
            for chunk in _events(response):
                if chunk["choices"] and chunk["choices"][0]["delta"].get("content"):
                    busy = [slot for slot in json.loads(_get(llama_server, "/slots")[1]) if slot["is_processing"]]
                    seen.append(busy[0]["params"])
                    break
        finally:
            connection.close()
    assert (seen[0]["top_k"], seen[0]["min_p"], seen[0]["repeat_penalty"], seen[0]["seed"]) == (0, 0.0, 1.0, 42)
    assert (seen[1]["top_k"], seen[1]["repeat_penalty"]) == (7, 1.0)


def test_closing_the_stream_frees_the_slot(llama_server):
    connection, response = _open_stream(llama_server, {"messages": MESSAGES, "max_tokens": 1500, "ignore_eos": True})
    events = _events(response)
    for _ in range(5):
        next(events)
    assert _metric(_get(llama_server, "/metrics")[1], "llamacpp:requests_processing") == 1
    response.close()
    connection.close()
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        slots = json.loads(_get(llama_server, "/slots")[1])
        processing = _metric(_get(llama_server, "/metrics")[1], "llamacpp:requests_processing")
        if processing == 0 and not any(slot["is_processing"] for slot in slots):
            break
        time.sleep(0.05)
    else:
        pytest.fail("the slot was still busy 5 s after the client closed the stream")


def test_a_prompt_longer_than_the_context_is_a_400_before_any_event(llama_server):
    connection, response = _open_stream(llama_server, {
        "messages": [{"role": "user", "content": "word " * 3000}], "max_tokens": 5})
    try:
        assert response.status == 400
        assert response.getheader("Content-Type").startswith("application/json")
        error = json.loads(response.read())["error"]
    finally:
        connection.close()
    assert error["type"] == "exceed_context_size_error" and error["code"] == 400
    assert error["n_ctx"] == DEFAULT_CTX and error["n_prompt_tokens"] > DEFAULT_CTX
