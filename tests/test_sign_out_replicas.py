"""A logout or a teacher's /sign_out on one replica holds on the other: two replicas of the real app
(`chainlit run app.py`) on one real PostgreSQL, login on. The other replica learns it from the
database within `core.revocations.REFRESH_S`, and closes the chats it has open for that token.
One replica's own behaviour: tests/test_sign_out_app.py.
"""

from __future__ import annotations

import secrets
import time

import pytest
import requests

from core.auth import hash_password
from core.revocations import REFRESH_S
from servers.app import backend_env, run_coroutine
from tests.fixtures_app import closed_loopback_url
from tests.fixtures_postgres import new_postgres_database
from tests.test_sign_out_app import COMMAND_TIMEOUT_S, disconnected, open_chat, said, user_status

pytestmark = pytest.mark.slow

PASSWORDS = {name: f"{name}-{secrets.token_hex(4)}" for name in ("teacher", "student01", "student02", "student03")}
# The other replica reads the table every REFRESH_S; a loaded 2-core machine adds a few seconds.
WITHIN_S = REFRESH_S + 5.0


@pytest.fixture(scope="module")
def replicas(app_factory, postgres_url):
    env = {
        "BACKENDS": "down",
        **backend_env("down", kind="openai", base_url=closed_loopback_url(), label="Down", connect_timeout_s="1"),
        "DATABASE_URL": run_coroutine(new_postgres_database(postgres_url)),
        "AUTH_USERS": ",".join(f"{name}:{hash_password(password, iterations=1000)}"
                               for name, password in PASSWORDS.items()),
        "TEACHERS": "teacher", "CHAINLIT_AUTH_SECRET": secrets.token_urlsafe(32),
    }
    return (app_factory({**env, "LAB_REPLICA_ID": "app-1"}, name="sign-out-app-1"),
            app_factory({**env, "LAB_REPLICA_ID": "app-2"}, name="sign-out-app-2"))


def log_in(url: str, user: str) -> str:
    response = requests.post(f"{url}/login", files={"username": (None, user), "password": (None, PASSWORDS[user])},
                             timeout=60)
    assert response.status_code == 200, response.text[:300]
    return response.cookies["access_token"]


def refused_within(app, token: str, within_s: float) -> float | None:
    """Seconds until `token` is refused on `app` (None: not within `within_s`)."""
    started = time.monotonic()
    while time.monotonic() - started < within_s:
        if user_status(app, token) == 401 and user_status(app, token, "bearer") == 401:
            return time.monotonic() - started
        time.sleep(0.25)
    return None


def test_a_logout_on_one_replica_holds_on_the_other_and_closes_its_chat(replicas):
    first, second = replicas
    token = log_in(first.url, "student01")
    assert user_status(second, token) == 200  # control: one secret, so the token works on both
    chat = open_chat(second, token)
    try:
        assert requests.post(f"{first.url}/logout", cookies={"access_token": token}, timeout=30).ok
        assert user_status(first, token) == 401
        assert refused_within(second, token, WITHIN_S) is not None
        assert disconnected(chat, within_s=WITHIN_S)
    finally:
        chat.close()


def test_a_teacher_on_one_replica_signs_out_a_student_on_the_other(replicas):
    first, second = replicas
    signed_out, other = log_in(second.url, "student02"), log_in(second.url, "student03")
    chat = open_chat(second, signed_out)
    teacher = open_chat(first, log_in(first.url, "teacher"))
    try:
        answer = said(teacher.ask("/sign_out student02", COMMAND_TIMEOUT_S))
        assert "Signed out **student02**" in answer and "0 open chat(s) closed" in answer, answer
        assert refused_within(second, signed_out, WITHIN_S) is not None
        assert disconnected(chat, within_s=WITHIN_S)
    finally:
        chat.close()
        teacher.close()
    assert user_status(second, other) == 200 and user_status(first, other) == 200
