"""Two sessions streaming at once, each on its own backend with its own settings and system prompt.

The product's first promise: what one person chooses in the settings panel is
what their engine receives, whatever another person does at the same moment.
Two socket.io tabs (the protocol the browser speaks) on one app:

- session A: the real vLLM server, temperature 0, a preset system prompt
  chosen in the panel, a small cap;
- session B: the embedded llama.cpp model, a typed custom system prompt and
  other sampling values (temperature, top-p, top-k, min-p, repetition
  penalty, seed, cap).

Both replies are held mid-stream (vLLM by its own pause, the embedded model by
its test-only hold file) until both have text on screen, so they overlap on
any machine. Then each engine's OWN request log is read - vLLM's logged request
bodies, the embedded model's test-only request log (LAB_TEST_EMBEDDED_REQUEST_LOG)
- and must hold exactly its session's messages (system prompt first) and
sampling values, and nothing of the other session; each reply's token count
must equal its own engine's count of tokens generated.

The second test does the same with a blind round (vLLM and the TGI-protocol
test server, whose own request log is read) in session A and a chat on the
embedded model in session B; a blind round shows no figures before its vote,
so its columns' figures are read where the app stored them.
"""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path

import pytest

from backends.base import ChatMessage, GenerationParams
from core.settings import load_presets
from load.chainlit_client import ChainlitClient
from servers.app import AppServer, run_coroutine as run
from tests.controls import config_reaches_the_cap
from tests.fixtures_app import stored_when
from tests.fixtures_vllm import VLLMTestServer, held_vllm
from tests.test_vllm_backend import engine_state
from config import BackendConfig

pytestmark = [pytest.mark.slow, pytest.mark.vllm]

PRESET = "long-answer"  # chosen in session A's panel
CUSTOM_SYSTEM_PROMPT = "You are a ship's cook. Whatever you are asked, talk about soup."  # typed in session B
A_SETTINGS = dict(backend="vllm", temperature=0, top_p=1.0, max_new_tokens=24, system_preset=PRESET)
B_SETTINGS = dict(backend="llama_cpp", temperature=0.7, top_p=0.8, max_new_tokens=40, top_k="30", min_p="0.1",
                  repetition_penalty="1.2", seed="4242", system_preset="none", system_custom=CUSTOM_SYSTEM_PROMPT)
HOLD_AFTER_TOKENS = 4  # the embedded model holds each generation after this many tokens
REPLY_TIMEOUT_S = 240.0


