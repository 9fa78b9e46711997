"""Stop, pressed in the browser, really ends the generation on every engine.

The partial reply staying on the page is covered in tests/test_browser.py
(against the paced server). Here the question is the engine's side: after the
user presses Chainlit's Stop button, is the engine still generating?

- the embedded llama.cpp model (in the app's process): its own counts from
  GET /lab/state - generating 1 before Stop, 0 shortly after, and the tokens
  it generated stop growing, below max new tokens;
- the real vLLM server: `vllm:num_requests_running` 1 before Stop and 0
  after, `vllm:generation_tokens_total` grown by fewer than the cap;
- the TGI-protocol test server, on the Messages API and on the native
  `/generate_stream` route: the generation was running and is recorded as
  cancelled.

Every reply is allowed MAX_NEW_TOKENS new tokens and asked for a very long
story, greedy. Each engine is held mid-reply while Stop is pressed (the
embedded model by its test-only hold file, the TGI server by its
hold_after_tokens fault, vLLM by its own pause), so the reply is still
generating when Stop arrives on any machine, however fast. Each test first proves, with a control run of the same request
straight to the engine, that without Stop this engine writes to the cap
(finish reason "length"): so a reply that ends below the cap was ended by Stop,
not by the model finishing on its own.
"""

from __future__ import annotations

import json
import time
import urllib.request
from pathlib import Path

import pytest
from playwright.sync_api import Page

from backends.base import ChatMessage, GenerationParams
from config import BackendConfig
from servers.app import AppServer, backend_env, run_coroutine
from tests.controls import config_reaches_the_cap
from tests.fixtures_vllm import held_vllm
from tests.test_browser import SNAPSHOT_JS, new_reply_id, number, send, switch_backend, watch_reply
from tests.test_engines_browser import open_chat
from tests.test_vllm_backend import engine_state

pytestmark = [pytest.mark.browser, pytest.mark.slow]

MAX_NEW_TOKENS = 512
LONG_PROMPT = "Write a very long story about a dragon and a knight."
# Stop is pressed a few words in; the engine runs on for the time the click takes to reach it
# (a second or two on a loaded machine; on a fast one that is many more tokens), so the bound is
# "ended before the cap", not a token count that a faster engine would pass. The control run
# (runs_to_the_cap) shows the cap is what would end the reply otherwise.
BELOW_THE_CAP = MAX_NEW_TOKENS
# The embedded model and the TGI server hold each reply after this many tokens; Stop ends it there.
HOLD_AFTER_TOKENS = 10
ENGINE_STOP_TIMEOUT_S = 10.0
TGI_BACKENDS = {"messages": ("tgi_chat", "TGI Messages API", "/v1/chat/completions"),
                "generate": ("tgi_native", "TGI native", "/generate_stream")}


def common_env() -> dict[str, str]:
    return {"DEFAULT_MAX_NEW_TOKENS": str(MAX_NEW_TOKENS), "DEFAULT_TEMPERATURE": "0",
            "DEFAULT_SYSTEM_PROMPT": "none"}


def runs_to_the_cap(config: BackendConfig) -> None:
    """Control run: the request the app sends for LONG_PROMPT (greedy, no system prompt, the
    app's default top-p), straight to the engine without Stop, is ended by the cap."""
    run_coroutine(config_reaches_the_cap(config, [ChatMessage("user", LONG_PROMPT)],
                                         GenerationParams(temperature=0.0, top_p=0.95, max_new_tokens=MAX_NEW_TOKENS)))


@pytest.fixture(scope="module")
def embedded_hold(tmp_path_factory) -> Path:
    """While this file exists, the stop app's embedded model holds each reply after HOLD_AFTER_TOKENS."""
    return tmp_path_factory.mktemp("stop-hold") / "hold"


@pytest.fixture(scope="module")
def stop_app(app_factory, tgi_server, embedded_hold) -> AppServer:
    """The embedded model (default) and the TGI-protocol server on both of its routes."""
    env = {"BACKENDS": "llama_cpp," + ",".join(name for name, _, _ in TGI_BACKENDS.values()), **common_env(),
           "LAB_TEST_EMBEDDED_HOLD_FILE": str(embedded_hold),
           "LAB_TEST_EMBEDDED_HOLD_AFTER_TOKENS": str(HOLD_AFTER_TOKENS)}
    for route, (name, label, _) in TGI_BACKENDS.items():
        env.update(backend_env(name, kind="tgi", base_url=tgi_server.url, label=label, route=route))
    return app_factory(env, name="chainlit-stop")


@pytest.fixture(scope="module")
def vllm_stop_app(app_factory, vllm_base_url) -> AppServer:
    return app_factory({"BACKENDS": "vllm", "VLLM_BASE_URL": vllm_base_url, **common_env()},
                       name="chainlit-stop-vllm")


# ---------------------------------------------------------------- helpers


def start_long_reply(page: Page, words: int = 5) -> str:
    """Ask for the long story; return the reply's step id once `words` words are on screen."""
    send(page, LONG_PROMPT)
    step_id = new_reply_id(page, None)
    watch_reply(page, step_id, until=("streaming",))
    deadline = time.monotonic() + 60
    while len(page.evaluate(SNAPSHOT_JS, step_id)["text"].split()) < words:
        assert time.monotonic() < deadline, "the reply did not start streaming"
        time.sleep(0.05)
    return step_id


def press_stop(page: Page, step_id: str) -> dict:
    """Press Chainlit's Stop button; the reply's final snapshot (its figures say "stopped")."""
    page.locator("#stop-button").click()
    final = watch_reply(page, step_id, timeout_ms=30_000)[-1]
    assert final["state"] == "stopped", final
    assert final["text"].strip(), "the partial reply stays"
    return final


