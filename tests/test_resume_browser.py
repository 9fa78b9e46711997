"""A chat reopened from the history sidebar after the app restarted, in a real browser.

What a person saw comes back (a reply's figures, a blind round's columns,
still anonymous), a blind round left without a vote can still be voted on
and reveals its names, and the conversation goes on with the settings it was
left with and what each backend had: the single-backend chat and each
backend's own thread in rounds (checked on what the paced servers receive).
"""

from __future__ import annotations

import secrets
import time

import pytest
from playwright.sync_api import Page, expect

from core.auth import hash_password
from servers.app import backend_env, run_coroutine as run, stored
from servers.paced_openai import paced_pair
from tests.test_compare_browser import SNAPSHOT_JS, change_settings, send, watch_round
from tests.test_reports_browser import log_in, wait_ready

pytestmark = pytest.mark.slow

PASSWORD = "alice-" + secrets.token_hex(4)
NAMES = ("Left engine", "Right engine")


@pytest.fixture(scope="module")
def pair():
    with paced_pair("resume") as servers:
        yield servers


def finished_figures(page: Page):
    return page.locator('[data-testid="metrics"][data-state="completed"]')


def last_request(server, text: str, timeout_s: float = 60.0) -> dict:
    deadline = time.monotonic() + timeout_s
    while not server.requests() or server.requests()[-1]["last_user_text"] != text:
        assert time.monotonic() < deadline, f"{text!r} never reached the server"
        time.sleep(0.1)
    return server.requests()[-1]


def test_a_reopened_chat_shows_its_figures_and_rounds_votes_and_goes_on(
        page: Page, chromium, app_factory, pair, tmp_path_factory):
    left, right = pair
    env = {
        "BACKENDS": "left,right",
        **backend_env("left", kind="openai", base_url=left.base_url, label=NAMES[0]),
        **backend_env("right", kind="openai", base_url=right.base_url, label=NAMES[1]),
        "DEFAULT_SYSTEM_PROMPT": "none", "DEFAULT_COMPARE_BACKENDS": "left,right",
        "DATABASE_URL": f"sqlite:///{tmp_path_factory.mktemp('resume') / 'lab.db'}",
        "AUTH_USERS": f"alice:{hash_password(PASSWORD, iterations=1000)}",
        "CHAINLIT_AUTH_SECRET": secrets.token_urlsafe(32),
    }
    app = app_factory(env, name="chainlit-resume-before")
    log_in(page, app, "alice", PASSWORD)
    wait_ready(page)
    send(page, "first question")
    expect(finished_figures(page)).to_have_count(1, timeout=60_000)
    ttft_before = finished_figures(page).locator('[data-testid="metrics-ttft"] .font-mono').inner_text()
    change_settings(page, mode="Blind comparison (vote first)")
    send(page, "round question")
    before_vote = watch_round(page, 0)[-1]
    assert [column["text"] for column in before_vote["columns"]] != ["", ""]
    app.stop()  # no vote yet

    restarted = app_factory(env, name="chainlit-resume-after")
    page = chromium.new_context(locale="en-US", viewport={"width": 1400, "height": 1000}).new_page()
    try:
        log_in(page, restarted, "alice", PASSWORD)
        # Alice's blind round waits for its vote: her new chat says the backends' status waits too.
        expect(page.locator(".step", has_text="waits until you have voted").first).to_be_visible(timeout=180_000)
        if not page.locator("#thread-history").is_visible():
            page.locator("#sidebar-trigger-button").click()
        page.locator("#thread-history a", has_text="first question").first.click()
        expect(page.locator(".step", has_text="round question").first).to_be_visible(timeout=30_000)

        # The reply's figures and the round come back; the round is still anonymous.
        expect(finished_figures(page)).to_have_count(1, timeout=30_000)
        assert finished_figures(page).locator('[data-testid="metrics-ttft"] .font-mono').inner_text() == ttft_before
        expect(page.locator('[data-testid="compare"]')).to_have_count(1)
        reopened = page.evaluate(SNAPSHOT_JS, True)
        assert reopened["blind"] and not reopened["revealed"]
        assert [c["text"] for c in reopened["columns"]] == [c["text"] for c in before_vote["columns"]]
        assert not any(name in reopened["html"] for name in NAMES)

        # Voting on it now reveals it, in place.
        page.locator('[data-testid="vote-tie"]').click()
        expect(page.locator('[data-testid="vote-summary"]')).to_contain_text("Tie")
        expect(page.locator(".step", has_text="Vote recorded").last).to_contain_text(NAMES[0])
        revealed = page.evaluate(SNAPSHOT_JS, False)
        assert revealed["count"] == 1 and revealed["revealed"]
        assert sorted(c["backend"] for c in revealed["columns"]) == sorted(NAMES)
        [round_] = run(stored(env["DATABASE_URL"], "rounds", 10))
        assert [v.vote.outcome for v in run(stored(env["DATABASE_URL"], "votes")) if v.vote.round_id == round_.id] == ["tie"]

        # The conversation goes on, with the settings it was left with (blind): each backend's own
        # thread in a round ...
        send(page, "second round")
        for server in (left, right):
            # first question + the chat's reply, then the round: its prompt + this backend's own reply
            assert last_request(server, "second round")["messages_count"] == 5
        watch_round(page, 1)
        # (voted on first: a chat reply from one of its backends waits for its vote)
        page.locator('[data-testid="vote-tie"]').last.click()
        expect(page.locator('[data-testid="vote-summary"]').last).to_contain_text("Tie")
        # ... and the single-backend chat, without the round prompts.
        change_settings(page, mode="Chat with one backend")
        send(page, "back to chat")
        assert last_request(left, "back to chat")["messages_count"] == 3
    finally:
        page.context.close()
