"""Every write is owned: a student who sends another's ids changes nothing of theirs.

Attacked as a curious student would, on the running app with login on (alice and bob), over
Chainlit's own socket.io protocol and REST routes, on SQLite and on PostgreSQL:

- alice's `client_message` carries the id of bob's message: bob's message stays in his chat,
  with his text; alice's own messages (new ids from her browser) are stored as before;
- `PUT /feedback` on bob's reply is refused (403) and his chat shows no feedback of hers;
  `DELETE /feedback` with bob's feedback id, and `PUT` reusing that id on her own reply, leave
  it as it is; her feedback on her own reply is kept (the control).

And in the data layer itself (what every route and the socket write through): the same ids
written for another person, with no route in between, change nothing.
"""

from __future__ import annotations

import secrets
import time
import uuid

import pytest
import requests
from chainlit.context import init_http_context
from chainlit.types import Feedback
from chainlit.user import User
from sqlalchemy import text

from core.auth import hash_password
from load.chainlit_client import ChainlitClient
from servers.app import backend_env, run_coroutine
from servers.paced_openai import PacedServer
from store import Store
from store.db import create_engine
from store.urls import normalise_url
from tests.fixtures_postgres import new_postgres_database
from ui.chat_history import NotYours, chainlit_data_layer

PASSWORDS = {"alice": "alice-" + secrets.token_hex(4), "bob": "bob-" + secrets.token_hex(4)}
REPLY_TIMEOUT_S = 60.0


@pytest.fixture(params=["sqlite", "postgresql"])
def database(request, tmp_path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path}/lab.db"
    return run_coroutine(new_postgres_database(request.getfixturevalue("postgres_url")))


def rows(database: str, sql: str, **parameters) -> list[dict]:
    async def run() -> list[dict]:
        engine = create_engine(normalise_url(database))
        try:
            async with engine.connect() as connection:
                return [dict(row._mapping) for row in await connection.execute(text(sql), parameters)]
        finally:
            await engine.dispose()

    return run_coroutine(run())


def rows_when(database: str, sql: str, until, timeout_s: float = 15.0, **parameters) -> list[dict]:
    deadline = time.monotonic() + timeout_s
    while True:
        found = rows(database, sql, **parameters)
        if until(found):
            return found
        assert time.monotonic() < deadline, f"never true within {timeout_s} s: {sql} -> {found}"
        time.sleep(0.2)


def log_in(url: str, user: str) -> requests.Session:
    browser = requests.Session()
    response = browser.post(url + "/login", data={"username": user, "password": PASSWORDS[user]}, timeout=30)
    assert response.status_code == 200, response.text[:300]
    return browser


def step_of(database: str, step_id: str) -> dict | None:
    found = rows(database, 'SELECT s."threadId" AS thread, s."output" AS output, t."userIdentifier" AS owner '
                           'FROM steps s LEFT JOIN threads t ON t."id" = s."threadId" WHERE s."id" = :id', id=step_id)
    return found[0] if found else None


def replies_in(database: str, thread: str, reply_text: str) -> list[str]:
    """The ids of the assistant's replies with `reply_text` stored in `thread` (not its notices)."""
    found = rows(database, 'SELECT "id", "output" FROM steps WHERE "threadId" = :thread '
                           'AND "type" = \'assistant_message\' ORDER BY "createdAt"', thread=thread)
    return [row["id"] for row in found if (row["output"] or "").strip() == reply_text.strip()]


def reply_in(database: str, thread: str, reply_text: str) -> str:
    """The reply with `reply_text` once it is stored (each of the paced server's replies is unique)."""
    deadline = time.monotonic() + 15
    while not (replies := replies_in(database, thread, reply_text)):
        assert time.monotonic() < deadline, (f"the reply was never stored in {thread}: {replies}", rows(
            database, 'SELECT "id", "type", "output" FROM steps WHERE "threadId" = :thread', thread=thread))
        time.sleep(0.2)
    return replies[-1]


def feedbacks_for(database: str, step_id: str) -> list[dict]:
    return rows(database, 'SELECT "id", "value", "comment" FROM feedbacks WHERE "forId" = :id', id=step_id)