def poll(read, done, timeout_s: float = ENGINE_STOP_TIMEOUT_S, what: str = ""):
    """Call `read()` until `done(value)`; the last value. Fails with the last value seen."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = read()
        if done(value):
            return value
        assert time.monotonic() < deadline, f"{what}: still {value}"
        time.sleep(0.1)


def embedded_counts(app: AppServer) -> dict:
    """The embedded model's own counts from GET /lab/state (the app's one model)."""
    with urllib.request.urlopen(f"{app.url}/lab/state", timeout=10) as response:
        models = json.loads(response.read())["embedded_models"]
    assert len(models) == 1, models
    return next(iter(models.values()))


def shown_tokens(final: dict) -> float:
    """The token count the reply's figures show ('123' or '123 ≈')."""
    count = number(final["tokens"])
    assert count is not None and count >= 1, final
    return count


# ---------------------------------------------------------------- the engines


def test_stop_ends_the_embedded_generation(page: Page, stop_app: AppServer, embedded_hold: Path):
    runs_to_the_cap(BackendConfig(name="llama_cpp", kind="llamacpp", label="llama.cpp (embedded)"))
    open_chat(page, stop_app)
    before = embedded_counts(stop_app)
    assert before["generating"] == 0, before
    embedded_hold.touch()
    try:
        step_id = start_long_reply(page, words=3)
        # Held after its HOLD_AFTER_TOKENS-th token: the worker is generating this reply, whatever its speed.
        held = poll(lambda: embedded_counts(stop_app),
                    lambda c: c["generated_tokens_total"] - before["generated_tokens_total"] == HOLD_AFTER_TOKENS,
                    what="the embedded model to reach its hold")
        assert held["generating"] == 1, held
        final = press_stop(page, step_id)
    finally:
        embedded_hold.unlink(missing_ok=True)
    after = poll(lambda: embedded_counts(stop_app), lambda c: c["generating"] == 0 and c["waiting"] == 0,
                 what="the embedded model after Stop")
    generated = after["generated_tokens_total"] - before["generated_tokens_total"]
    # Stop ended it at the hold (the control run shows it would have gone on to the cap), and the
    # figures show exactly what the engine generated.
    assert shown_tokens(final) == generated == HOLD_AFTER_TOKENS, (final["tokens"], generated)
    # And it stays stopped: no token is generated after the worker let go.
    time.sleep(1.0)
    assert embedded_counts(stop_app) == after


@pytest.mark.vllm
def test_stop_ends_the_request_on_the_real_vllm_server(page: Page, vllm_stop_app: AppServer, vllm_base_url):
    root = vllm_base_url.removesuffix("/v1")
    runs_to_the_cap(BackendConfig(name="vllm", kind="vllm", label="vLLM", base_url=vllm_base_url))
    open_chat(page, vllm_stop_app)
    before = engine_state(root)
    assert before.running_requests == 0, before
    # vLLM is held (its own pause, requests kept in place) and let on a step at a time until it is
    # running this reply with a few words on screen: on a fast machine (a GPU) the whole reply
    # could otherwise end before Stop. Stop then closes the request while vLLM still holds it.
    with held_vllm(root) as step_until:
        send(page, LONG_PROMPT)
        step_id = new_reply_id(page, None)
        step_until(lambda: (engine_state(root).running_requests == 1
                            and len(page.evaluate(SNAPSHOT_JS, step_id)["text"].split()) >= 3), timeout_s=120)
        final = press_stop(page, step_id)
    after = poll(lambda: engine_state(root), lambda state: state.running_requests == 0,
                 what="vllm:num_requests_running after Stop")
    generated = after.generation_tokens_total - before.generation_tokens_total
    assert shown_tokens(final) <= generated < BELOW_THE_CAP, (final["tokens"], generated)


@pytest.mark.parametrize("route", list(TGI_BACKENDS))
def test_stop_cancels_the_generation_on_the_tgi_server(page: Page, stop_app: AppServer, tgi_server, route):
    name, label, path = TGI_BACKENDS[route]
    runs_to_the_cap(BackendConfig(name=name, kind="tgi", label=label, base_url=tgi_server.url,
                                  options={"route": route}))
    generations_before = len(run_coroutine(tgi_server.generations()))
    violations_before = len(run_coroutine(tgi_server.violations()))
    open_chat(page, stop_app)
    switch_backend(page, f"{label} ({name})", label)

    def mine() -> list[dict]:
        return run_coroutine(tgi_server.generations())[generations_before:]

    # The server holds the generation after HOLD_AFTER_TOKENS tokens: still running when Stop arrives.
    run_coroutine(tgi_server.set_faults(hold_after_tokens=HOLD_AFTER_TOKENS))
    try:
        step_id = start_long_reply(page, words=3)
        run_coroutine(tgi_server.wait_until_held())
        (running,) = mine()
        assert running["path"] == path and running["status"] == "running" and running["held"], running
        final = press_stop(page, step_id)
        (ended,) = poll(mine, lambda generations: generations[0]["status"] != "running",
                        what="the TGI server's generation after Stop")
    finally:
        run_coroutine(tgi_server.release_holds())
    assert ended["status"] == "cancelled", ended
    assert shown_tokens(final) == ended["generated_tokens"] == HOLD_AFTER_TOKENS, (final["tokens"], ended)
    assert ended["max_new_tokens"] == MAX_NEW_TOKENS
    poll(lambda: run_coroutine(tgi_server.in_flight()), lambda count: count == 0, what="requests in flight")
    assert run_coroutine(tgi_server.violations())[violations_before:] == []
