"""Trust at the edges, in a real browser: a blind round stays blind everywhere, and a database that
fails under the running app loses nothing and leaks nothing.

Two paced OpenAI-protocol servers stand in for two engines with distinctive names, labels and
addresses. Every socket.io frame the page receives after the blind round starts is scanned for
each of them (except the settings panel's list of configured backends, sent again on resume:
it names no column), and so are the steps that appear, the history list and the thread as the
REST routes return them.
"""

from __future__ import annotations

import json
import re
import secrets
import time
import urllib.request

import pytest
from playwright.sync_api import Page, expect

from core.auth import hash_password
from store import normalise_url
from servers.app import AppServer, backend_env, run_coroutine, stored
from servers.paced_openai import paced_pair
from tests.browser_frames import collect_frames, drain_frames
from tests.fixtures_postgres import PostgresCluster, new_postgres_database
from tests.test_compare_browser import SNAPSHOT_JS, change_settings, send, watch_round
from tests.test_reports_browser import log_in, wait_ready, wait_for_history_title
from tests.test_store_faults import unwritable

pytestmark = [pytest.mark.browser, pytest.mark.slow]

PASSWORD = "alice-" + secrets.token_hex(4)
NAMES = {"alpha_engine": "Alpha Engine", "beta_engine": "Beta Engine"}
WAITS = "waits until you have voted"
SQL_WORDS = ("INSERT INTO", "SELECT ", "[SQL", "sqlalchemy", "asyncpg", "aiosqlite", "parameters", "sqlite3.")


@pytest.fixture(scope="module")
def engines():
    with paced_pair("trust", tokens=(12, 9)) as servers:
        yield servers


def app_env(engines, database_url: str, **more: str) -> dict[str, str]:
    left, right = engines
    return {
        "BACKENDS": ",".join(NAMES),
        **backend_env("alpha_engine", kind="openai", base_url=left.base_url, label=NAMES["alpha_engine"]),
        **backend_env("beta_engine", kind="openai", base_url=right.base_url, label=NAMES["beta_engine"]),
        "DEFAULT_SYSTEM_PROMPT": "none", "DEFAULT_COMPARE_BACKENDS": ",".join(NAMES),
        "DATABASE_URL": database_url,
        "AUTH_USERS": f"alice:{hash_password(PASSWORD, iterations=1000)}",
        "CHAINLIT_AUTH_SECRET": secrets.token_urlsafe(32),
        **more,
    }


def secret_words(engines) -> list[str]:
    left, right = engines
    return [*NAMES, *NAMES.values(), "paced-test-model",
            *(re.sub(r"^https?://", "", server.root_url) for server in (left, right))]


def leaks(texts: list[str], words: list[str]) -> list[str]:
    """Each (word, excerpt) found, ignoring the settings panel's list of backends (it names no column)."""
    found = []
    for text in texts:
        if text.startswith('42["chat_settings"'):
            continue
        lowered = text.lower()
        for word in words:
            at = lowered.find(word.lower())
            if at >= 0:
                found.append(f"{word!r} in {text[max(0, at - 80):at + 80]!r}")
    return found


def steps_text_after(page: Page, count_before: int) -> list[str]:
    return page.evaluate("(n) => [...document.querySelectorAll('.step')].slice(n).map(s => s.innerText)", count_before)


def lab_state(app: AppServer) -> dict:
    with urllib.request.urlopen(f"{app.url}/lab/state", timeout=10) as response:
        return json.loads(response.read())


