"""/stats, replaying a chat on every backend, and login with each person's own history, in a browser.

Two paced OpenAI-protocol test servers stand in for two engines (fast and
exact, so the tests are about the app); the database is a SQLite file.
"""

from __future__ import annotations

import secrets
import time
import uuid

import pytest
import socketio
from playwright.sync_api import Page, expect

from core.auth import hash_password
from load.chainlit_client import SOCKET_PATH, browser_auth, browser_headers
from servers.app import AppServer, backend_env
from servers.paced_openai import paced_pair

pytestmark = pytest.mark.slow

READY_TIMEOUT_MS = 120_000


@pytest.fixture(scope="module")
def pair():
    with paced_pair("reports") as servers:
        yield servers


def pair_env(pair, tmp_path_factory, name: str, **more: str) -> dict[str, str]:
    left, right = pair
    return {
        "BACKENDS": "left,right",
        **backend_env("left", kind="openai", base_url=left.base_url, label="Left engine"),
        **backend_env("right", kind="openai", base_url=right.base_url, label="Right engine"),
        "DEFAULT_SYSTEM_PROMPT": "none",
        "DATABASE_URL": f"sqlite:///{tmp_path_factory.mktemp(name) / 'lab.db'}",
        **more,
    }


def wait_ready(page: Page) -> None:
    expect(page.locator(".step", has_text="paced-test-model").first).to_be_visible(timeout=READY_TIMEOUT_MS)


def ask(page: Page, text: str) -> None:
    """Send a message and wait until its reply's figures are final."""
    done_before = page.locator('[data-testid="metrics"][data-state="completed"]').count()
    page.locator("#chat-input").fill(text)
    page.locator("#chat-submit").click()
    expect(page.locator('[data-testid="metrics"][data-state="completed"]')).to_have_count(done_before + 1,
                                                                                           timeout=60_000)


@pytest.fixture(scope="module")
def reports_app(app_factory, pair, tmp_path_factory) -> AppServer:
    return app_factory(pair_env(pair, tmp_path_factory, "reports"), name="chainlit-reports")


def test_stats_lists_this_chats_replies_with_a_chart_and_downloads(page: Page, reports_app: AppServer):
    page.goto(reports_app.url)
    wait_ready(page)
    ask(page, "first question")
    ask(page, "second question")
    page.locator("#chat-input").fill("/stats")
    page.locator("#chat-submit").click()
    stats = page.locator(".step", has_text="This chat's replies (2)").last
    expect(stats).to_be_visible(timeout=30_000)
    rows = stats.locator("tbody tr")
    expect(rows).to_have_count(2)
    expect(rows.first).to_contain_text("left")
    expect(stats.locator(".js-plotly-plot").first).to_be_visible(timeout=30_000)
    csv_link = stats.get_by_role("link", name="replies.csv")
    expect(csv_link).to_be_visible()
    expect(stats.get_by_role("link", name="replies.json")).to_be_visible()
    downloaded = page.request.get(csv_link.get_attribute("href")).text()
    lines = downloaded.strip().splitlines()
    assert lines[0].startswith("created_at,backend,model,mode,status,first_token_ms")
    assert len(lines) == 3 and "first question" in downloaded and "second question" in downloaded


def test_replay_runs_the_chats_prompts_on_every_chosen_backend(page: Page, reports_app: AppServer, pair):
    left, right = pair
    page.goto(reports_app.url)
    wait_ready(page)
    ask(page, "replay one")
    ask(page, "replay two")
    before = (len(left.requests()), len(right.requests()))
    page.get_by_role("button", name="Replay on all backends").click()
    table = page.locator(".step", has_text="Replay of this chat's 2 prompt(s)").last
    expect(table).to_be_visible(timeout=60_000)
    expect(table.locator("tbody tr")).to_have_count(2)
    for label in ("Left engine", "Right engine"):
        cells = table.locator("tr", has_text=label).locator("td").all_inner_texts()
        assert cells[1:3] == ["2", "0"], cells  # two replies, no failure
    # Each backend got the chat's prompts in order, each after its own earlier reply.
    assert [r["last_user_text"] for r in left.requests()[before[0]:]] == ["replay one", "replay two"]
    assert [r["last_user_text"] for r in right.requests()[before[1]:]] == ["replay one", "replay two"]
    progress = page.locator(".step", has_text="Replaying this chat on every chosen backend").last
    expect(progress).to_contain_text("4/4")