@pytest.fixture(scope="module")
def hold_file(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("hold") / "hold"


@pytest.fixture(scope="module")
def embedded_log(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("embedded-log") / "requests.jsonl"


@pytest.fixture(scope="module")
def two_engines_app(app_factory, vllm_server: VLLMTestServer, tgi_server, hold_file, embedded_log,
                    tmp_path_factory) -> AppServer:
    env = {"BACKENDS": "vllm,llama_cpp,tgi", "DEFAULT_BACKEND": "vllm", "VLLM_BASE_URL": vllm_server.base_url,
           "TGI_BASE_URL": tgi_server.url, "DEFAULT_SYSTEM_PROMPT": "none", "DEFAULT_TEMPERATURE": "0.5",
           "DEFAULT_MAX_NEW_TOKENS": "64",
           "LAB_TEST_EMBEDDED_HOLD_FILE": str(hold_file),
           "LAB_TEST_EMBEDDED_HOLD_AFTER_TOKENS": str(HOLD_AFTER_TOKENS),
           "LAB_TEST_EMBEDDED_REQUEST_LOG": str(embedded_log),
           "DATABASE_URL": f"sqlite:///{tmp_path_factory.mktemp('sessions') / 'lab.db'}"}
    return app_factory(env, name="chainlit-two-sessions")


def embedded_requests(log: Path) -> list[dict]:
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


def embedded_generated(app: AppServer) -> int:
    """Tokens the app's one embedded model generated since it started (GET /lab/state)."""
    with urllib.request.urlopen(f"{app.url}/lab/state", timeout=10) as response:
        (model,) = json.loads(response.read())["embedded_models"].values()
    return model["generated_tokens_total"]


def about(requests: list[dict], prompt: str) -> list[dict]:
    """The requests whose last message is `prompt`."""
    return [r for r in requests if r["messages"] and r["messages"][-1]["content"] == prompt]


def mentions(requests: list[dict], text: str) -> bool:
    return any(text in json.dumps(r) for r in requests)


def expected_b_sampling() -> dict:
    """What session B's panel values become for `Llama.generate` (backends/llamacpp.py)."""
    return {"temp": 0.7, "top_p": 0.8, "top_k": 30, "min_p": 0.1, "typical_p": 1.0, "repeat_penalty": 1.2,
            "frequency_penalty": 0.0, "presence_penalty": 0.0}


def open_session(app: AppServer, **settings) -> ChainlitClient:
    client = ChainlitClient(app.url)
    client.open_chat(timeout_s=120)
    client.change_settings(timeout_s=30, **settings)
    return client


def check_embedded_request(embedded_log: Path, seen_before: int, prompt_b: str, *others: str) -> None:
    """The embedded model's own log: exactly session B's request, with B's messages and sampling."""
    mine = embedded_requests(embedded_log)[seen_before:]
    assert [r["messages"] for r in mine] == [[{"role": "system", "content": CUSTOM_SYSTEM_PROMPT},
                                              {"role": "user", "content": prompt_b}]], mine
    (request,) = mine
    assert request["sampling"] == expected_b_sampling()
    assert request["max_tokens"] == 40 and request["seed"] == 4242
    for other in others:
        assert not mentions(mine, other), f"session A's {other!r} reached the embedded model"


def test_two_sessions_at_once_each_reach_their_own_engine_with_their_own_settings(
        two_engines_app: AppServer, vllm_server: VLLMTestServer, hold_file: Path, embedded_log: Path):
    app = two_engines_app
    presets = load_presets()
    prompt_a = "Write a very long story about a dragon and a knight."
    prompt_b = "Tell me about the weather at sea, in detail."
    root = vllm_server.base_url.removesuffix("/v1")
    # Control: session A's request, greedy, left alone, is ended by its cap (so its count is exactly 24).
    run(config_reaches_the_cap(BackendConfig(name="vllm", kind="vllm", label="vLLM", base_url=vllm_server.base_url),
                               [ChatMessage("system", presets[PRESET]), ChatMessage("user", prompt_a)],
                               GenerationParams(temperature=0.0, top_p=1.0, max_new_tokens=24)))

    a = open_session(app, **A_SETTINGS)
    b = open_session(app, **B_SETTINGS)
    try:
        vllm_seen, embedded_seen = len(vllm_server.chat_requests()), len(embedded_requests(embedded_log))
        vllm_before = engine_state(root).generation_tokens_total
        embedded_before = embedded_generated(app)
        hold_file.touch()
        try:
            with held_vllm(root) as step_until:
                reply_a, reply_b = a.send(prompt_a), b.send(prompt_b)
                # Both replies have text on screen and neither has ended: they stream at the same time.
                step_until(lambda: reply_a.first_token_at_s is not None and reply_b.first_token_at_s is not None,
                           timeout_s=REPLY_TIMEOUT_S)
                assert not reply_a.done and not reply_b.done
                assert engine_state(root).running_requests == 1
        finally:
            hold_file.unlink(missing_ok=True)
        a.wait_reply(REPLY_TIMEOUT_S)
        b.wait_reply(REPLY_TIMEOUT_S)
    finally:
        a.close()
        b.close()
    assert reply_a.ok and reply_b.ok, (reply_a.as_dict(), reply_b.as_dict())

    # vLLM's own log: exactly session A's request, A's system prompt first, A's sampling, none of B's.
    vllm_requests = vllm_server.chat_requests()[vllm_seen:]
    assert [r["messages"] for r in vllm_requests] == [[{"role": "system", "content": presets[PRESET]},
                                                       {"role": "user", "content": prompt_a}]], vllm_requests
    (sent_a,) = vllm_requests
    assert (sent_a["temperature"], sent_a["top_p"], sent_a["max_tokens"]) == (0.0, 1.0, 24)
    assert not {"top_k", "min_p", "repetition_penalty", "seed"} & set(sent_a), sent_a
    assert not mentions(vllm_requests, CUSTOM_SYSTEM_PROMPT) and not mentions(vllm_requests, prompt_b)
    check_embedded_request(embedded_log, embedded_seen, prompt_b, presets[PRESET], prompt_a)

    # Each reply's figures are its own engine's count (A's is the cap: the control run showed it).
    assert reply_a.output_tokens == engine_state(root).generation_tokens_total - vllm_before == 24
    assert reply_b.output_tokens == embedded_generated(app) - embedded_before
    assert 1 <= reply_b.output_tokens <= 40


def test_a_blind_round_and_a_chat_at_once_each_reach_their_own_engines(
        two_engines_app: AppServer, vllm_server: VLLMTestServer, tgi_server, hold_file: Path, embedded_log: Path):
    app = two_engines_app
    presets = load_presets()
    prompt_a = "Write a very long story about a castle and a cat."
    prompt_b = "Tell me about the harbour in winter, in detail."
    root = vllm_server.base_url.removesuffix("/v1")

    a = open_session(app, mode="blind", compare_backends=["vllm", "tgi"], **A_SETTINGS)
    b = open_session(app, **B_SETTINGS)
    try:
        vllm_seen, embedded_seen = len(vllm_server.chat_requests()), len(embedded_requests(embedded_log))
        tgi_seen = len(run(tgi_server.requests()))
        tgi_generations_seen = len(run(tgi_server.generations()))
        vllm_before = engine_state(root).generation_tokens_total
        embedded_before = embedded_generated(app)
        hold_file.touch()
        run(tgi_server.set_faults(hold_after_tokens=HOLD_AFTER_TOKENS))
        try:
            with held_vllm(root) as step_until:
                round_a, reply_b = a.send(prompt_a), b.send(prompt_b)
                run(tgi_server.wait_until_held(timeout_s=REPLY_TIMEOUT_S))
                # The round's two requests run on their engines while session B's reply is on screen.
                step_until(lambda: engine_state(root).running_requests == 1 and reply_b.first_token_at_s is not None,
                           timeout_s=REPLY_TIMEOUT_S)
                assert not round_a.done and not reply_b.done
                (held,) = run(tgi_server.generations())[tgi_generations_seen:]
                assert held["status"] == "running" and held["held"], held
        finally:
            hold_file.unlink(missing_ok=True)
            run(tgi_server.release_holds())
        a.wait_reply(REPLY_TIMEOUT_S)
        b.wait_reply(REPLY_TIMEOUT_S)
    finally:
        a.close()
        b.close()
    assert round_a.done and round_a.outcome != "timeout" and not round_a.error, round_a.as_dict()
    assert reply_b.ok, reply_b.as_dict()

    expected_a = [{"role": "system", "content": presets[PRESET]}, {"role": "user", "content": prompt_a}]
    vllm_requests = vllm_server.chat_requests()[vllm_seen:]
    assert [r["messages"] for r in vllm_requests] == [expected_a], vllm_requests
    assert (vllm_requests[0]["temperature"], vllm_requests[0]["max_tokens"]) == (0.0, 24)
    tgi_requests = [r["body"] for r in run(tgi_server.requests())[tgi_seen:] if r["path"] == "/v1/chat/completions"]
    assert [r["messages"] for r in tgi_requests] == [expected_a], tgi_requests
    assert (tgi_requests[0]["temperature"], tgi_requests[0]["max_tokens"]) == (0.0, 24)
    for other in (CUSTOM_SYSTEM_PROMPT, prompt_b):
        assert not mentions(vllm_requests, other) and not mentions(tgi_requests, other)
    check_embedded_request(embedded_log, embedded_seen, prompt_b, presets[PRESET], prompt_a)

    # Figures: the chat reply's is the embedded model's count; the round's columns (hidden until
    # the vote) were stored by the app, each equal to its own engine's count.
    assert reply_b.output_tokens == embedded_generated(app) - embedded_before
    replies = stored_when(app.env["DATABASE_URL"], "replies", 100,
                          until=lambda rows: sum(r.prompt in (prompt_a, prompt_b) for r in rows) == 3)
    columns = {r.backend: r for r in replies if r.prompt == prompt_a}
    assert set(columns) == {"vllm", "tgi"} and {r.mode for r in columns.values()} == {"blind"}
    assert columns["vllm"].output_tokens == engine_state(root).generation_tokens_total - vllm_before
    (tgi_generation,) = run(tgi_server.generations())[tgi_generations_seen:]
    assert columns["tgi"].output_tokens == tgi_generation["generated_tokens"]
    assert tgi_generation["max_new_tokens"] == 24
    (chat_row,) = [r for r in replies if r.prompt == prompt_b]
    assert chat_row.backend == "llama_cpp" and chat_row.output_tokens == reply_b.output_tokens
