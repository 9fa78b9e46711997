"""The login limits in a real browser: the login page sends the device cookie with its sign-in, so a
person whose name a classmate behind the same address is guessing still gets in from the browser
where they logged in before; a fresh browser there is told to wait, in the page's words."""

from __future__ import annotations

import secrets
import time

import pytest
from playwright.sync_api import Page, expect

from core.auth import hash_password
from core.login_limits import DEVICE_COOKIE
from servers.app import backend_env, client_from
from servers.app import log_in as post_login
from tests.test_reports_browser import log_in, wait_ready

pytestmark = pytest.mark.slow

PASSWORD = "alice-" + secrets.token_hex(4)


def fill_sign_in(page: Page, url: str, name: str, password: str) -> None:
    page.goto(url)
    page.locator("#email").fill(name)
    page.locator("#password").fill(password)


def test_a_guessed_name_logs_in_from_its_own_browser_and_a_fresh_browser_at_that_address_is_told_to_wait(
        chromium, app_factory, paced_server):
    app = app_factory({
        "BACKENDS": "paced", **backend_env("paced", kind="openai", base_url=paced_server.base_url),
        "AUTH_USERS": f"alice:{hash_password(PASSWORD, iterations=1000)}",
        "CHAINLIT_AUTH_SECRET": secrets.token_urlsafe(32), "LOGIN_FREE_FAILURES": "3",
    }, name="login-limits-browser")
    alice = chromium.new_context(locale="en-US", viewport={"width": 1400, "height": 1000}).new_page()
    stranger = chromium.new_context(locale="en-US", viewport={"width": 1400, "height": 1000}).new_page()
    try:
        log_in(alice, app, "alice", PASSWORD)
        wait_ready(alice)
        device = [cookie for cookie in alice.context.cookies() if cookie["name"] == DEVICE_COOKIE]
        assert device and device[0]["httpOnly"], alice.context.cookies()
        alice.context.clear_cookies(name="access_token")  # signed out; the device cookie stays
        for page in (alice, stranger):  # both at the sign-in form, her password typed, not yet sent
            fill_sign_in(page, app.url, "alice", PASSWORD)

        # A classmate behind the same address (the browsers connect from 127.0.0.1) guesses her
        # password, waiting out each delay, until the next wait is 8 s or more.
        answers = []
        with client_from("127.0.0.1") as classmate:
            while True:
                response = post_login(classmate, app.url, "alice", f"guess-{len(answers)}")
                answers.append(response.status_code)
                if response.status_code == 429:
                    if int(response.headers["Retry-After"]) >= 8:
                        break
                    time.sleep(int(response.headers["Retry-After"]))
        assert answers[:4] == [401, 401, 401, 429], answers

        stranger.get_by_role("button", name="Sign In").click()  # her password, from a browser she never used
        expect(stranger.get_by_role("alert")).to_contain_text("Too many sign-in attempts", timeout=30_000)
        expect(stranger.get_by_role("alert")).to_contain_text("the wait grows")
        alice.get_by_role("button", name="Sign In").click()  # her own browser: in
        wait_ready(alice)
    finally:
        alice.context.close()
        stranger.context.close()
