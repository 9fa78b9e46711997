"""A replica killed mid-reply, seen in real browsers through the real nginx (scripts/lecture_hall.sh):
the page of a student on that replica loses its socket and reconnects through the proxy to the
live replica, which resumes the same chat with the earlier reply and the cut one marked
interrupted (also when reopened from the history), and a student on the other replica sees their
reply stream to its end.
"""

from __future__ import annotations

import os
import secrets
import signal

import pytest
import requests
from playwright.sync_api import Page, expect

from core.replica import REPLICA_HEADER
from tests.fixtures_hall import PASSWORDS, Hall
from tests.test_reports_browser import log_in, wait_ready

pytestmark = pytest.mark.slow
ASSISTANT = '.step[data-step-type="assistant_message"]'


def route_to(hall: Hall, replica: str, tries: int = 64) -> str:
    """A `lab_route` cookie value that nginx hashes to `replica`."""
    for _ in range(tries):
        value = secrets.token_hex(16)
        answer = requests.get(hall.url + "/auth/config", cookies={"lab_route": value}, timeout=10)
        if answer.headers[REPLICA_HEADER] == replica:
            return value
    raise AssertionError(f"no route cookie led to {replica} in {tries} tries")


def student_on(chromium, hall: Hall, replica: str, user: str) -> Page:
    context = chromium.new_context(locale="en-US", viewport={"width": 1400, "height": 1000})
    context.add_cookies([{"name": "lab_route", "value": route_to(hall, replica), "url": hall.url}])
    page = context.new_page()
    log_in(page, hall, user, PASSWORDS[user])
    wait_ready(page)
    return page


def start_reply(page: Page, text: str) -> None:
    """Send `text` and wait until its reply shows its first words."""
    before = page.locator(ASSISTANT).count()
    page.locator("#chat-input").fill(text)
    page.locator("#chat-submit").click()
    expect(page.locator(ASSISTANT)).to_have_count(before + 1, timeout=30_000)
    expect(page.locator(ASSISTANT).last).to_contain_text("w1", timeout=30_000)  # the stand-in says w1 w2 ...


def test_a_replica_killed_mid_reply_in_the_browser(chromium, hall: Hall):
    alice = student_on(chromium, hall, "app-1", "alice")
    bob = student_on(chromium, hall, "app-2", "bob")
    try:
        start_reply(alice, "Browser before the fault")
        expect(alice.locator('[data-testid="metrics"][data-state="completed"]')).to_have_count(1, timeout=60_000)
        start_reply(alice, "Browser during the fault")
        start_reply(bob, "Browser on the live replica")
        reconnected = []
        alice.on("websocket", lambda socket: reconnected.append(socket))
        os.kill(hall.replicas["app-1"].pid, signal.SIGKILL)
        # Alice's page loses its socket and opens a new one through nginx, to app-2, which resumes the
        # same chat there: the cut reply is marked interrupted in place, the earlier one is kept.
        interrupted = alice.locator(ASSISTANT, has_text="Interrupted: the app process answering this (replica app-1)")
        expect(interrupted).to_have_count(1, timeout=60_000)
        assert reconnected and all(socket.url.startswith(hall.url.replace("http", "ws")) for socket in reconnected)
        expect(alice.locator(ASSISTANT, has_text="pacedend")).to_have_count(1)
        # Bob's reply on app-2 streamed to its end.
        expect(bob.locator('[data-testid="metrics"][data-state="completed"]')).to_have_count(1, timeout=60_000)
        # Alice reopens her chat (through the proxy, now on app-2): both questions, the first reply,
        # and the cut one marked interrupted.
        alice.reload()
        wait_ready(alice)
        if not alice.locator("#thread-history").is_visible():
            alice.locator("#sidebar-trigger-button").click()
        alice.locator("#thread-history a", has_text="Browser before the fault").first.click()
        expect(alice.locator(".step", has_text="Browser during the fault").first).to_be_visible(timeout=30_000)
        expect(alice.locator(ASSISTANT, has_text="Interrupted: the app process answering this (replica app-1)")
               ).to_have_count(1, timeout=30_000)
        expect(alice.locator('[data-testid="metrics"][data-state="completed"]')).to_have_count(1, timeout=30_000)
    finally:
        alice.context.close()
        bob.context.close()