# ---------------------------------------------------------------- login and history


PASSWORDS = {"alice": "alice-" + secrets.token_hex(4), "bob": "bob-" + secrets.token_hex(4)}


@pytest.fixture(scope="module")
def login_app(app_factory, pair, tmp_path_factory) -> AppServer:
    users = ",".join(f"{name}:{hash_password(password, iterations=1000)}" for name, password in PASSWORDS.items())
    env = pair_env(pair, tmp_path_factory, "login", AUTH_USERS=users, TEACHERS="alice",
                   CHAINLIT_AUTH_SECRET=secrets.token_urlsafe(32))
    return app_factory(env, name="chainlit-login")


def log_in(page: Page, app: AppServer, user: str, password: str) -> None:
    page.goto(app.url)
    page.locator("#email").fill(user)
    page.locator("#password").fill(password)
    page.get_by_role("button", name="Sign In").click()


def history_titles(page: Page) -> list[str]:
    """The titles the history sidebar lists now (it is opened if closed)."""
    history = page.locator("#thread-history")
    if not history.is_visible():
        page.locator("#sidebar-trigger-button").click()
    expect(history).to_be_visible(timeout=30_000)
    return [title.strip() for title in history.locator("a").all_inner_texts()]


def wait_for_history_title(page: Page, title: str, timeout_s: float = 60) -> list[str]:
    """The sidebar's titles once a chat titled `title` is among them. The sidebar fills a moment
    after the page (and lists a new chat once its first message is stored): wait for the link,
    reloading the page now and then, never a fixed sleep."""
    deadline = time.monotonic() + timeout_s
    while True:
        titles = history_titles(page)
        if any(title in text for text in titles):
            return titles
        assert time.monotonic() < deadline, f"{title!r} never appeared in the history: {titles}"
        try:
            expect(page.locator("#thread-history a", has_text=title).first).to_be_visible(timeout=5_000)
        except AssertionError:
            page.reload()
            wait_ready(page)


def test_login_keeps_each_persons_history_to_themselves_and_a_chat_resumes(chromium, login_app: AppServer, pair):
    left, _ = pair
    alice = chromium.new_context(locale="en-US", viewport={"width": 1400, "height": 1000}).new_page()
    bob = chromium.new_context(locale="en-US", viewport={"width": 1400, "height": 1000}).new_page()
    try:
        log_in(alice, login_app, "alice", "wrong password")
        expect(alice.get_by_role("alert")).to_contain_text("Wrong user name or password", timeout=30_000)
        log_in(alice, login_app, "alice", PASSWORDS["alice"])
        wait_ready(alice)
        ask(alice, "alice secret plan")
        expect(alice.locator("#thread-history").or_(alice.locator("#sidebar-trigger-button")).first).to_be_visible()
        wait_for_history_title(alice, "alice secret plan")

        log_in(bob, login_app, "bob", PASSWORDS["bob"])
        wait_ready(bob)
        ask(bob, "bob's own question")
        # Bob's sidebar is read once it lists his own chat (an empty or not yet filled sidebar
        # would pass the check below for nothing).
        titles = wait_for_history_title(bob, "bob's own question")
        assert not any("alice" in title for title in titles), titles
        # Replaying a chat loads every chosen backend: with login on, a student may not.
        requests_before = [len(server.requests()) for server in pair]
        bob.locator("#chat-input").fill("/replay")
        bob.locator("#chat-submit").click()
        expect(bob.locator(".step", has_text="Only a teacher may replay")).to_be_visible(timeout=30_000)
        assert [len(server.requests()) for server in pair] == requests_before

        # Alice reopens her chat from the sidebar: it goes on with its history.
        alice.locator("#thread-history a", has_text="alice secret plan").first.click()
        expect(alice.locator(".step", has_text="alice secret plan").first).to_be_visible(timeout=30_000)
        expect(alice.locator("#chat-input")).to_be_visible(timeout=30_000)
        alice.locator("#chat-input").fill("and then?")
        alice.locator("#chat-submit").click()
        deadline = time.monotonic() + 30
        while left.requests()[-1]["last_user_text"] != "and then?":
            assert time.monotonic() < deadline, "the resumed chat did not reach the backend"
            time.sleep(0.2)
        assert left.requests()[-1]["messages_count"] == 3  # the earlier question, its reply, the new one
    finally:
        alice.context.close()
        bob.context.close()


