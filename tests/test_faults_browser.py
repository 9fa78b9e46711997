"""Faults end to end: the real app in a real browser, with servers that die and come back.

- A vLLM server of its own (not the session's: this one is killed) is sent
  SIGKILL while the app streams a long reply. The partial text stays, the
  error says the connection was lost mid-reply, `/status` and the settings
  panel show vLLM unavailable; vLLM is started again on the same port, and
  `/status` shows it ready and the next message is answered - by the same
  app process, never restarted.
- The same with the TGI-protocol test server (its paced engine, a process of
  its own), on both TGI routes.
- A server that rejects the app's API key and echoes it (as OpenAI's own 401
  does): the key is in none of the page, the websocket traffic, the app's log
  or its database.
"""

from __future__ import annotations

import os
import re
import secrets
import signal
import time

import pytest
from playwright.sync_api import Page, expect

from backends.errors import REDACTED
from scripts.vllm_launch import BUNDLED_MODEL_DIR, BUNDLED_MODEL_NAME, server_command, server_env
from servers.app import AppServer, backend_env
from servers.paced_openai import start_paced_server
from servers.process import ServerProcess, free_port
from servers.tgi_protocol.handle import paced_command
from tests.fixtures_vllm import held_vllm
from tests.test_browser import SNAPSHOT_JS, new_reply_id, send, watch_reply
from tests.browser_frames import collect_frames, drain_frames

pytestmark = pytest.mark.slow

READY_TIMEOUT_MS = 180_000
VLLM_START_TIMEOUT_S = 300.0
LONG_PROMPT = "Write a very long story about a dragon and a knight, with many chapters."


# ---------------------------------------------------------------- helpers


def open_chat(page: Page, app: AppServer, ready_text: str) -> None:
    """Open a new session and wait until its backend list (which names `ready_text`) is shown."""
    page.goto(app.url)
    expect(page.locator('.step[data-step-type="assistant_message"]', has_text=ready_text).first).to_be_visible(
        timeout=READY_TIMEOUT_MS)


def backend_lists(page: Page):
    return page.locator('.step[data-step-type="assistant_message"]', has_text=re.compile(r"^\s*Backends"))


def run_status(page: Page) -> str:
    """Type /status; return the text of the backend list it shows."""
    lists = backend_lists(page)
    before = lists.count()
    send(page, "/status")
    expect(lists).to_have_count(before + 1, timeout=30_000)
    return lists.last.inner_text()


def line_of(listing: str, name: str) -> str:
    """The line of one backend in a backend list."""
    lines = [line for line in listing.splitlines() if f"({name}" in line]
    assert lines, f"{name} is not in the list:\n{listing}"
    return lines[0]


def backend_options(page: Page) -> list[str]:
    """The backend choices in the settings panel, as shown (a down backend says "unavailable")."""
    page.locator("#chat-settings-open-modal").click()
    page.locator("#backend").click()
    options = page.get_by_role("option")
    expect(options.first).to_be_visible()
    names = options.all_inner_texts()
    page.keyboard.press("Escape")
    page.keyboard.press("Escape")
    expect(page.locator("#chat-settings")).to_have_count(0)
    return names


def choose_backend(page: Page, name: str) -> None:
    """Select the backend `name` (configured name) in the settings panel and confirm."""
    page.locator("#chat-settings-open-modal").click()
    page.locator("#backend").click()
    page.get_by_role("option", name=re.compile(rf"\({re.escape(name)}\)")).click()
    page.locator("#confirm").click()
    expect(page.locator(".step", has_text="from your next message").last).to_be_visible()


def wait_for_words(page: Page, step_id: str, count: int, timeout_s: float = 180.0) -> str:
    deadline = time.monotonic() + timeout_s
    while True:
        snapshot = page.evaluate(SNAPSHOT_JS, step_id)
        if snapshot and len(snapshot["text"].split()) >= count:
            return snapshot["text"]
        assert time.monotonic() < deadline, f"the reply did not reach {count} words: {snapshot}"
        time.sleep(0.05)


def kill(server: ServerProcess) -> None:
    """SIGKILL the server's whole process group (vLLM's engine process too): a crash, not a shutdown."""
    os.killpg(server.process.pid, signal.SIGKILL)
    server.process.wait(timeout=30)


def error_after(page: Page, label: str):
    return page.locator(".step", has_text=f"{label} could not answer").last


