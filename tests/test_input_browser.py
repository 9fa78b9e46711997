"""Bad input through the real app: markup shown as text in a real browser, forged websocket
traffic refused with a clear message, no request to an address the browser names.

The app runs with three backends on two paced OpenAI-protocol test servers:
"paced" and "echo" share one (its reply text is set per test), "broken" answers
every request with HTTP 500 and an HTML/JS page. A loopback socket that must
never see a connection stands for any address a forger could name. The forged
traffic is sent with load/chainlit_client.py (Chainlit's socket.io protocol, as
the browser speaks it) and to /project/action as the page posts actions.
"""

from __future__ import annotations

import json
import socket
import threading
import time
import uuid

import pytest
import requests
from playwright.sync_api import Page, expect

from load.chainlit_client import ChainlitClient
from servers.app import AppServer, backend_env
from servers.paced_openai import PacedServer, start_paced_server
from tests.test_browser import REPLY_TIMEOUT_MS, new_reply_id, send, watch_reply
from tests.test_compare_browser import change_settings

pytestmark = pytest.mark.slow

PACED_MODEL = "paced-test-model"
READY_TIMEOUT_MS = 120_000
REPLY_TIMEOUT_S = 60.0
# Every way markup could run or inject an element, if it were rendered as HTML or followed as a link.
PAYLOAD = '<img src=x onerror="window.__pwned=1"><script>window.__pwned=2</script>'
LINK = "[click](javascript:window.__pwned=3)"
MARKUP = (f'{PAYLOAD} and {LINK} and <a href="javascript:window.__pwned=4">anchor</a> '
          f'<iframe src="javascript:window.__pwned=5"></iframe> <svg onload="window.__pwned=6"></svg>')
ERROR_PAGE = f"<html><body><h1>Internal Server Error</h1>{PAYLOAD}</body></html>"
MIXED = "Hello 你好 👋🏽 مرحبا שלום — KV 缓存 cache, e\u0301, 👨‍👩‍👧 <b>bold?</b>\n\tsecond line"

# What would show that markup ran or became elements.
INJECTION_JS = """
() => {
  const hrefs = [...document.querySelectorAll('a[href], area[href]')].map((a) => a.getAttribute('href') || '');
  return {
    pwned: window.__pwned === undefined ? null : String(window.__pwned),
    imgX: document.querySelectorAll('img[src="x"]').length,
    payloadScripts: [...document.querySelectorAll('script')].filter((s) => s.textContent.includes('__pwned')).length,
    javascriptLinks: hrefs.filter((h) => h.replace(/[\\s\\u0000-\\u001f]/g, '').toLowerCase().startsWith('javascript:')),
    iframes: document.querySelectorAll('iframe').length,
    handlers: document.querySelectorAll('[onerror], [onload]').length,
    injectedSvg: document.querySelectorAll('svg[onload]').length,
  };
}
"""
NOTHING_INJECTED = {"pwned": None, "imgX": 0, "payloadScripts": 0, "javascriptLinks": [], "iframes": 0,
                    "handlers": 0, "injectedSvg": 0}


# ---------------------------------------------------------------- servers


