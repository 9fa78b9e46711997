"""Storage faults under the running app, on a real PostgreSQL, spoken to as a browser does
(load/chainlit_client.py: Chainlit's own socket.io protocol, no browser needed).

- Steps forged with a value of every wrong type, an oversized text and a reply holding NUL stop
  nothing: each is stored cleaned (or, for the text, not at all), nothing waits and nothing is
  set aside, and another person's replies right after are in the database within seconds.
- A database down when the app starts: the chat works, and once it is up, without a restart, the
  replies and the chat history kept meanwhile are written, the chat under its owner's name in
  their history list.
- A hung database (the server paused) holds no reply, and loses or doubles nothing once it runs.
"""

from __future__ import annotations

import json
from pathlib import Path
import secrets
import time
import urllib.request

import pytest
import requests

from core.auth import hash_password
from load.chainlit_client import ChainlitClient
from servers.app import AppServer, backend_env, run_coroutine
from servers.paced_openai import PacedServer
from tests.fixtures_postgres import PostgresCluster, new_postgres_database

pytestmark = pytest.mark.slow

REPLY_TIMEOUT_S = 60.0
PASSWORDS = {"alice": "alice-" + secrets.token_hex(4), "bob": "bob-" + secrets.token_hex(4)}


@pytest.fixture(scope="module")
def cluster():
    """A cluster of this module's own: stopping and pausing it must not touch the other tests' database."""
    cluster = PostgresCluster().start()
    yield cluster
    cluster.remove()


def app_env(paced_server: PacedServer, database: str, **more: str) -> dict[str, str]:
    return {"BACKENDS": "paced", "DEFAULT_SYSTEM_PROMPT": "none", "DATABASE_URL": database,
            **backend_env("paced", kind="openai", base_url=paced_server.base_url, label="Paced"), **more}


def with_logins(paced_server: PacedServer, database: str) -> dict[str, str]:
    users = ",".join(f"{name}:{hash_password(password, iterations=1000)}" for name, password in PASSWORDS.items())
    return app_env(paced_server, database, AUTH_USERS=users, CHAINLIT_AUTH_SECRET=secrets.token_urlsafe(32))


def log_in(app: AppServer, user: str) -> requests.Session:
    browser = requests.Session()
    response = browser.post(app.url + "/login", data={"username": user, "password": PASSWORDS[user]}, timeout=30)
    assert response.status_code == 200, response.text[:300]
    return browser


def lab_state(app: AppServer) -> dict:
    with urllib.request.urlopen(f"{app.url}/lab/state", timeout=10) as response:
        return json.loads(response.read())


def nothing_set_aside(app: AppServer) -> None:
    """No row was set aside as refused; else the dead-letter entries' reasons, in the failure."""
    outbox = lab_state(app)["outbox"]
    reasons = []
    for path in outbox["dead_letter_files"]:
        for line in Path(path).read_text().splitlines():
            entry = json.loads(line)
            reasons.append({key: value for key, value in entry.items() if key != "entry"})
    assert outbox["set_aside"] == 0, reasons


def wait_outbox_empty(app: AppServer, timeout_s: float) -> float:
    """Seconds until nothing waits to be written."""
    started = time.monotonic()
    while (outbox := lab_state(app)["outbox"])["waiting"]:
        assert time.monotonic() - started < timeout_s, f"rows still wait: {outbox}"
        time.sleep(0.2)
    return time.monotonic() - started


def query(database: str, sql: str, *args) -> list[dict]:
    import asyncpg

    async def run() -> list[dict]:
        connection = await asyncpg.connect(database)
        try:
            return [dict(row) for row in await connection.fetch(sql, *args)]
        finally:
            await connection.close()

    return run_coroutine(run())


def rows_when(database: str, sql: str, until, timeout_s: float = 10.0) -> list[dict]:
    """The rows of `sql` once `until(rows)` holds (the app writes a reply's row just after it shows)."""
    deadline = time.monotonic() + timeout_s
    while True:
        rows = query(database, sql)
        if until(rows):
            return rows
        assert time.monotonic() < deadline, f"never true within {timeout_s} s: {sql} -> {rows}"
        time.sleep(0.2)


def test_forged_steps_and_a_reply_holding_nul_stop_nothing_and_later_replies_are_saved(
        app_factory, paced_server: PacedServer, cluster):
    database = run_coroutine(new_postgres_database(cluster.url))
    app = app_factory(app_env(paced_server, database), name="chainlit-store-faults-forged")
    paced_server.set_pace(rate_tokens_per_s=200, tokens=5)
    forged = {"name as a number": {"name": 5}, "language as an object": {"language": {"a": 1}},
              "modes as a list": {"modes": ["x"]}, "command as a number": {"command": 7},
              "a reply's type": {"type": "assistant_message"}, "a long name": {"name": "n" * 5_000},
              "metadata of 100 KB": {"metadata": {"location": "x", "big": "y" * 100_000}}}
    with ChainlitClient(app.url) as forger, ChainlitClient(app.url) as other:
        forger.open_chat()
        other.open_chat()
        for what, fields in forged.items():
            record = forger.ask(f"forged: {what}", REPLY_TIMEOUT_S, **fields)
            assert record.outcome == "replied", (what, record)
        oversized = forger.ask("z" * 200_000, REPLY_TIMEOUT_S)
        assert oversized.outcome == "empty" and any("200,000 characters" in note for note in oversized.notes)
        paced_server.set_reply(text="before\x00after")
        assert forger.ask("say something with a NUL", REPLY_TIMEOUT_S).outcome == "replied"
        paced_server.set_pace(rate_tokens_per_s=200, tokens=5)
        asked_at = time.monotonic()
        assert other.ask("a normal question from someone else", REPLY_TIMEOUT_S).outcome == "replied"
        replies = rows_when(database, "SELECT prompt, reply_text FROM replies",
                            lambda rows: len(rows) == len(forged) + 2)
        saved_s = time.monotonic() - asked_at
    assert saved_s < 15, f"the next reply took {saved_s:.1f} s to be saved"
    assert len({row["prompt"] for row in replies}) == len(forged) + 2  # each once
    assert {row["reply_text"] for row in replies if row["prompt"] == "say something with a NUL"} == {"before\ufffdafter"}
    # The chat history is written in batches, a moment after the replies' own rows.
    steps = rows_when(database, "SELECT name, type, language, modes, output, metadata FROM steps "
                      "WHERE type = 'user_message'", lambda rows: len(rows) >= len(forged) + 3)
    outputs = [step["output"] for step in steps]
    assert len(steps) == len(forged) + 3 and max(len(output or "") for output in outputs) < 32_000
    assert all(step["language"] is None and step["modes"] is None for step in steps)
    assert not any(step["name"] in ("5", "n" * 5_000) for step in steps)
    assert all("big" not in json.loads(step["metadata"] or "{}") for step in steps)
    outbox = lab_state(app)["outbox"]
    assert (outbox["waiting"], outbox["set_aside"]) == (0, 0), outbox


