"""A made-up user name takes as long to refuse as a real one, on the real app (`chainlit run app.py`,
login on, hashes of the real strength, `core.auth.ITERATIONS`): what a student timing `POST /login`
sees. Five wrong passwords sent at once for a real name queue for their hashing turns (the
control: the slowest takes several checks' time); five at once for made-up names must queue the
same way, not come back after one check's sleep. Each batch comes from an address of its own.
"""

from __future__ import annotations

import secrets
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from core.auth import HASH_WORKERS, hash_password
from servers.app import AppServer, backend_env, client_from, log_in
from tests.fixtures_app import closed_loopback_url

pytestmark = pytest.mark.slow

PASSWORDS = {"teacher": "teacher-" + secrets.token_hex(4), "student01": "student01-" + secrets.token_hex(4)}
AT_ONCE = 5
# Rounds of hashing five attempts of one address take: HashingTurns gives an address half the workers.
ROUNDS = -(-AT_ONCE // max(1, HASH_WORKERS // 2))


@pytest.fixture(scope="module")
def login_app(app_factory) -> AppServer:
    env = {
        "BACKENDS": "down",
        **backend_env("down", kind="openai", base_url=closed_loopback_url(), label="Down", connect_timeout_s="1"),
        "AUTH_USERS": ",".join(f"{name}:{hash_password(password)}" for name, password in PASSWORDS.items()),
        "TEACHERS": "teacher", "CHAINLIT_AUTH_SECRET": secrets.token_urlsafe(32),
        # No delay may answer before the hashing: the test times the checks themselves.
        "LOGIN_FREE_FAILURES": "100", "LOGIN_ADDRESS_FREE_FAILURES": "100",
    }
    return app_factory(env, name="chainlit-login-timing")


def attempt_s(app: AppServer, address: str, name: str) -> float:
    """Seconds one wrong password for `name` takes to be refused (from a fresh browser at `address`)."""
    with client_from(address) as client:
        started = time.perf_counter()
        response = log_in(client, app.url, name, "wrong-" + secrets.token_hex(4))
        elapsed = time.perf_counter() - started
    assert response.status_code == 401, response.text[:200]
    assert response.json()["detail"] == "wrong user name or password"
    return elapsed


def slowest_of_a_burst(app: AppServer, address: str, names: list[str]) -> float:
    with ThreadPoolExecutor(len(names)) as pool:
        return max(pool.map(lambda name: attempt_s(app, address, name), names))


def test_five_wrong_passwords_at_once_take_as_long_for_a_made_up_name_as_for_a_real_one(login_app: AppServer):
    one_check_s = min(attempt_s(login_app, "127.0.0.2", "student01") for _ in range(3))
    made_up = slowest_of_a_burst(login_app, "127.0.0.3", [f"nobody-{n}" for n in range(AT_ONCE)])
    real = slowest_of_a_burst(login_app, "127.0.0.4", ["student01"] * AT_ONCE)
    # Control: the real name's attempts queued for their turns (else nothing here is measured).
    assert ROUNDS == 1 or real > 0.6 * ROUNDS * one_check_s, (real, one_check_s, ROUNDS)
    assert made_up >= 0.6 * real, (made_up, real, one_check_s)