class Listener:
    """A loopback TCP socket that records every connection made to it (none may come)."""

    def __init__(self) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.sock.settimeout(0.2)
        self.port = self.sock.getsockname()[1]
        self.connections: list[tuple[str, int]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                connection, peer = self.sock.accept()
            except (socket.timeout, OSError):
                continue
            self.connections.append(peer)
            connection.close()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self.sock.close()


@pytest.fixture(scope="module")
def listener():
    watch = Listener()
    yield watch
    watch.close()


@pytest.fixture(scope="module")
def broken_server():
    server = start_paced_server(rate_tokens_per_s=200, tokens=10, name="paced-broken")
    server.set_reply(error={"status": 500, "body": ERROR_PAGE, "content_type": "text/html"})
    yield server
    server.stop()


@pytest.fixture(scope="module")
def input_app(app_factory, paced_server: PacedServer, broken_server: PacedServer) -> AppServer:
    env = {
        "BACKENDS": "paced,echo,broken",
        "DEFAULT_BACKEND": "paced",
        "DEFAULT_SYSTEM_PROMPT": "none",
        "DEFAULT_MAX_NEW_TOKENS": "64",
        "DEFAULT_COMPARE_BACKENDS": "paced,echo,broken",
        "DEFAULT_RUN_ORDER": "concurrent",
        **backend_env("paced", kind="openai", base_url=paced_server.base_url, label="Paced"),
        **backend_env("echo", kind="openai", base_url=paced_server.base_url, label="Echo"),
        **backend_env("broken", kind="openai", base_url=broken_server.base_url, label="Broken"),
    }
    return app_factory(env, name="chainlit-input-tests")


# ---------------------------------------------------------------- browser helpers


def open_chat(page: Page, app: AppServer) -> None:
    page.goto(app.url)
    expect(page.locator('.step[data-step-type="assistant_message"]', has_text=PACED_MODEL).first).to_be_visible(
        timeout=READY_TIMEOUT_MS)


def assert_nothing_injected(page: Page) -> None:
    page.wait_for_timeout(500)  # an <img onerror> would fire once its load failed
    assert page.evaluate(INJECTION_JS) == NOTHING_INJECTED


def paste(page: Page, text: str) -> None:
    """Put `text` in the composer at once, as a paste does (typing 200 KB with fill() or insert_text()
    takes chromium 70-90 s here, with or without Chainlit's composer)."""
    page.evaluate("""(text) => {
      const input = document.querySelector('#chat-input');
      Object.getOwnPropertyDescriptor(HTMLTextAreaElement.prototype, 'value').set.call(input, text);
      input.dispatchEvent(new Event('input', {bubbles: true}));
    }""", text)


def user_message(page: Page, contains: str):
    return page.locator('.step[data-step-type="user_message"]', has_text=contains).last


# ---------------------------------------------------------------- markup is text


def test_the_injection_check_sees_markup_that_was_rendered_as_html(page: Page):
    page.set_content(f"<div>{MARKUP}</div>")
    page.wait_for_timeout(500)
    seen = page.evaluate(INJECTION_JS)
    assert seen["pwned"] is not None and seen["imgX"] == 1 and seen["payloadScripts"] == 1, seen
    assert len(seen["javascriptLinks"]) == 1 and seen["iframes"] == 1 and seen["injectedSvg"] == 1, seen


def test_markup_in_a_message_and_in_the_models_reply_is_shown_as_text(
        page: Page, input_app: AppServer, paced_server: PacedServer):
    paced_server.set_reply(text=MARKUP)
    try:
        open_chat(page, input_app)
        send(page, MARKUP)
        final = watch_reply(page, new_reply_id(page, None))[-1]
        assert final["state"] == "completed", final
        assert paced_server.requests()[-1]["last_user_text"] == MARKUP
        # The tags are on screen as typed, in the message and in the reply.
        for shown in (user_message(page, "onerror").inner_text(), final["text"]):
            assert PAYLOAD in shown, shown
            assert '<iframe src="javascript:window.__pwned=5"></iframe>' in shown
        assert_nothing_injected(page)
    finally:
        paced_server.set_pace(rate_tokens_per_s=50, tokens=60)


def test_markup_in_a_backends_error_page_is_shown_as_text(page: Page, input_app: AppServer):
    open_chat(page, input_app)
    change_settings(page, backend="Broken (broken)")
    send(page, "Will this fail?")
    error = page.locator(".step", has_text="Broken could not answer")
    expect(error).to_be_visible(timeout=30_000)
    expect(error).to_contain_text("HTTP 500")
    expect(error).to_contain_text(PAYLOAD)
    assert_nothing_injected(page)


def test_markup_in_every_column_of_a_compare_round_is_shown_as_text(
        page: Page, input_app: AppServer, paced_server: PacedServer):
    from tests.test_compare_browser import SNAPSHOT_JS as ROUND_JS

    paced_server.set_reply(text=MARKUP)
    try:
        open_chat(page, input_app)
        change_settings(page, mode="Compare side by side")
        send(page, MARKUP)
        deadline = time.monotonic() + REPLY_TIMEOUT_S
        while not ((round_ := page.evaluate(ROUND_JS, False)) and round_["final"]):
            assert time.monotonic() < deadline, f"the round did not finish: {round_}"
            time.sleep(0.1)
        columns = {c["backend"]: c for c in round_["columns"]}
        for name in ("Paced", "Echo"):
            assert columns[name]["state"] == "completed", columns[name]
            assert PAYLOAD in columns[name]["text"], columns[name]["text"]
        assert columns["Broken"]["state"] == "error" and PAYLOAD in columns["Broken"]["error"], columns["Broken"]
        assert_nothing_injected(page)
    finally:
        paced_server.set_pace(rate_tokens_per_s=50, tokens=60)


# ---------------------------------------------------------------- what is typed


def test_mixed_scripts_round_trip_intact_and_an_oversized_paste_stays_on_screen(
        page: Page, input_app: AppServer, paced_server: PacedServer):
    paced_server.set_pace(rate_tokens_per_s=200, tokens=10)
    open_chat(page, input_app)
    send(page, MIXED)
    first = new_reply_id(page, None)
    assert watch_reply(page, first)[-1]["state"] == "completed"
    assert paced_server.requests()[-1]["last_user_text"] == MIXED
    expect(user_message(page, "你好")).to_contain_text("👋🏽 مرحبا שלום")

    requests_before = len(paced_server.requests())
    for lines, shown in ((6_250, "200,000"), (34_375, "1,100,000")):  # 200 KB; over engine.io's own 1 MB
        paste(page, "A pasted log line, number 0000.\n" * lines)
        page.locator("#chat-submit").click(timeout=120_000)  # a busy browser takes its time over 1 MB
        refusal = page.locator(".step", has_text=f"your message is {shown} characters long")
        # A busy machine's browser renders a 1 MB message slowly: a generous bound, and which paste it was.
        expect(refusal, f"no refusal shown for the {shown}-character paste").to_contain_text(
            "the limit is 32,000", timeout=180_000)
        expect(refusal).to_contain_text("stays in the chat")
        assert len(user_message(page, "A pasted log line").inner_text()) >= lines * 31, "the text left the page"
    assert len(paced_server.requests()) == requests_before

    send(page, "And a short one.")
    following = new_reply_id(page, first)
    assert watch_reply(page, following, timeout_ms=REPLY_TIMEOUT_MS)[-1]["state"] == "completed"
    assert paced_server.requests()[-1]["last_user_text"] == "And a short one."


def test_the_socket_waits_for_a_page_busy_drawing_a_big_message(input_app: AppServer):
    """engine.io's own 20 s ping timeout dropped the socket of a page busy drawing a 1.1 MB paste
    (44 s on a loaded machine): the message it sent went nowhere. The handshake carries the guard's."""
    from ui.socket_guard import MAX_SOCKET_MESSAGE, PING_TIMEOUT_S

    handshake = requests.get(f"{input_app.url}/ws/socket.io/?EIO=4&transport=polling", timeout=10)
    assert handshake.ok and handshake.text.startswith("0"), handshake.text[:200]
    opened = json.loads(handshake.text[1:])
    assert opened["pingTimeout"] == PING_TIMEOUT_S * 1000 > 20_000, opened
    assert opened["maxPayload"] == MAX_SOCKET_MESSAGE, opened


# ---------------------------------------------------------------- forged websocket traffic


def post_action(app: AppServer, client: ChainlitClient, name: str, payload: object) -> requests.Response:
    """What the page posts when a button is pressed (any name and payload a forger likes)."""
    return requests.post(f"{app.url}/project/action", timeout=30,
                         json={"sessionId": client.session_id, "action": {"name": name, "payload": payload}})


def test_forged_messages_are_refused_or_cleaned_and_the_chat_goes_on(input_app: AppServer, paced_server: PacedServer):
    paced_server.set_pace(rate_tokens_per_s=200, tokens=10)
    with ChainlitClient(input_app.url) as client:
        client.open_chat()
        for text, expected in (("", "the message is empty"), (" \n\t\u3000 ", "the message is empty"),
                               ("z" * 200_000, "200,000 characters long and the limit is 32,000")):
            before = len(paced_server.requests())
            record = client.ask(text, REPLY_TIMEOUT_S)
            assert record.outcome == "empty" and any(expected in note for note in record.notes), record
            assert len(paced_server.requests()) == before, "a refused message reached the backend"
        record = client.ask("nul\x00 and escape\x1b[31m red", REPLY_TIMEOUT_S)
        assert record.outcome == "replied", record
        assert any("Removed 2 control character(s)" in note for note in record.notes), record.notes
        assert paced_server.requests()[-1]["last_user_text"] == "nul and escape[31m red"
        record = client.ask("Hello again.", REPLY_TIMEOUT_S)
        assert record.outcome == "replied" and record.text.split()[0] == "w1", record


def test_a_long_chat_keeps_a_bounded_number_of_messages_in_the_apps_memory(input_app: AppServer,
                                                                          paced_server: PacedServer):
    from ui.session_memory import KEEP_CONTEXT_MESSAGES

    paced_server.set_pace(rate_tokens_per_s=500, tokens=5)
    before = requests.get(f"{input_app.url}/lab/state", timeout=10).json()["chat_context_messages"]
    with ChainlitClient(input_app.url) as client:
        client.open_chat()
        for i in range(KEEP_CONTEXT_MESSAGES):  # 2 messages each, and the chat's opening ones
            assert client.ask(f"message {i}", REPLY_TIMEOUT_S).outcome == "replied"
        held = requests.get(f"{input_app.url}/lab/state", timeout=10).json()["chat_context_messages"] - before
    assert KEEP_CONTEXT_MESSAGES // 2 <= held <= KEEP_CONTEXT_MESSAGES, held


FORGED_SETTINGS = [
    ({"backend": "{listener}/v1"}, "Unknown backend"),
    ({"backend": "no_such_backend"}, "Unknown backend 'no_such_backend'. Configured backends: paced, echo, broken"),
    ({"backend": ["paced"]}, "Unknown backend"),
    ({"backend": "paced", "base_url": "{listener}/v1", "api_key": "sk-forged"}, "unknown setting(s) api_key, base_url"),
    ({"backend": "paced", "compare_backends": ["paced", "{listener}"]}, "unknown backend(s) to compare"),
    ({"backend": "paced", "temperature": float("nan")}, "temperature 'nan' must be a number in 0..2"),
    ({"backend": "paced", "temperature": 1e308}, "must be a number in 0..2"),
    ({"backend": "paced", "top_p": {"$gt": 0}}, "top-p"),
    ({"backend": "paced", "max_new_tokens": -5}, "max new tokens '-5' must be a number in 16..4096"),
    ({"backend": "paced", "seed": 1.5}, "seed '1.5' must be a whole number"),
    ({"backend": "paced", "top_k": True}, "top-k 'True' must be a whole number"),
    ({"backend": "paced", "mode": "admin"}, "mode 'admin' is not one of chat, compare, blind"),
    ({"backend": "paced", "system_custom": "s" * 2**20}, "1,048,576 characters; the limit is 20,000"),
    ({"backend": "paced", "system_custom": "Be brief.\x00"}, "1 control character(s)"),
]


def test_forged_settings_are_refused_with_a_clear_message_and_the_chat_goes_on(
        input_app: AppServer, paced_server: PacedServer, listener: Listener):
    paced_server.set_pace(rate_tokens_per_s=200, tokens=10)
    with ChainlitClient(input_app.url) as client:
        client.open_chat()
        for form, expected in FORGED_SETTINGS:
            form = {key: value.replace("{listener}", listener.url) if isinstance(value, str) else
                    [v.replace("{listener}", listener.url) for v in value] if isinstance(value, list) else value
                    for key, value in form.items()}
            answer = client.emit_for_message("chat_settings_change", form)
            assert expected in answer, (form.keys(), answer[:300])
            assert "from your next message" not in answer
            assert len(answer) < 2_000, "a forged value was echoed whole"
        record = client.ask("Still there?", REPLY_TIMEOUT_S)
        assert record.outcome == "replied", record
        sampling = paced_server.requests()[-1]["sampling"]
        assert sampling["max_tokens"] == 64 and sampling["temperature"] == 0.7, "a refused setting was applied"
    assert listener.connections == []


def test_forged_actions_are_refused_with_a_clear_message(input_app: AppServer, paced_server: PacedServer,
                                                         listener: Listener):
    paced_server.set_pace(rate_tokens_per_s=200, tokens=10)
    with ChainlitClient(input_app.url) as client:
        client.open_chat()
        seen = len(client.tracker.other_messages)
        response = post_action(input_app, client, "retry", {"text": "forged", "base_url": listener.url})
        assert response.ok, response.text
        for payload, expected in (
                ({"round_id": listener.url, "outcome": "win", "winner": "A"}, "no such round"),
                ({"round_id": "r\x00" + "1" * 100_000, "outcome": "tie"}, "the vote names no round"),
                ({"round_id": "r", "outcome": "landslide"}, "outcome 'landslide' is not one of"),
                ({"round_id": "r", "outcome": "tie", "comment": "c" * 5_000}, "at most 2000 characters"),
                ({"round_id": "r", "outcome": "tie", "judgements": {"A": ["nested"]}}, "judgements")):
            answer = post_action(input_app, client, "vote", payload).json()["response"]
            assert answer["ok"] is False and expected in answer["message"], (payload, answer)
        # A payload that is not an object never reaches the app: Chainlit's Action model refuses it
        # (HTTP 500, "Internal Server Error", no message in the chat).
        assert not post_action(input_app, client, "vote", ["not", "an", "object"]).ok
        for users in (1000, -1, "30", None):
            answer = post_action(input_app, client, "simulate", {"users": users, "base_url": listener.url})
            answer = answer.json()["response"]
            assert answer["ok"] is False and "is not an option" in answer["message"], (users, answer)
        assert post_action(input_app, client, "no_such_action", {}).status_code == 404
        deadline = time.monotonic() + 10
        while len(client.tracker.other_messages) < seen + 1:
            assert time.monotonic() < deadline, client.tracker.other_messages[seen:]
            time.sleep(0.05)
        assert "Nothing to retry." in client.tracker.other_messages[seen:]
        record = client.ask("After the forgeries.", REPLY_TIMEOUT_S)
        assert record.outcome == "replied", record
    assert listener.connections == []


def test_no_browser_path_makes_the_server_call_another_address(
        input_app: AppServer, paced_server: PacedServer, listener: Listener):
    """Every place a page could name an address: Chainlit's per-user environment, settings, a compare
    round, actions, the message itself. The backends called are the configured ones only."""
    paced_server.set_pace(rate_tokens_per_s=200, tokens=10)
    forged_env = {name: listener.url + "/v1" for name in (
        "PACED_BASE_URL", "ECHO_BASE_URL", "OPENAI_BASE_URL", "VLLM_BASE_URL", "TGI_BASE_URL", "DATABASE_URL")}
    forged_env["PACED_API_KEY"] = "sk-forged"
    with ChainlitClient(input_app.url, user_env=forged_env) as client:
        client.open_chat()
        client.emit_for_message("chat_settings_change", {"backend": listener.url, "base_url": listener.url})
        client.emit_for_message("chat_settings_change", {"backend": "paced", "mode": "compare",
                                                         "compare_backends": [listener.url, "paced"]})
        applied = client.emit_for_message("chat_settings_change", {"backend": "paced", "mode": "compare",
                                                                   "compare_backends": ["paced", "echo"]})
        assert "from your next message" in applied, applied
        post_action(input_app, client, "simulate", {"users": 1, "backend": listener.url})
        post_action(input_app, client, "engines", {"url": listener.url})
        question = f"Fetch {listener.url}/v1/chat/completions for me."
        record = client.ask(question, REPLY_TIMEOUT_S)
        assert record.done and record.error is None, record  # a round: its text is in the grid element
        # Both columns of the compare round went to the configured server (the forged column was refused).
        assert [r["last_user_text"] for r in paced_server.requests()].count(question) == 2
    time.sleep(1.0)
    assert listener.connections == []


def test_uploads_are_refused(input_app: AppServer):
    with ChainlitClient(input_app.url) as client:
        client.open_chat()
        response = requests.post(f"{input_app.url}/project/file", params={"session_id": client.session_id},
                                 files={"file": ("notes.txt", b"hello", "text/plain")}, timeout=30)
    assert response.status_code == 400 and "File upload is not enabled" in response.text


# ---------------------------------------------------------------- other web pages


def test_other_web_pages_can_neither_read_the_app_nor_open_its_socket(input_app: AppServer):
    import socketio

    from load.chainlit_client import SOCKET_PATH, browser_auth

    foreign = "http://evil.example"
    settings = requests.get(f"{input_app.url}/project/settings?language=en-US", headers={"Origin": foreign},
                            timeout=10)
    assert settings.ok and "access-control-allow-origin" not in settings.headers
    preflight = requests.options(f"{input_app.url}/project/action", timeout=10, headers={
        "Origin": foreign, "Access-Control-Request-Method": "POST", "Access-Control-Request-Headers": "content-type"})
    assert preflight.status_code == 400 and "origin" in preflight.text
    own = requests.get(f"{input_app.url}/project/settings?language=en-US", headers={"Origin": input_app.url},
                       timeout=10)
    assert own.ok

    def connects(origin: str | None, transport: str) -> bool:
        """Open a socket as a page at `origin` would (polling sends exactly that Origin; the websocket
        library adds the app's own origin to the one given, as the server then sees both)."""
        sio = socketio.Client(reconnection=False)
        headers = {"Origin": origin} if origin else {}
        try:
            sio.connect(input_app.url, socketio_path=SOCKET_PATH, transports=[transport], headers=headers,
                        auth=browser_auth(str(uuid.uuid4())), wait_timeout=10)
        except socketio.exceptions.ConnectionError:
            return False
        sio.disconnect()
        return True

    for transport in ("polling", "websocket"):
        assert not connects(foreign, transport), transport
        assert connects(input_app.url, transport), transport  # the app's own page, on whatever port it runs
    assert not connects("null", "polling")  # a sandboxed frame or a file:// page
    # To a browser, a page on localhost is another origin than the app on 127.0.0.1.
    assert not connects(input_app.url.replace("127.0.0.1", "localhost"), "polling")
    assert connects(None, "polling")  # not a browser: scripts and the load client send no Origin


def test_the_apps_own_counts_answer_only_on_its_machine_and_hold_no_chat_content(input_app: AppServer):
    state = requests.get(f"{input_app.url}/lab/state", timeout=10)
    assert state.ok, state.text
    figures = state.json()
    assert figures["session_timeout_s"] == 600 and figures["rss_mb"] > 50
    assert set(figures["threads_by_kind"]) == {"database", "executor", "model", "other"}
    # The one name it gives is which process answered (a random name here, no LAB_REPLICA_ID), the
    # same as the X-Lab-Replica header; everything else is a count.
    replica = figures.pop("replica")
    assert replica == state.headers["X-Lab-Replica"] and str(figures["pid"]) not in replica, replica
    assert all(isinstance(v, (int, float, dict)) for v in figures.values()), figures  # counts only
    # Through a proxy the request would come from loopback too: a forwarded one is refused.
    for header in ({"X-Forwarded-For": "203.0.113.9"}, {"Forwarded": "for=203.0.113.9"}):
        refused = requests.get(f"{input_app.url}/lab/state", headers=header, timeout=10)
        assert refused.status_code == 403 and "own machine" in refused.text, refused.text


# ---------------------------------------------------------------- longer than the model's context


@pytest.fixture(scope="module")
def small_context_app(app_factory, tgi_server) -> AppServer:
    """The embedded model with a 256-token context, and the TGI-protocol server (1,024 input tokens)."""
    env = {
        "BACKENDS": "llama_cpp,tgi",
        "LLAMA_CPP_N_CTX": "256",
        "TGI_BASE_URL": tgi_server.url,
        "DEFAULT_MAX_NEW_TOKENS": "16",
        "DEFAULT_SYSTEM_PROMPT": "none",
    }
    return app_factory(env, name="chainlit-input-context")


def test_a_prompt_longer_than_the_context_gets_the_engines_clear_refusal(small_context_app: AppServer, tgi_server):
    # ~3,100 tokens: within the app's 32,000-character limit, beyond both contexts.
    long_prompt = "Summarise these numbers: " + " ".join(f"item{i}" for i in range(800))
    assert len(long_prompt) < 32_000
    with ChainlitClient(small_context_app.url) as client:
        client.open_chat(timeout_s=120)
        record = client.ask(long_prompt, 120)
        assert record.outcome == "error", record
        assert "**llama.cpp (embedded)** could not answer" in record.error
        assert "but the context holds 256" in record.error and "Shorten the message" in record.error
        assert "Your message is kept" in record.error  # Retry, after switching backend if you like

        assert "TGI" in client.change_settings(backend="tgi")
        record = client.ask(long_prompt, 120)
        assert record.outcome == "error", record
        assert "**TGI** could not answer" in record.error and tgi_server.url in record.error
        # TGI's own validation message, quoted: the prompt's size and the server's limit.
        assert "must be <= 2048. Given: " in record.error and "`inputs` tokens" in record.error, record.error

        record = client.ask("Say hi.", 120)  # the session goes on
        assert record.outcome == "replied", record


# ---------------------------------------------------------------- NUL and PostgreSQL


def test_a_message_with_nul_is_stored_cleaned_on_postgresql(app_factory, paced_server: PacedServer, postgres_url):
    """PostgreSQL text cannot hold NUL: the message shown, sent and stored is the cleaned one.
    (Chainlit's own `on_message` run step keeps the raw text as its input and fails to store:
    a logged warning, a step the chat does not show.)"""
    import asyncio

    import asyncpg

    from servers.app import run_coroutine
    from tests.fixtures_postgres import new_postgres_database

    database = run_coroutine(new_postgres_database(postgres_url))
    app = app_factory({"BACKENDS": "paced", "DEFAULT_SYSTEM_PROMPT": "none", "DATABASE_URL": database,
                       **backend_env("paced", kind="openai", base_url=paced_server.base_url, label="Paced")},
                      name="chainlit-input-postgres")
    paced_server.set_pace(rate_tokens_per_s=200, tokens=10)
    with ChainlitClient(app.url) as client:
        client.open_chat()
        record = client.ask("before\x00after 天空 👍", REPLY_TIMEOUT_S)
    assert record.outcome == "replied" and any("Removed 1 control" in note for note in record.notes), record

    async def stored() -> tuple[list, list]:
        connection = await asyncpg.connect(database)
        try:
            deadline = time.monotonic() + 10
            while True:  # Chainlit stores steps in the background
                steps = await connection.fetch("SELECT output FROM steps WHERE type = 'user_message'")
                replies = await connection.fetch("SELECT prompt FROM replies")
                if (steps and replies) or time.monotonic() > deadline:
                    return [row["output"] for row in steps], [row["prompt"] for row in replies]
                await asyncio.sleep(0.2)
        finally:
            await connection.close()

    assert run_coroutine(stored()) == (["beforeafter 天空 👍"], ["beforeafter 天空 👍"])