def kill_mid_reply_then_recover(page: Page, app: AppServer, *, name: str, label: str,
                                server: ServerProcess, restart, ready_hint: str, min_words: int,
                                hold=None) -> dict:
    """The scenario both engines go through; returns what was seen, for engine-specific checks.
    `hold`, if given, is a context manager factory like `held_vllm`: the engine is held (and let
    on a step at a time) until `min_words` are on screen and killed while held, so a fast machine
    cannot finish the reply before the kill."""
    app_pid = app.process.process.pid
    previous = (page.evaluate(SNAPSHOT_JS, None) or {}).get("stepId")
    if hold is None:
        send(page, LONG_PROMPT)
        step_id = new_reply_id(page, previous, timeout_s=120)
        before_kill = wait_for_words(page, step_id, min_words)
        kill(server)
    else:
        with hold() as step_until:
            send(page, LONG_PROMPT)
            step_id = new_reply_id(page, previous, timeout_s=120)
            step_until(lambda: len((page.evaluate(SNAPSHOT_JS, step_id) or {}).get("text", "").split()) >= min_words,
                       timeout_s=180)
            before_kill = page.evaluate(SNAPSHOT_JS, step_id)["text"]
            kill(server)
    final = watch_reply(page, step_id, timeout_ms=60_000)[-1]
    assert final["state"] == "error", final
    assert final["text"].startswith(before_kill.rstrip()[: len(before_kill) // 2]), "the partial text did not stay"
    assert len(final["text"].split()) >= min_words
    error = error_after(page, label)
    expect(error).to_contain_text("the connection was lost mid-reply", timeout=30_000)
    error_text = error.inner_text()
    assert "not reachable" not in error_text and "Start it with" not in error_text, error_text

    down = line_of(run_status(page), name)
    assert "❌" in down and "unavailable" in down, down
    assert any("unavailable" in option and f"({name})" in option for option in backend_options(page))

    replacement = restart()
    up = line_of(run_status(page), name)
    assert "✅" in up and ready_hint in up, up
    assert not any("unavailable" in option and f"({name})" in option for option in backend_options(page))

    previous = page.evaluate(SNAPSHOT_JS, None)["stepId"]
    send(page, "Say hello in five words.")
    after = watch_reply(page, new_reply_id(page, previous, timeout_s=120))[-1]
    assert after["state"] == "completed" and after["text"].strip(), after
    assert app.process.process.poll() is None and app.process.process.pid == app_pid, "the app was restarted"
    return {"final": final, "error": error_text, "replacement": replacement}


# ---------------------------------------------------------------- vLLM


def start_vllm(port: int, name: str) -> ServerProcess:
    command = server_command(model=BUNDLED_MODEL_DIR, served_model_name=BUNDLED_MODEL_NAME, port=port, cpu=True)
    # vLLM's own dev mode adds /pause and /resume: the test holds it mid-reply (held_vllm).
    server = ServerProcess(name, command, env={**server_env(cpu=True), "VLLM_SERVER_DEV_MODE": "1"})
    started_s = time.perf_counter()
    server.start_serving(f"http://127.0.0.1:{port}/health", VLLM_START_TIMEOUT_S)
    print(f"{name}: /health answered after {time.perf_counter() - started_s:.0f} s (log: {server.log_path})")
    return server


def test_vllm_killed_mid_reply_then_restarted_on_the_same_port(app_factory, page: Page, vllm_installed):
    port = free_port()
    servers = [start_vllm(port, "vllm-faults")]
    try:
        app = app_factory({
            "BACKENDS": "vllm", "VLLM_BASE_URL": f"http://127.0.0.1:{port}/v1", "VLLM_CONNECT_TIMEOUT_S": "2",
            "DEFAULT_TEMPERATURE": "0", "DEFAULT_MAX_NEW_TOKENS": "400", "DEFAULT_SYSTEM_PROMPT": "none",
        }, name="chainlit-faults-vllm")
        open_chat(page, app, BUNDLED_MODEL_NAME)

        def restart() -> ServerProcess:
            servers.append(start_vllm(port, "vllm-faults-restarted"))
            return servers[-1]

        seen = kill_mid_reply_then_recover(page, app, name="vllm", label="vLLM", server=servers[0],
                                           restart=restart, ready_hint=BUNDLED_MODEL_NAME, min_words=8,
                                           hold=lambda: held_vllm(f"http://127.0.0.1:{port}"))
        assert f"127.0.0.1:{port}" in seen["error"]
    finally:
        for server in servers:
            server.stop()


# ---------------------------------------------------------------- TGI, both routes


def tgi_command(port: int) -> list[str]:
    # 300 tokens at 25 tokens/s: a reply long enough to be killed in the middle.
    return paced_command(port, 25, 300)


@pytest.fixture(scope="module")
def tgi_port() -> int:
    return free_port()


@pytest.fixture(scope="module")
def tgi_servers(tgi_port: int):
    """Every TGI-protocol server process this module starts (all on one port), stopped at the end."""
    servers: list[ServerProcess] = []
    yield servers
    for server in servers:
        server.stop()


def start_tgi(port: int, servers: list[ServerProcess]) -> ServerProcess:
    server = ServerProcess(f"tgi-faults-{len(servers)}", tgi_command(port))
    servers.append(server)
    server.start_serving(f"http://127.0.0.1:{port}/health", 60)
    return server


@pytest.fixture(scope="module")
def tgi_faults_app(app_factory, tgi_port: int, tgi_servers) -> AppServer:
    start_tgi(tgi_port, tgi_servers)
    url = f"http://127.0.0.1:{tgi_port}"
    return app_factory({
        "BACKENDS": "tgi_messages,tgi_generate",
        **backend_env("tgi_messages", kind="tgi", base_url=url, label="TGI messages", route="messages"),
        **backend_env("tgi_generate", kind="tgi", base_url=url, label="TGI generate", route="generate"),
        "DEFAULT_TEMPERATURE": "0.7", "DEFAULT_MAX_NEW_TOKENS": "300", "DEFAULT_SYSTEM_PROMPT": "none",
    }, name="chainlit-faults-tgi")


@pytest.mark.parametrize("route", ["messages", "generate"])
def test_tgi_killed_mid_reply_then_restarted_on_the_same_port(route, page: Page, tgi_faults_app: AppServer,
                                                              tgi_port: int, tgi_servers):
    name, label = f"tgi_{route}", f"TGI {route}"
    if tgi_servers[-1].process.poll() is not None:
        start_tgi(tgi_port, tgi_servers)
    open_chat(page, tgi_faults_app, "paced-test-model")
    choose_backend(page, name)
    seen = kill_mid_reply_then_recover(page, tgi_faults_app, name=name, label=label, server=tgi_servers[-1],
                                       restart=lambda: start_tgi(tgi_port, tgi_servers),
                                       ready_hint="paced-test-model", min_words=5)
    assert f"127.0.0.1:{tgi_port}" in seen["error"]
    assert seen["final"]["text"].split()[:3] == ["w1", "w2", "w3"]


# ---------------------------------------------------------------- the API key stays secret


def test_an_echoed_api_key_is_in_no_page_frame_log_or_database(app_factory, page: Page, tmp_path):
    key = "sk-lab-" + secrets.token_urlsafe(32)
    server = start_paced_server(rate_tokens_per_s=100, tokens=20, name="paced-key-echo")
    try:
        server.set_faults(require_key="the-right-key")  # so it rejects ours, quoting it
        database = tmp_path / "db"
        database.mkdir()
        app = app_factory({
            "BACKENDS": "gateway",
            **backend_env("gateway", kind="openai", base_url=server.base_url, label="Gateway", api_key=key),
            "DEFAULT_SYSTEM_PROMPT": "none", "DATABASE_URL": f"sqlite:///{database / 'lab.db'}",
        }, name="chainlit-faults-key")
        frames = collect_frames(page)
        open_chat(page, app, "paced-test-model")
        before = len(drain_frames(page, frames))
        send(page, "Hello?")
        error = error_after(page, "Gateway")
        expect(error).to_contain_text(f"Incorrect API key provided: {REDACTED}", timeout=60_000)
        expect(error).to_contain_text("GATEWAY_API_KEY")
        drain_frames(page, frames, since=before, until_task_end=True)

        assert key not in page.content()
        assert frames["received"] and frames["sent"]
        assert not [frame[:80] for frame in frames["received"] + frames["sent"] if key in frame]
        assert REDACTED in "".join(frames["received"])  # the error did travel, without the key
        log = app.process.log_path.read_text(errors="replace")
        assert log and key not in log
        stored_bytes = b"".join(path.read_bytes() for path in database.iterdir() if path.is_file())
        assert REDACTED.encode() in stored_bytes, "the failed reply was not stored"
        assert key.encode() not in stored_bytes
    finally:
        server.stop()
