"""Who may read GET /lab/state, what X-Lab-Replica says, and the page's own headers, on the real app.

The app runs with login on (alice is a teacher, bob a student) and no LAB_REPLICA_ID. Requests
are sent as an attacker would: from loopback with a forwarding header (what a proxy or tunnel on
the app's machine adds, or what a client writes itself), from another address (a second loopback
address, 127.0.0.2, stands for another machine), with a student's login, with a forged one.
"""

from __future__ import annotations

import http.client
import json
import os
import secrets
import socket

import jwt
import pytest
import requests

from core.auth import hash_password
from servers.app import AppServer, backend_env
from tests.fixtures_app import closed_loopback_url
from ui.lab_state import forwarded

pytestmark = [pytest.mark.slow]

PASSWORDS = {"alice": "alice-" + secrets.token_hex(4), "bob": "bob-" + secrets.token_hex(4)}
SECRET = secrets.token_urlsafe(32)
ELSEWHERE = "127.0.0.2"  # a client address that is not the app's own machine's loopback name
FORWARDING = [{"X-Forwarded-For": "203.0.113.9"}, {"X-Forwarded-For": "127.0.0.1"}, {"Forwarded": "for=127.0.0.1"},
              {"X-Real-IP": "127.0.0.1"}, {"X-Forwarded-Host": "lab.example.edu"}, {"X-Forwarded-Proto": "https"},
              {"Via": "1.1 tunnel"}, {"CF-Connecting-IP": "203.0.113.9"}, {"True-Client-IP": "203.0.113.9"},
              {"X-Client-IP": "203.0.113.9"}, {"X-Forwarded-Anything": "1"}]


@pytest.fixture(scope="module")
def login_app(app_factory) -> AppServer:
    users = ",".join(f"{name}:{hash_password(password, iterations=1000)}" for name, password in PASSWORDS.items())
    env = {
        "BACKENDS": "down",
        **backend_env("down", kind="openai", base_url=closed_loopback_url(), label="Down", connect_timeout_s="1"),
        "AUTH_USERS": users, "TEACHERS": "alice", "CHAINLIT_AUTH_SECRET": SECRET,
        "LAB_REPLICA_ID": "",  # unset: the process draws its own name
    }
    return app_factory(env, name="chainlit-lab-state")


def token_of(app: AppServer, user: str) -> str:
    response = requests.post(f"{app.url}/login", data={"username": user, "password": PASSWORDS[user]}, timeout=30)
    assert response.status_code == 200, response.text[:300]
    return response.cookies["access_token"]


def lab_state(app: AppServer, *, source: str = "127.0.0.1", headers: dict | None = None) -> tuple[int, dict]:
    """GET /lab/state from `source` (a local address this client binds), with `headers`."""
    host, port = app.url.removeprefix("http://").split(":")
    connection = http.client.HTTPConnection(host, int(port), timeout=10, source_address=(source, 0))
    try:
        connection.request("GET", "/lab/state", headers=headers or {})
        response = connection.getresponse()
        return response.status, json.loads(response.read())
    finally:
        connection.close()


def cookie(token: str) -> dict:
    return {"Cookie": f"access_token={token}"}


def test_forwarding_headers_of_any_proxy_or_tunnel_are_recognised():
    for header in FORWARDING:
        assert forwarded(header), header
    assert not forwarded({"Host": "127.0.0.1:8000", "User-Agent": "curl", "Cookie": "x=1", "Accept": "*/*"})


def test_the_apps_own_machine_reads_its_state_without_a_login(login_app: AppServer):
    status, state = lab_state(login_app)
    assert status == 200 and state["rss_mb"] > 0


@pytest.mark.parametrize("header", FORWARDING, ids=lambda header: next(iter(header)))
def test_a_forwarded_request_from_loopback_is_refused(login_app: AppServer, header: dict):
    status, answer = lab_state(login_app, headers=header)
    assert status == 403 and "teacher's login" in answer["error"] and "own machine" in answer["error"], answer


def test_a_request_from_another_address_is_refused(login_app: AppServer):
    status, answer = lab_state(login_app, source=ELSEWHERE)
    assert status == 403, answer


def test_a_students_login_is_refused_from_elsewhere_or_through_a_proxy(login_app: AppServer):
    student = token_of(login_app, "bob")
    assert lab_state(login_app, source=ELSEWHERE, headers=cookie(student))[0] == 403
    assert lab_state(login_app, headers={**cookie(student), "X-Forwarded-For": "203.0.113.9"})[0] == 403
    assert lab_state(login_app, source=ELSEWHERE, headers={"Authorization": f"Bearer {student}"})[0] == 403


def test_a_teachers_login_is_accepted_from_elsewhere_and_through_a_proxy(login_app: AppServer):
    teacher = token_of(login_app, "alice")
    for source, headers in ((ELSEWHERE, cookie(teacher)), ("127.0.0.1", {**cookie(teacher), "X-Forwarded-For": "203.0.113.9"}),
                            (ELSEWHERE, {"Authorization": f"Bearer {teacher}"})):
        status, state = lab_state(login_app, source=source, headers=headers)
        assert status == 200 and "outbox" in state, (source, headers, state)


def test_a_forged_or_altered_teacher_token_is_refused(login_app: AppServer):
    teacher = token_of(login_app, "alice")
    claims = jwt.decode(teacher, SECRET, algorithms=["HS256"])
    forged = jwt.encode(claims, "not-the-apps-secret-" + secrets.token_hex(8), algorithm="HS256")
    promoted = jwt.encode({**jwt.decode(token_of(login_app, "bob"), options={"verify_signature": False}),
                           "identifier": "alice"}, "a-guessed-secret-" + secrets.token_hex(16), algorithm="HS256")
    unsigned = jwt.encode({**claims}, None, algorithm="none")
    for token in (forged, promoted, unsigned, teacher[:-6] + "AAAAAA", "garbage"):
        assert lab_state(login_app, source=ELSEWHERE, headers=cookie(token))[0] == 403, token


def test_every_answer_names_the_replica_by_a_random_id_never_host_or_pid(login_app: AppServer):
    status, state = lab_state(login_app)
    assert status == 200
    names = {requests.get(login_app.url + path, timeout=10).headers["X-Lab-Replica"]
             for path in ("/", "/auth/config", "/lab/state", "/project/settings?language=en-US")}
    assert names == {state["replica"]}, (names, state["replica"])
    replica = state["replica"]
    assert replica.startswith("replica-") and len(replica) == len("replica-") + 8, replica
    for revealing in (socket.gethostname(), str(state["pid"]), str(os.getpid())):
        assert revealing not in replica, (revealing, replica)


def test_every_answer_carries_the_image_policy_and_the_referrer_policy(login_app: AppServer):
    for path in ("/", "/login", "/auth/config"):
        answer = requests.get(login_app.url + path, timeout=10)
        assert answer.headers["Content-Security-Policy"] == (
            "img-src 'self' data: blob:; media-src 'self' data: blob:; frame-ancestors 'self'"), path
        assert answer.headers["Referrer-Policy"] == "same-origin", path
