"""Logging out and a teacher's /sign_out, tried on the real app (`chainlit run app.py`, login on,
SQLite) the way a student would try to get around them: the same token again by cookie, by
bearer header, with a padding `=` added, on the chat socket (long-polling and a bare websocket),
and after the app restarted. Each refusal has its control: the same token worked just before,
and another person's token still works after. Across replicas on PostgreSQL:
tests/test_sign_out_replicas.py. The rule itself: tests/test_revocations.py.
"""

from __future__ import annotations

import secrets
import time

import pytest
import requests
import websocket

from core.auth import hash_password
from load.chainlit_client import SOCKET_PATH, ChainlitClient, ChatFailed
from servers.app import AppServer, backend_env
from tests.fixtures_app import closed_loopback_url

pytestmark = pytest.mark.slow

# A person per test: two logins of one person in one second get the very same token (whole seconds).
STUDENTS = [f"student{number:02d}" for number in range(1, 9)]
PASSWORDS = {name: f"{name}-{secrets.token_hex(4)}" for name in ("teacher", *STUDENTS)}
SECRET = secrets.token_urlsafe(32)
COMMAND_TIMEOUT_S = 60.0
CLOSED_WITHIN_S = 10.0


def app_env(database: str) -> dict[str, str]:
    return {
        "BACKENDS": "down",
        **backend_env("down", kind="openai", base_url=closed_loopback_url(), label="Down", connect_timeout_s="1"),
        "AUTH_USERS": ",".join(f"{name}:{hash_password(password, iterations=1000)}"
                               for name, password in PASSWORDS.items()),
        "TEACHERS": "teacher", "CHAINLIT_AUTH_SECRET": SECRET, "DATABASE_URL": database,
    }


@pytest.fixture(scope="module")
def login_app(app_factory, tmp_path_factory) -> AppServer:
    return app_factory(app_env(f"sqlite:///{tmp_path_factory.mktemp('sign-out')}/lab.db"), name="chainlit-sign-out")


def log_in(app: AppServer, user: str) -> str:
    """A fresh login's token."""
    response = requests.post(f"{app.url}/login", files={"username": (None, user), "password": (None, PASSWORDS[user])},
                             timeout=60)
    assert response.status_code == 200, response.text[:300]
    return response.cookies["access_token"]


def browser(token: str) -> requests.Session:
    """A cookie jar holding `token` as the login cookie, as a browser that kept it would."""
    session = requests.Session()
    session.cookies.set("access_token", token)
    return session


def user_status(app: AppServer, token: str, how: str = "cookie") -> int:
    """GET /user with `token` as the cookie or as a bearer header."""
    if how == "cookie":
        return requests.get(f"{app.url}/user", cookies={"access_token": token}, timeout=30).status_code
    return requests.get(f"{app.url}/user", headers={"Authorization": f"Bearer {token}"}, timeout=30).status_code


def threads_status(app: AppServer, token: str) -> int:
    return requests.post(f"{app.url}/project/threads", cookies={"access_token": token}, timeout=30,
                         json={"pagination": {"first": 5}, "filter": {}}).status_code


def every_status(app: AppServer, token: str) -> list[int]:
    return [user_status(app, token), user_status(app, token, "bearer"), threads_status(app, token),
            user_status(app, token + "="), user_status(app, token + "=", "bearer")]


def open_chat(app: AppServer, token: str) -> ChainlitClient:
    client = ChainlitClient(app.url, http=browser(token), record_events=True)
    client.open_chat(timeout_s=120)
    return client


def chat_refused(app: AppServer, token: str) -> bool:
    """Whether a chat socket with `token` as its cookie is refused (the page load is skipped: it would stop at /user)."""
    client = ChainlitClient(app.url, http=browser(token), load_page=False)
    try:
        client.open_chat(timeout_s=30)
    except ChatFailed:
        return True
    client.close()
    return False


def bare_websocket_refused(app: AppServer, token: str) -> bool:
    """Whether a websocket to the chat socket, with `token` as its cookie, is refused at its handshake."""
    url = app.url.replace("http://", "ws://") + SOCKET_PATH + "/?EIO=4&transport=websocket"
    try:
        connection = websocket.create_connection(url, cookie=f"access_token={token}", timeout=10)
    except websocket.WebSocketBadStatusException:
        return True
    connection.close()
    return False


def disconnected(client: ChainlitClient, within_s: float = CLOSED_WITHIN_S) -> bool:
    return client._wait(lambda: client.tracker.disconnected_at_s is not None, within_s)


def said(record) -> str:
    return "\n".join(record.notes)