def wait_outbox_empty(app: AppServer, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while (waiting := lab_state(app)["outbox"]["waiting"]):
        assert time.monotonic() < deadline, f"{waiting} rows still wait to be written"
        time.sleep(0.2)


def type_command(page: Page, command: str) -> None:
    send(page, command)


def blind_round_parts(thread: dict, prompt: str) -> list[str]:
    """What a reopened thread holds of the blind round and after it: its steps from the round's
    prompt on, and every element of a blind round not yet revealed, as JSON."""
    steps = sorted(thread.get("steps") or [], key=lambda step: step.get("createdAt") or "")
    start = next((index for index, step in enumerate(steps) if step.get("output") == prompt), len(steps))
    elements = [element for element in thread.get("elements") or []
                if isinstance(element.get("props"), dict) and element["props"].get("blind")
                and not element["props"].get("revealed")]
    assert elements, "the blind round's element was not kept"
    return [json.dumps(part, ensure_ascii=False) for part in (*steps[start:], *elements)]


def blind_frames(frames: list[str], prompt: str) -> list[str]:
    """The socket.io frames about the blind round: its element (not revealed), the resumed thread's
    parts from the round on (`blind_round_parts`), and every other frame once the round's prompt
    has been sent again."""
    chosen, seen_prompt = [], False
    for frame in frames:
        body = frame.lstrip("0123456789")
        try:
            event, *args = json.loads(body) if body.startswith("[") else (None,)
        except ValueError:
            event, args = None, []
        if event == "resume_thread" and args:
            chosen += blind_round_parts(args[0], prompt)
            continue
        seen_prompt = seen_prompt or prompt in frame
        props = args[0].get("props") if event in ("element", "lab_live") and args and isinstance(args[0], dict) \
            else None
        if (isinstance(props, dict) and props.get("blind") and not props.get("revealed")) or (
                seen_prompt and event not in ("element", "lab_live", "chat_settings")):
            chosen.append(frame)
    return chosen


def test_a_blind_round_sends_nothing_that_names_a_column_until_the_vote(
        page: Page, chromium, app_factory, engines, tmp_path):
    database = tmp_path / "lab.db"
    env = app_env(engines, f"sqlite:///{database}", DEFAULT_MODE="compare")
    app = app_factory(env, name="chainlit-trust-blind")
    words = secret_words(engines)
    frames = collect_frames(page)
    log_in(page, app, "alice", PASSWORD)
    wait_ready(page)

    # Before any blind round: a compare round (names shown, as they may be) and the engine panel open.
    send(page, "A first, open comparison.")
    watch_round(page, 0)
    send(page, "/engines")
    expect(page.locator('[data-testid="engines"]').first).to_be_visible(timeout=30_000)
    change_settings(page, mode="Blind comparison (vote first)")
    # The panel closes at its next tick, sending no engine's figures (it names every engine).
    expect(page.get_by_text("off in blind mode").first).to_be_visible(timeout=10_000)
    mark = len(drain_frames(page, frames))
    steps_before = page.locator(".step").count()

    # A blind round while the database cannot be written, then every command.
    with unwritable(database):
        send(page, "Tell me about the sea.")
        round_ = watch_round(page, 1)[-1]
        assert round_["blind"] and not round_["revealed"]
        expect(page.locator(".step", has_text="Not saved yet").last).to_be_visible(timeout=30_000)
        assert lab_state(app)["outbox"]["waiting"] > 0
        for command in ("/stats", "/replay", "/leaderboard", "/status", "/bench", "/engines"):
            before = page.locator(".step", has_text=WAITS).count()
            type_command(page, command)
            expect(page.locator(".step", has_text=WAITS)).to_have_count(before + 1, timeout=30_000)
        received = drain_frames(page, frames, since=mark, until_task_end=True)
        assert not leaks(received, words), leaks(received, words)
        assert not leaks(received, SQL_WORDS), leaks(received, SQL_WORDS)
        assert not leaks(steps_text_after(page, steps_before), words)

    # The database is back: every row kept meanwhile is written, and still nothing names a column:
    # not the history list, not the thread as the browser fetches it, not the chat reopened.
    wait_outbox_empty(app)
    wait_for_history_title(page, "A first, open comparison.")
    href = page.locator("#thread-history a", has_text="A first, open comparison.").first.get_attribute("href")
    thread_id = href.rstrip("/").rsplit("/", 1)[-1]
    listing = page.request.post(f"{app.url}/project/threads",
                                data={"pagination": {"first": 20, "cursor": None}, "filter": {}})
    assert listing.ok
    (listed,) = [entry for entry in listing.json()["data"] if entry["id"] == thread_id]
    assert not leaks(blind_round_parts(listed, "Tell me about the sea."), words)
    thread = page.request.get(f"{app.url}/project/thread/{thread_id}")
    assert thread.ok and "Tell me about the sea." in thread.text()
    assert not leaks(blind_round_parts(thread.json(), "Tell me about the sea."), words)
    metadata = thread.json().get("metadata") or {}
    metadata = json.loads(metadata) if isinstance(metadata, str) else metadata
    assert metadata.get("lab") is None and not {"threads", "rounds", "history"} & set(metadata), metadata

    reopened = chromium.new_context(locale="en-US", viewport={"width": 1400, "height": 1000}).new_page()
    try:
        reopened_frames = collect_frames(reopened)
        log_in(reopened, app, "alice", PASSWORD)
        # Alice's blind round waits for its vote: a new chat of hers says its backends' status waits too.
        expect(reopened.locator(".step", has_text=WAITS).first).to_be_visible(timeout=180_000)
        reopened.goto(f"{app.url}/thread/{thread_id}")
        expect(reopened.locator(".step", has_text="Tell me about the sea.").first).to_be_visible(timeout=30_000)
        shown_waits = reopened.locator(".step", has_text=WAITS).count()  # the earlier ones, in the history
        type_command(reopened, "/stats")  # the rule came back with the chat: it still waits
        expect(reopened.locator(".step", has_text=WAITS)).to_have_count(shown_waits + 1, timeout=30_000)
        resumed = drain_frames(reopened, reopened_frames, until_task_end=True)
        snapshot = reopened.evaluate(SNAPSHOT_JS, True)
        assert snapshot["blind"] and not snapshot["revealed"]
        assert not leaks(blind_frames(resumed, "Tell me about the sea."), words)

        # The vote reveals the names, and every command works again.
        reopened.locator('[data-testid="vote-A"]').last.click()
        expect(reopened.locator(".step", has_text="Vote recorded").last).to_contain_text(NAMES["alpha_engine"][:5])
        type_command(reopened, "/stats")
        stats = reopened.locator(".step", has_text="This chat's replies").last
        expect(stats).to_be_visible(timeout=30_000)
        expect(stats).to_contain_text("blind")
    finally:
        reopened.context.close()

    # Nothing was lost: the blind round's replies, their columns and the chat history's steps.
    replies = run_coroutine(stored(env["DATABASE_URL"], "replies_for_thread", thread_id))
    blind = [reply for reply in replies if reply.mode == "blind"]
    assert sorted(reply.backend for reply in blind) == sorted(NAMES)
    rounds = run_coroutine(stored(env["DATABASE_URL"], "rounds", 10, thread_id))
    (blind_round,) = [round_ for round_ in rounds if round_.mode == "blind"]
    assert all(round_.columns for round_ in rounds)
    assert all(column.reply_id for round_ in rounds for column in round_.columns)
    # Each column of the blind round points at its own stored reply.
    assert sorted(column.reply_id for column in blind_round.columns) == sorted(reply.id for reply in blind)


def test_postgresql_stopped_under_the_app_loses_no_reply_and_shows_no_sql(page: Page, app_factory, engines):
    cluster = PostgresCluster().start()
    try:
        url = run_coroutine(new_postgres_database(cluster.url))
        env = app_env(engines, url, DEFAULT_MODE="chat", DEFAULT_BACKEND="alpha_engine")
        app = app_factory(env, name="chainlit-trust-postgres")
        frames = collect_frames(page)
        log_in(page, app, "alice", PASSWORD)
        wait_ready(page)
        send(page, "Before the outage.")
        expect(page.locator('[data-testid="metrics"][data-state="completed"]')).to_have_count(1, timeout=60_000)
        mark = len(drain_frames(page, frames))

        cluster.stop()
        for number, prompt in enumerate(("During the outage, one.", "During the outage, two."), 2):
            send(page, prompt)
            expect(page.locator('[data-testid="metrics"][data-state="completed"]')).to_have_count(number,
                                                                                                   timeout=60_000)
            expect(page.locator(".step", has_text="Not saved yet")).to_have_count(number - 1, timeout=30_000)
        received = drain_frames(page, frames, since=mark, until_task_end=True)
        assert not leaks(received, SQL_WORDS), leaks(received, SQL_WORDS)
        assert lab_state(app)["outbox"]["waiting"] >= 2

        cluster.start()
        wait_outbox_empty(app)
        thread_rows = run_coroutine(stored(normalise_url(url), "replies", 10))
        assert sorted(reply.prompt for reply in thread_rows) == sorted(
            ["Before the outage.", "During the outage, one.", "During the outage, two."])
        # Chainlit's history too: the reopened chat shows the messages sent during the outage.
        page.reload()
        wait_ready(page)
        wait_for_history_title(page, "Before the outage.")
        page.locator("#thread-history a", has_text="Before the outage.").first.click()
        expect(page.locator(".step", has_text="During the outage, two.").first).to_be_visible(timeout=30_000)
    finally:
        cluster.remove()