def history_thread_id(page: Page, title: str) -> str:
    """The id of this person's chat titled `title`, from its link in the history sidebar."""
    wait_for_history_title(page, title)
    href = page.locator("#thread-history a", has_text=title).first.get_attribute("href")
    return href.rstrip("/").rsplit("/", 1)[-1]


def cookie_header(page: Page) -> str:
    return "; ".join(f"{c['name']}={c['value']}" for c in page.context.cookies())


def socket_accepts(app: AppServer, cookie: str, thread_id: str) -> bool:
    """Whether Chainlit's socket accepts a connection made as the browser makes it, with these
    cookies and `thread_id` as the chat to resume ("" for a new chat)."""
    client = socketio.Client(reconnection=False)
    try:
        client.connect(app.url, socketio_path=SOCKET_PATH, transports=["websocket"], wait_timeout=15,
                       headers={**browser_headers(app.url, "en-US"), "Cookie": cookie},
                       auth={**browser_auth(str(uuid.uuid4())), "threadId": thread_id})
    except socketio.exceptions.ConnectionError:
        return False
    client.disconnect()
    return True


def test_a_thread_id_alone_opens_nobody_elses_chat(chromium, login_app: AppServer):
    """Bob knows the id of Alice's chat: Chainlit's REST route, the page at /thread/<id> and the
    socket's resume all refuse him, while Alice reaches it each way (so the refusals are about
    who asks, not a broken request)."""
    alice = chromium.new_context(locale="en-US", viewport={"width": 1400, "height": 1000}).new_page()
    bob = chromium.new_context(locale="en-US", viewport={"width": 1400, "height": 1000}).new_page()
    secret = "alice private note " + secrets.token_hex(3)
    try:
        log_in(alice, login_app, "alice", PASSWORDS["alice"])
        wait_ready(alice)
        ask(alice, secret)
        thread_id = history_thread_id(alice, secret)
        log_in(bob, login_app, "bob", PASSWORDS["bob"])
        wait_ready(bob)

        url = f"{login_app.url}/project/thread/{thread_id}"
        own = alice.request.get(url)
        assert own.status == 200 and secret in own.text(), own.status
        other = bob.request.get(url)
        assert other.status in (401, 403, 404) and secret not in other.text(), (other.status, other.text()[:200])

        assert socket_accepts(login_app, cookie_header(alice), thread_id)
        # Bob's login connects without her thread and is refused with it: refused for the thread.
        assert socket_accepts(login_app, cookie_header(bob), "")
        assert not socket_accepts(login_app, cookie_header(bob), thread_id)

        alice.goto(f"{login_app.url}/thread/{thread_id}")
        expect(alice.locator(".step", has_text=secret).first).to_be_visible(timeout=30_000)
        bob.goto(f"{login_app.url}/thread/{thread_id}")
        # Chainlit's page says it could not resume the chat (or, were he let in, shows her message).
        refused = bob.get_by_text("Couldn't resume chat")
        expect(refused.or_(bob.locator(".step", has_text=secret)).first).to_be_visible(timeout=30_000)
        assert secret not in bob.locator("body").inner_text()
        expect(refused).to_be_visible()
        assert secret not in bob.content()
    finally:
        alice.context.close()
        bob.context.close()