def put_feedback(browser: requests.Session, url: str, **feedback) -> requests.Response:
    return browser.put(url + "/feedback", json={"feedback": feedback, "sessionId": str(uuid.uuid4())}, timeout=30)


@pytest.mark.slow
def test_alice_with_bobs_ids_changes_nothing_of_bobs(app_factory, paced_server: PacedServer, database: str):
    users = ",".join(f"{name}:{hash_password(password, iterations=1000)}" for name, password in PASSWORDS.items())
    app = app_factory({"BACKENDS": "paced", "DEFAULT_SYSTEM_PROMPT": "none", "DATABASE_URL": database,
                       "AUTH_USERS": users, "CHAINLIT_AUTH_SECRET": secrets.token_urlsafe(32),
                       **backend_env("paced", kind="openai", base_url=paced_server.base_url, label="Paced")},
                      name="chainlit-owned-writes")
    paced_server.set_pace(rate_tokens_per_s=500, tokens=5)
    alice_http, bob_http = log_in(app.url, "alice"), log_in(app.url, "bob")
    with ChainlitClient(app.url, http=bob_http) as bob, ChainlitClient(app.url, http=alice_http) as alice:
        bob.open_chat()
        alice.open_chat()
        bobs = bob.ask("the hint is PURPLE", REPLY_TIMEOUT_S)
        assert bobs.outcome == "replied", bobs
        stored = rows_when(database, 'SELECT "id" FROM steps WHERE "id" = :id', bool, id=bobs.message_id)
        assert stored
        bob_thread = step_of(database, bobs.message_id)["thread"]
        assert step_of(database, bobs.message_id)["owner"] == "bob"

        own = alice.ask("alice's own question", REPLY_TIMEOUT_S)  # the control: a new id is kept
        assert own.outcome == "replied", own
        rows_when(database, 'SELECT "id" FROM steps WHERE "id" = :id', bool, id=own.message_id)
        alice_thread = step_of(database, own.message_id)["thread"]
        assert alice_thread != bob_thread and step_of(database, own.message_id)["owner"] == "alice"

        taken = alice.ask("alice takes it", REPLY_TIMEOUT_S, id=bobs.message_id)
        assert taken.outcome == "replied", taken
        # Her reply to it is stored (so her message's write has been made, or refused, before it).
        reply_in(database, alice_thread, taken.text)
        alice_reply = reply_in(database, alice_thread, own.text)
        assert step_of(database, bobs.message_id) == {"thread": bob_thread, "output": "the hint is PURPLE",
                                                       "owner": "bob"}

        bob_reply = reply_in(database, bob_thread, bobs.text)
        refused = put_feedback(alice_http, app.url, forId=bob_reply, value=0, comment="alice was here")
        assert refused.status_code == 403, refused.text
        assert feedbacks_for(database, bob_reply) == []

        kept = put_feedback(bob_http, app.url, forId=bob_reply, value=1, comment="bob's own")
        assert kept.status_code == 200, kept.text
        bobs_feedback = kept.json()["feedbackId"]
        mine = put_feedback(alice_http, app.url, forId=alice_reply, value=1, comment="alice's own")
        assert mine.status_code == 200, mine.text  # the control: her own reply takes her feedback
        reused = put_feedback(alice_http, app.url, id=bobs_feedback, forId=alice_reply, value=0, comment="reused id")
        assert reused.status_code == 200, reused.text  # her reply exists; the id is another's: nothing changes
        deleted = alice_http.delete(app.url + "/feedback", json={"feedbackId": bobs_feedback}, timeout=30)
        assert deleted.status_code == 200
        expected = [{"id": bobs_feedback, "value": 1, "comment": "bob's own"}]
        time.sleep(0.5)  # history writes go in batches of 0.1 s
        assert feedbacks_for(database, bob_reply) == expected
        rows_when(database, 'SELECT "id" FROM feedbacks WHERE "forId" = :id', lambda found: len(found) == 1,
                  id=alice_reply)
        assert [row["comment"] for row in feedbacks_for(database, alice_reply)] == ["alice's own"]
        # Bob's history, read back through the app, still has his message and his feedback.
        history = bob_http.post(app.url + "/project/threads", json={"pagination": {"first": 20}, "filter": {}},
                                timeout=30)
        assert [thread["id"] for thread in history.json()["data"]] == [bob_thread]


