"""Nobody can lock a real user out, tried on the real app: two replicas (`chainlit run app.py`) on one
real PostgreSQL, login on, each client connecting from an address of its own on loopback (127.0.0.x:
the address the app sees). The counts are the deployment's: a guesser alternating between the
replicas gets the free failures once, not once per replica. The rules themselves are unit-tested in
tests/test_login_limits.py; the timing of the same cases is experiments/login_lockout.py."""

from __future__ import annotations

import secrets

import pytest

from core.auth import hash_password
from core.login_limits import DEVICE_COOKIE
from servers.app import backend_env, client_from, log_in, run_coroutine
from tests.fixtures_postgres import new_postgres_database

pytestmark = pytest.mark.slow

FREE_FAILURES = 3
ADDRESS_FREE_FAILURES = 6
PASSWORDS = {name: f"{name}-{secrets.token_hex(4)}" for name in
             ["alice", "bob", "mallory", *(f"student{number}" for number in range(10))]}


@pytest.fixture(scope="module")
def replicas(app_factory, paced_server, postgres_url):
    """Two replicas of the app on one fresh PostgreSQL database, with small limits."""
    database = run_coroutine(new_postgres_database(postgres_url))
    env = {
        "BACKENDS": "paced", **backend_env("paced", kind="openai", base_url=paced_server.base_url),
        "DATABASE_URL": database,
        "AUTH_USERS": ",".join(f"{name}:{hash_password(password, iterations=1000)}"
                               for name, password in PASSWORDS.items()),
        "CHAINLIT_AUTH_SECRET": secrets.token_urlsafe(32),
        "LOGIN_FREE_FAILURES": str(FREE_FAILURES), "LOGIN_MAX_DELAY_S": "60",
        "LOGIN_ADDRESS_FREE_FAILURES": str(ADDRESS_FREE_FAILURES), "LOGIN_ADDRESS_MAX_DELAY_S": "30",
    }
    first = app_factory({**env, "LAB_REPLICA_ID": "app-1"}, name="login-app-1")
    second = app_factory({**env, "LAB_REPLICA_ID": "app-2"}, name="login-app-2")
    return first.url, second.url


def attempt(url: str, address: str, name: str, password: str) -> int:
    """One attempt from a fresh browser (no cookies) at `address`; its HTTP status."""
    with client_from(address) as client:
        response = log_in(client, url, name, password)
    if response.status_code == 429:
        assert int(response.headers["Retry-After"]) >= 1
        assert "try again in" in response.json()["detail"]
    return response.status_code


def test_a_guesser_on_both_replicas_gets_the_free_failures_once_and_alice_logs_in_from_her_address(replicas):
    guesser, alice = "127.0.0.2", "127.0.0.3"
    answers = [attempt(replicas[n % 2], guesser, "alice", f"guess-{n}") for n in range(8)]
    assert answers == [401] * FREE_FAILURES + [429] * (8 - FREE_FAILURES)
    for url in replicas:  # alice, her right password, her own address, through either replica
        assert attempt(url, alice, "alice", PASSWORDS["alice"]) == 200
    assert [attempt(url, guesser, "alice", "guess-again") for url in replicas] == [429, 429]


def test_junk_from_a_shared_address_is_held_on_both_replicas_while_every_classmate_logs_in(replicas):
    nat = "127.0.0.4"
    junk = [attempt(replicas[n % 2], nat, f"junk-{secrets.token_hex(3)}", "x") for n in range(12)]
    assert junk == [401] * ADDRESS_FREE_FAILURES + [429] * (12 - ADDRESS_FREE_FAILURES)
    classmates = [attempt(replicas[n % 2], nat, f"student{n}", PASSWORDS[f"student{n}"]) for n in range(10)]
    assert classmates == [200] * 10
    # The junk sender's own name, wrong, from the same address: checked, like anyone's first tries.
    assert attempt(replicas[0], nat, "mallory", "wrong") == 401
    assert attempt(replicas[1], nat, f"junk-{secrets.token_hex(3)}", "x") == 429


def test_a_browser_that_logged_in_before_gets_in_while_a_classmate_guesses_its_name_from_the_same_address(replicas):
    nat = "127.0.0.5"
    with client_from(nat) as bobs_browser:
        first = log_in(bobs_browser, replicas[0], "bob", PASSWORDS["bob"])
        assert first.status_code == 200
        cookie = first.headers.get_list("set-cookie")
        assert any(c.startswith(DEVICE_COOKIE + "=") and "HttpOnly" in c for c in cookie), cookie
        bobs_browser.post(replicas[0] + "/logout")
        guesses = [attempt(replicas[n % 2], nat, "bob", f"guess-{n}") for n in range(6)]
        assert guesses == [401] * FREE_FAILURES + [429] * (6 - FREE_FAILURES)
        assert attempt(replicas[1], nat, "bob", PASSWORDS["bob"]) == 429  # another browser there waits
        assert log_in(bobs_browser, replicas[1], "bob", PASSWORDS["bob"]).status_code == 200  # bob's gets in