def test_a_logged_out_token_works_nowhere_and_its_open_chat_is_closed(login_app: AppServer):
    token = log_in(login_app, "student01")
    assert every_status(login_app, token) == [200] * 5  # control: the token, in every spelling, works
    assert not bare_websocket_refused(login_app, token)
    chat = open_chat(login_app, token)
    try:
        assert requests.post(f"{login_app.url}/logout", cookies={"access_token": token}, timeout=30).ok
        assert disconnected(chat), "the chat opened with the token was not closed at logout"
    finally:
        chat.close()
    assert every_status(login_app, token) == [401] * 5
    assert chat_refused(login_app, token) and bare_websocket_refused(login_app, token)
    page = requests.get(f"{login_app.url}/", cookies={"access_token": token}, timeout=30)
    assert page.status_code == 200  # the login form still loads, and the browser is told to forget the token
    assert any(c.startswith("access_token=") and "Max-Age=0" in c for c in page.raw.headers.getlist("Set-Cookie"))
    time.sleep(1.1)  # tokens carry whole seconds: a login in the same second would get the very same token
    assert user_status(login_app, log_in(login_app, "student01")) == 200  # not locked out: a new login works


def test_a_token_logged_out_by_bearer_header_is_refused_too(login_app: AppServer):
    token = log_in(login_app, "student02")
    assert requests.post(f"{login_app.url}/logout", headers={"Authorization": f"Bearer {token}"}, timeout=30).ok
    assert every_status(login_app, token)[:3] == [401, 401, 401]


def test_a_student_cannot_sign_anyone_out_nor_learn_which_names_exist(login_app: AppServer):
    victim = log_in(login_app, "student04")
    student = open_chat(login_app, log_in(login_app, "student03"))
    try:
        for command in ("/sign_out student04", "/sign_out nobody-at-all", "/sign_out all"):
            assert said(student.ask(command, COMMAND_TIMEOUT_S)) == "Only a teacher may sign people out.", command
    finally:
        student.close()
    assert user_status(login_app, victim) == 200


def test_a_teacher_signs_out_one_student_and_another_student_stays(login_app: AppServer):
    signed_out, other = log_in(login_app, "student05"), log_in(login_app, "student06")
    signed_out_chat, other_chat = open_chat(login_app, signed_out), open_chat(login_app, other)
    teacher = open_chat(login_app, log_in(login_app, "teacher"))
    try:
        assert "No user is named" in said(teacher.ask("/sign_out nobody-at-all", COMMAND_TIMEOUT_S))
        assert user_status(login_app, signed_out) == 200  # control: nothing was signed out by that
        answer = said(teacher.ask("/sign_out student05", COMMAND_TIMEOUT_S))
        assert "Signed out **student05**" in answer and "1 open chat(s) closed" in answer, answer
        assert disconnected(signed_out_chat)
        assert not disconnected(other_chat, within_s=1.0) and not disconnected(teacher, within_s=0.1)
    finally:
        for client in (signed_out_chat, other_chat, teacher):
            client.close()
    assert every_status(login_app, signed_out)[:3] == [401, 401, 401]
    assert chat_refused(login_app, signed_out)
    assert every_status(login_app, other) == [200] * 5 and not chat_refused(login_app, other)
    time.sleep(1.1)  # tokens carry whole seconds: one issued in the second of the sign-out counts as before it
    assert user_status(login_app, log_in(login_app, "student05")) == 200


def test_sign_out_all_signs_out_everyone_but_the_teacher_who_asked(login_app: AppServer):
    students = {name: log_in(login_app, name) for name in ("student07", "student08")}
    teacher_token = log_in(login_app, "teacher")
    teacher = open_chat(login_app, teacher_token)
    try:
        answer = said(teacher.ask("/sign_out all", COMMAND_TIMEOUT_S))
        assert f"everyone but you ({len(STUDENTS)} people)" in answer, answer
        assert not disconnected(teacher, within_s=1.0)
    finally:
        teacher.close()
    assert {name: user_status(login_app, token) for name, token in students.items()} == dict.fromkeys(students, 401)
    assert user_status(login_app, teacher_token) == 200


def test_logouts_and_sign_outs_hold_after_the_app_restarts(app_factory, tmp_path):
    env = app_env(f"sqlite:///{tmp_path}/lab.db")
    first = app_factory(env, name="chainlit-sign-out-before")
    logged_out, signed_out, kept = (log_in(first, name) for name in ("student01", "student02", "student03"))
    assert requests.post(f"{first.url}/logout", cookies={"access_token": logged_out}, timeout=30).ok
    teacher = open_chat(first, log_in(first, "teacher"))
    try:
        assert "Signed out **student02**" in said(teacher.ask("/sign_out student02", COMMAND_TIMEOUT_S))
    finally:
        teacher.close()
    first.stop()
    second = app_factory(env, name="chainlit-sign-out-after")
    assert user_status(second, kept) == 200  # control: a token of before the restart still works there
    assert user_status(second, logged_out) == 401 and user_status(second, signed_out) == 401
    assert chat_refused(second, logged_out) and chat_refused(second, signed_out)