@pytest.fixture(params=["sqlite", "postgresql"])
async def layer_and_url(request, tmp_path):
    if request.param == "sqlite":
        url = normalise_url(f"sqlite:///{tmp_path}/serving_lab.db")
    else:
        url = normalise_url(await new_postgres_database(request.getfixturevalue("postgres_url")))
    store = await Store.open(url)
    await store.migrate()
    layer = chainlit_data_layer(url)
    layer.writes = None  # every write at once: this is the write path itself
    try:
        yield layer, url
    finally:
        await layer.close()
        await store.aclose()


def step(step_id: str, thread_id: str, output: str, kind: str = "user_message") -> dict:
    return {"id": step_id, "threadId": thread_id, "name": "someone", "type": kind, "output": output,
            "createdAt": "2026-12-07T12:00:00.000Z", "start": "2026-12-07T12:00:00.000Z",
            "end": "2026-12-07T12:00:00.000Z", "streaming": False, "isError": False, "metadata": {}}


async def test_the_data_layer_writes_nothing_for_another_persons_ids(layer_and_url):
    layer, url = layer_and_url
    alice_thread, bob_thread = str(uuid.uuid4()), str(uuid.uuid4())
    bob_message, bob_reply = str(uuid.uuid4()), str(uuid.uuid4())

    init_http_context(user=User(identifier="bob"))
    bob = await layer.create_user(User(identifier="bob"))
    await layer.update_thread(bob_thread, name="bob's chat", user_id=bob.id)
    await layer.create_step(step(bob_message, bob_thread, "the hint is PURPLE"))
    await layer.create_step(step(bob_reply, bob_thread, "noted", kind="assistant_message"))
    bob_feedback = await layer.upsert_feedback(Feedback(forId=bob_reply, value=1, comment="bob's"))

    init_http_context(user=User(identifier="alice"))
    alice = await layer.create_user(User(identifier="alice"))
    await layer.update_thread(alice_thread, name="alice's chat", user_id=alice.id)
    await layer.create_step(step(bob_message, alice_thread, "alice takes it"))  # bob's id, her thread
    await layer.update_thread(bob_thread, name="renamed by alice", user_id=alice.id)
    with pytest.raises(NotYours):
        await layer.upsert_feedback(Feedback(forId=bob_reply, value=0, comment="alice's"))
    await layer.delete_feedback(bob_feedback)
    own = str(uuid.uuid4())
    await layer.create_step(step(own, alice_thread, "alice's own"))  # the control: a new id is kept

    bobs = await layer.get_thread(bob_thread)
    assert (bobs["name"], bobs["userIdentifier"]) == ("bob's chat", "bob")
    assert [(s["id"], s["output"]) for s in bobs["steps"]] == [(bob_message, "the hint is PURPLE"),
                                                               (bob_reply, "noted")]
    assert bobs["steps"][1]["feedback"]["comment"] == "bob's"
    alices = await layer.get_thread(alice_thread)
    assert [(s["id"], s["output"]) for s in alices["steps"]] == [(own, "alice's own")]


async def test_feedback_sql_itself_refuses_another_persons_message(layer_and_url, monkeypatch):
    """Past the read that answers 403 (a read the database could not answer says yes): the write's
    own condition still writes nothing on a message of another person's thread."""
    layer, _ = layer_and_url
    thread, reply = str(uuid.uuid4()), str(uuid.uuid4())
    init_http_context(user=User(identifier="bob"))
    bob = await layer.create_user(User(identifier="bob"))
    await layer.update_thread(thread, user_id=bob.id)
    await layer.create_step(step(reply, thread, "noted", kind="assistant_message"))

    async def says_yes(step_id, writer) -> bool:
        return True

    monkeypatch.setattr(layer, "_may_write_for", says_yes)
    init_http_context(user=User(identifier="alice"))
    await layer.upsert_feedback(Feedback(forId=reply, value=0, comment="alice's"))
    assert (await layer.get_thread(thread))["steps"][0].get("feedback") is None
    init_http_context(user=User(identifier="bob"))  # the control: the owner's feedback is written
    await layer.upsert_feedback(Feedback(forId=reply, value=1, comment="bob's"))
    assert (await layer.get_thread(thread))["steps"][0]["feedback"]["comment"] == "bob's"
