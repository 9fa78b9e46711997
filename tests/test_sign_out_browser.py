"""A signed-out student in a real browser (chromium): the teacher's /sign_out closes the student's
chat, the page then offers the sign-in form by itself (the revoked cookie does not keep them off
it), and signing in again gives a working chat. The refusals themselves: tests/test_sign_out_app.py.
"""

from __future__ import annotations

import secrets
import time

import pytest
import requests
from playwright.sync_api import expect

from core.auth import hash_password
from servers.app import backend_env
from tests.test_reports_browser import log_in, wait_ready
from tests.test_sign_out_app import COMMAND_TIMEOUT_S, open_chat, said

pytestmark = pytest.mark.slow

PASSWORDS = {"teacher": "teacher-" + secrets.token_hex(4), "student01": "student01-" + secrets.token_hex(4)}


def token_of(app, user: str) -> str:
    response = requests.post(f"{app.url}/login", files={"username": (None, user), "password": (None, PASSWORDS[user])},
                             timeout=60)
    assert response.status_code == 200, response.text[:300]
    return response.cookies["access_token"]


def test_a_signed_out_student_gets_the_sign_in_form_and_in_again(chromium, app_factory, paced_server):
    app = app_factory({
        "BACKENDS": "paced", **backend_env("paced", kind="openai", base_url=paced_server.base_url),
        "AUTH_USERS": ",".join(f"{name}:{hash_password(password, iterations=1000)}"
                               for name, password in PASSWORDS.items()),
        "TEACHERS": "teacher", "CHAINLIT_AUTH_SECRET": secrets.token_urlsafe(32),
    }, name="sign-out-browser")
    student = chromium.new_context(locale="en-US", viewport={"width": 1400, "height": 1000}).new_page()
    try:
        log_in(student, app, "student01", PASSWORDS["student01"])
        wait_ready(student)
        teacher = open_chat(app, token_of(app, "teacher"))
        try:
            assert "1 open chat(s) closed" in said(teacher.ask("/sign_out student01", COMMAND_TIMEOUT_S))
        finally:
            teacher.close()
        expect(student.locator("#email")).to_be_visible(timeout=30_000)  # by itself, no reload
        time.sleep(1.1)  # tokens carry whole seconds: a login in the second of the sign-out counts as before it
        log_in(student, app, "student01", PASSWORDS["student01"])
        wait_ready(student)
    finally:
        student.context.close()