def test_a_database_down_at_start_comes_back_with_its_history_and_owners_without_a_restart(
        app_factory, paced_server: PacedServer, cluster):
    database = run_coroutine(new_postgres_database(cluster.url))  # never migrated: the app will
    cluster.stop()
    try:
        app = app_factory(with_logins(paced_server, database), name="chainlit-store-faults-down-at-start")
        paced_server.set_pace(rate_tokens_per_s=200, tokens=5)
        alice = log_in(app, "alice")
        with ChainlitClient(app.url, http=alice) as client:
            client.open_chat()
            assert any("does not answer yet" in text for text in client.tracker.startup_messages.values())
            during = client.ask("asked while the database was down", REPLY_TIMEOUT_S)
            assert during.outcome == "replied" and any("Not saved yet" in note for note in during.notes), during
            cluster.start()
            written_s = wait_outbox_empty(app, timeout_s=60)
            after = client.ask("asked once it was back", REPLY_TIMEOUT_S)
            assert after.outcome == "replied" and not any("saved" in note.lower() for note in after.notes), after
    finally:
        if cluster.server is None:
            cluster.start()
    rows_when(database, "SELECT id FROM replies", lambda rows: len(rows) == 2)
    (owner,) = query(database, "SELECT id FROM users WHERE identifier = 'alice'")
    threads = query(database, 'SELECT id, name, "userId", "userIdentifier" FROM threads')
    assert [(thread["userId"], thread["userIdentifier"]) for thread in threads] == [(owner["id"], "alice")], threads
    listed = alice.post(app.url + "/project/threads", json={"pagination": {"first": 20}, "filter": {}}, timeout=10)
    assert [thread["id"] for thread in listed.json()["data"]] == [threads[0]["id"]], listed.text[:500]
    thread = alice.get(f"{app.url}/project/thread/{threads[0]['id']}", timeout=10).json()
    asked = [step["output"] for step in thread["steps"] if step["type"] == "user_message"]
    assert asked == ["asked while the database was down", "asked once it was back"]
    nothing_set_aside(app)
    print(f"rows kept while the database was down written {written_s:.1f} s after it started")


def test_a_hung_database_holds_no_reply_and_loses_or_doubles_nothing(app_factory, paced_server: PacedServer, cluster):
    database = run_coroutine(new_postgres_database(cluster.url))
    app = app_factory(with_logins(paced_server, database), name="chainlit-store-faults-hung")
    paced_server.set_pace(rate_tokens_per_s=200, tokens=5)
    clients = [ChainlitClient(app.url, http=log_in(app, user)) for user in PASSWORDS]
    try:
        for client in clients:
            client.open_chat()
            assert client.ask("before the pause", REPLY_TIMEOUT_S).outcome == "replied"
        rows_when(database, "SELECT id FROM replies", lambda rows: len(rows) == 2)
        cluster.pause()
        try:
            records = []
            for round_number in range(2):
                for client in clients:
                    records.append(client.ask(f"while hung {round_number}", REPLY_TIMEOUT_S))
        finally:
            cluster.resume()
        written_s = wait_outbox_empty(app, timeout_s=60)
        for client in clients:
            assert client.ask("after the pause", REPLY_TIMEOUT_S).outcome == "replied"
    finally:
        for client in clients:
            client.close()
    assert records and all(record.outcome == "replied" for record in records), records
    slowest = max(record.reply_s for record in records)
    first_text = max(record.first_token_s for record in records)
    assert slowest < 30, f"a reply on a hung database took {slowest:.1f} s"
    assert first_text < 10, f"a reply's first text on a hung database came after {first_text:.1f} s"
    replies = rows_when(database, 'SELECT id, user_identifier, prompt FROM replies',
                        lambda rows: len(rows) == 2 * 4)
    assert len({row["id"] for row in replies}) == 8
    assert sorted((row["user_identifier"], row["prompt"]) for row in replies) == sorted(
        (user, prompt) for user in PASSWORDS
        for prompt in ("before the pause", "while hung 0", "while hung 1", "after the pause"))
    nothing_set_aside(app)
    print(f"replies on a hung database: first text at most {first_text:.2f} s, reply ends at most {slowest:.1f} s; "
          f"rows written {written_s:.1f} s after it resumed")

