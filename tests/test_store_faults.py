"""Database faults lose nothing and leak nothing: a real SQLite file that disappears or cannot be
written, and a real PostgreSQL stopped and started again, under a Store that keeps writing.

Rows the database cannot take wait in the outbox (store/outbox.py) and are written, in order,
once it answers again, also by the next process after a restart; the outbox is bounded; a row
the database refuses for good is set aside; and no error's text carries SQL or a row's values.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import json
import os
import subprocess
import sys
import time
import uuid
from datetime import timedelta
from pathlib import Path

import pytest
from sqlalchemy import text

from store import DatabaseUnavailable, NotSaved, SavedLater, Store, normalise_url
from store import outbox as outbox_module
from store.db import timeouts_s
from ui.chat_history import BATCH_WINDOW_S, chainlit_data_layer
from tests.fixtures_postgres import PostgresCluster, new_postgres_database
from tests.test_store import T0, make_reply, make_round, new_id

SECRET_TEXT = "the-row-value-" + uuid.uuid4().hex[:8]


_clock = itertools.count(1)


def reply_now(thread_id: str):
    """A reply with a creation time after every earlier one (the store orders a chat's replies by it)."""
    return make_reply(thread_id=thread_id, created_at=T0 + timedelta(seconds=next(_clock)))


def secret_reply(thread_id: str):
    reply = reply_now(thread_id)
    return reply.__class__(**{**reply.__dict__, "prompt": SECRET_TEXT, "reply_text": SECRET_TEXT})


def assert_safe(error: BaseException) -> None:
    """The message says what happened, never the SQL or a row's values."""
    message = str(error)
    assert "[SQL" not in message and "INSERT" not in message.upper().split("UNAVAILABLE")[0]
    assert SECRET_TEXT not in message and "parameters" not in message, message


async def wait_until_written(store: Store, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while store.outbox.waiting:
        assert time.monotonic() < deadline, f"{store.outbox.waiting} rows still wait: {store.outbox.problem}"
        await asyncio.sleep(0.1)


@pytest.fixture
def fresh_outboxes(tmp_path, monkeypatch):
    """Each test its own outbox folder, and no outbox left over from another test's database."""
    monkeypatch.setenv("LAB_OUTBOX_DIR", str(tmp_path / "outbox"))
    monkeypatch.setattr(outbox_module, "_OUTBOXES", {})
    return tmp_path / "outbox"


@pytest.fixture
async def sqlite_store(tmp_path, fresh_outboxes):
    url = normalise_url(f"sqlite:///{tmp_path}/lab.db")
    store = await Store.open(url)
    await store.migrate()
    yield store, Path(tmp_path / "lab.db")
    await store.aclose()


# ---------------------------------------------------------------- SQLite


async def test_a_sqlite_file_that_disappears_is_not_recreated_and_its_rows_wait_in_order(sqlite_store):
    store, path = sqlite_store
    thread = new_id()
    first = reply_now(thread)
    await store.save_reply(first)
    moved = path.with_name("moved-away.db")
    path.rename(moved)
    waiting = [secret_reply(thread), reply_now(thread)]
    for number, reply in enumerate(waiting, 1):
        with pytest.raises(SavedLater) as later:
            await store.save_reply(reply)
        assert later.value.waiting == number
        assert "unable to open database file" in str(later.value)
        assert_safe(later.value)
    with pytest.raises(DatabaseUnavailable) as unavailable:
        await store.replies_for_thread(thread)
    assert_safe(unavailable.value)
    assert not path.exists(), "the app made a new empty database where the file was"
    assert (await outbox_file_entries(store)) == 2  # kept on disk too, for a restart

    moved.rename(path)  # the file is back (restored from a backup, say)
    await wait_until_written(store)
    assert [reply.id for reply in await store.replies_for_thread(thread)] == [first.id, *(r.id for r in waiting)]
    assert await outbox_file_entries(store) == 0


async def test_a_sqlite_file_that_cannot_be_written_keeps_its_rows_until_it_can(sqlite_store):
    store, path = sqlite_store
    thread = new_id()
    with unwritable(path):
        with pytest.raises(SavedLater) as later:
            await store.save_reply(secret_reply(thread))
        assert "readonly database" in str(later.value)
        assert_safe(later.value)
        round_ = make_round(thread_id=thread)
        with pytest.raises(SavedLater):  # queued behind the reply, in order
            await store.save_round(round_)
        assert store.outbox.waiting == 2
    await wait_until_written(store)
    assert len(await store.replies_for_thread(thread)) == 1
    assert (await store.get_round(round_.id)) == round_


async def test_a_vote_is_refused_not_kept_while_rows_wait(sqlite_store):
    from store import Vote

    store, path = sqlite_store
    round_ = make_round(mode="blind")
    await store.save_round(round_)
    with unwritable(path):
        with pytest.raises(SavedLater):
            await store.save_reply(make_reply(thread_id=round_.thread_id))
        with pytest.raises(DatabaseUnavailable) as refused:
            await store.cast_vote(Vote(round_id=round_.id, outcome="tie"))
        assert "wait to be written" in str(refused.value)
    await wait_until_written(store)
    await store.cast_vote(Vote(round_id=round_.id, outcome="tie"))  # the person votes again: it counts
    assert len(await store.votes()) == 1


async def test_the_outbox_is_bounded_and_says_what_is_lost(sqlite_store, monkeypatch):
    store, path = sqlite_store
    store.outbox.max_rows = 2
    path.rename(path.with_name("gone.db"))
    for _ in range(2):
        with pytest.raises(SavedLater):
            await store.save_reply(make_reply(thread_id=new_id()))
    with pytest.raises(NotSaved) as lost:
        await store.save_reply(make_reply(thread_id=new_id()))
    assert "2 rows already wait" in str(lost.value) and "LAB_OUTBOX_MAX_ROWS" in str(lost.value)
    assert store.outbox.waiting == 2


async def test_a_row_the_database_refuses_for_good_is_set_aside_and_the_rest_are_written(sqlite_store):
    store, path = sqlite_store
    thread = new_id()
    duplicate = make_reply(thread_id=thread)
    await store.save_reply(duplicate)
    with unwritable(path):
        for reply in (duplicate, make_reply(thread_id=thread)):  # the first can never be written
            with pytest.raises(SavedLater):
                await store.save_reply(reply)
    await wait_until_written(store)
    assert len(await store.replies_for_thread(thread)) == 2
    assert store.outbox.set_aside_count == 1
    failed = store.outbox.dead_letter_path.read_text().splitlines()
    assert len(failed) == 1 and "IntegrityError" in json.loads(failed[0])["reason"]


async def test_rows_kept_before_a_restart_are_written_by_the_next_process(tmp_path, fresh_outboxes):
    """Two real processes: the first loses its file mid-run, keeps three replies and exits; the
    file comes back; the second, opening the same database, writes what the first kept."""
    url = normalise_url(f"sqlite:///{tmp_path}/lab.db")
    store = await Store.open(url)
    await store.migrate()
    await store.aclose()
    thread = new_id()
    script = (
        "import asyncio, os, sys\n"
        "from store import Store, SavedLater\n"
        "from tests.test_store import make_reply\n"
        "async def main():\n"
        "    store = await Store.open(sys.argv[1])\n"
        "    os.rename(sys.argv[3], sys.argv[3] + '.away')\n"
        "    for _ in range(3):\n"
        "        try:\n"
        "            await store.save_reply(make_reply(thread_id=sys.argv[2]))\n"
        "        except SavedLater as later:\n"
        "            print('waiting', later.waiting)\n"
        "    await store.aclose()\n"
        "asyncio.run(main())\n"
    )
    first = subprocess.run([sys.executable, "-c", script, url, thread, str(tmp_path / "lab.db")],
                           env={**os.environ, "LAB_OUTBOX_DIR": str(fresh_outboxes)}, capture_output=True, text=True,
                           cwd=Path(__file__).resolve().parent.parent, timeout=120)
    assert first.returncode == 0 and "waiting 3" in first.stdout, first.stdout + first.stderr[-2000:]
    (tmp_path / "lab.db.away").rename(tmp_path / "lab.db")
    outbox_module._OUTBOXES.clear()  # this test process opened the database before: start afresh, as an app would
    second = await Store.open(url)
    try:
        assert second.outbox.waiting == 3  # taken over from the first process's file
        await wait_until_written(second)
        assert len(await second.replies_for_thread(thread)) == 3
    finally:
        await second.aclose()


# ---------------------------------------------------------------- PostgreSQL stopped and started again


@pytest.fixture(scope="module")
def own_postgres():
    """A cluster of this module's own: stopping it must not touch the other tests' database."""
    cluster = PostgresCluster().start()
    yield cluster
    cluster.remove()


async def test_postgresql_stopped_under_the_store_loses_no_row_and_leaks_no_sql(own_postgres, fresh_outboxes):
    url = normalise_url(await new_postgres_database(own_postgres.url))
    store = await Store.open(url)
    await store.migrate()
    layer = chainlit_data_layer(url)
    thread = new_id()
    try:
        before = reply_now(thread)
        await store.save_reply(before)
        own_postgres.stop()
        started = time.monotonic()
        with pytest.raises(SavedLater) as later:
            await store.save_reply(secret_reply(thread))
        assert time.monotonic() - started < 15, "a stopped server must fail fast, not hang"
        assert_safe(later.value)
        # Chainlit's history writes wait in the same outbox, behind the reply.
        await layer.execute_sql('INSERT INTO threads ("id", "name", "createdAt") VALUES (:id, :name, :created)',
                                {"id": thread, "name": SECRET_TEXT, "created": "2026-12-01T10:00:00Z"})
        await layer.writes.flush()  # history is queued for its batch (ui/chat_history.py), then waits here
        after = reply_now(thread)
        with pytest.raises(SavedLater):
            await store.save_reply(after)
        assert store.outbox.waiting == 3
        with pytest.raises(DatabaseUnavailable) as unavailable:
            await store.replies_for_thread(thread)
        assert_safe(unavailable.value)

        own_postgres.start()
        await wait_until_written(store)
        stored = await store.replies_for_thread(thread)
        assert [reply.prompt for reply in stored] == [before.prompt, SECRET_TEXT, after.prompt]
        async with store._transaction() as connection:
            assert (await connection.execute(text('SELECT name FROM threads WHERE id = :id'),
                                             {"id": thread})).scalar() == SECRET_TEXT
    finally:
        if own_postgres.server is None:
            own_postgres.start()
        await layer.engine.dispose()
        await store.aclose()


# ---------------------------------------------------------------- helpers


async def outbox_file_entries(store: Store) -> int:
    path = store.outbox.path
    if path is None or not path.exists():
        return 0
    done = outbox_module._read_done(path.with_suffix(".done"))
    return sum(1 for line in path.read_text().splitlines() if line.strip()) - done


class unwritable:
    """The SQLite file cannot be written: immutable for root (chattr +i), read-only for anyone else."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __enter__(self):
        if os.geteuid() == 0:
            subprocess.run(["chattr", "+i", str(self.path)], check=True)
        else:
            self.path.chmod(0o444)
        return self

    def __exit__(self, *exc):
        if os.geteuid() == 0:
            subprocess.run(["chattr", "-i", str(self.path)], check=True)
        else:
            self.path.chmod(0o644)


# ---------------------------------------------------------------- what a failure means (store.faults)


async def test_postgresql_failures_are_told_apart_refused_rows_from_an_unavailable_server(own_postgres, fresh_outboxes):
    """Real driver errors: a NUL, a value of the wrong type and a broken constraint are refused (set
    aside, never retried); a statement timeout and a stopped server are transient (the row waits)."""
    from sqlalchemy.exc import SQLAlchemyError

    from store.db import create_engine
    from store.faults import classify

    url = normalise_url(await new_postgres_database(own_postgres.url))
    engine = create_engine(url)

    async def failure(statement: str, parameters: dict | None = None, *, first: str | None = None) -> BaseException:
        try:
            async with engine.begin() as connection:
                if first is not None:
                    await connection.execute(text(first))
                await connection.execute(text(statement), parameters or {})
        except (SQLAlchemyError, OSError) as error:
            return error
        raise AssertionError(f"{statement} did not fail")

    try:
        async with engine.begin() as connection:
            await connection.execute(text("CREATE TABLE t (id text PRIMARY KEY, n integer NOT NULL)"))
            await connection.execute(text("INSERT INTO t VALUES ('a', 1)"))
        refused = {
            "nul": await failure("INSERT INTO t VALUES (:id, 1)", {"id": "x\x00y"}),
            "wrong type (checked by the driver)": await failure("INSERT INTO t VALUES (:id, 1)", {"id": 5}),
            "wrong type (checked by the server)": await failure("INSERT INTO t VALUES ('b', CAST(:n AS integer))",
                                                                {"n": "many"}),
            "duplicate": await failure("INSERT INTO t VALUES ('a', 2)"),
            "not null": await failure("INSERT INTO t VALUES ('c', NULL)"),
        }
        for what, error in refused.items():
            fault = classify(error)
            assert not fault.transient, (what, fault)
            assert "INSERT" not in fault.reason and "x\x00y" not in fault.reason and "many" not in fault.reason, fault
        timeout = classify(await failure("SELECT pg_sleep(2)", first="SET LOCAL statement_timeout = '50ms'"))
        assert timeout.transient and "statement timeout" in timeout.detail, timeout
        own_postgres.stop()
        stopped = classify(await failure("INSERT INTO t VALUES ('d', 4)"))
        assert stopped.transient, stopped
    finally:
        if own_postgres.server is None:
            own_postgres.start()
        await engine.dispose()


async def test_sqlite_failures_are_told_apart_refused_rows_from_an_unavailable_file(sqlite_store):
    from store.faults import classify

    store, path = sqlite_store
    reply = make_reply(thread_id=new_id())
    await store.save_reply(reply)
    engine = store._engine

    async def failure(statement: str) -> BaseException:
        try:
            async with engine.begin() as connection:
                await connection.execute(text(statement))
        except Exception as error:  # noqa: BLE001 - the test classifies whatever the driver raised
            return error
        raise AssertionError(f"{statement} did not fail")

    duplicate = classify(await failure(f"INSERT INTO replies (id) VALUES ('{reply.id}')"))
    assert not duplicate.transient and "SQLITE_CONSTRAINT" in duplicate.reason, duplicate
    with unwritable(path):
        read_only = classify(await failure("DELETE FROM replies"))
    assert read_only.transient and "readonly" in read_only.reason, read_only
    path.rename(path.with_name("away.db"))
    gone = classify(await failure("DELETE FROM replies"))
    path.with_name("away.db").rename(path)
    assert gone.transient and "unable to open" in gone.reason, gone


# ---------------------------------------------------------------- a refused row never stops the rest


@pytest.fixture
async def postgres_store(own_postgres, fresh_outboxes):
    url = normalise_url(await new_postgres_database(own_postgres.url))
    store = await Store.open(url)
    await store.migrate()
    layer = chainlit_data_layer(url)
    yield store, layer, url
    if own_postgres.server is None:
        own_postgres.start()
    own_postgres.resume()
    await layer.engine.dispose()
    await store.aclose()


def dead_letters(store: Store) -> list[dict]:
    path = store.outbox.dead_letter_path
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


async def test_a_row_refused_while_rows_wait_is_set_aside_and_the_rows_behind_it_are_written(
        own_postgres, postgres_store):
    """The outbox holds, in order: a reply, a history row PostgreSQL will refuse (a step whose name is
    a number: the driver refuses it for good), and two more replies. Once the server is back the
    refused row is set aside with its reason and every reply is written, in order, nothing twice."""
    store, layer, _ = postgres_store
    thread = new_id()
    await layer.update_thread(thread)
    await layer.writes.flush()  # the thread is written before the server stops
    own_postgres.stop()
    first = reply_now(thread)
    with pytest.raises(SavedLater):
        await store.save_reply(first)
    await layer.execute_sql('INSERT INTO steps ("id", "threadId", "name", "type", "streaming", "output") '
                            'VALUES (:id, :thread, :name, :type, false, :output)',
                            {"id": new_id(), "thread": thread, "name": 5, "type": "user_message", "output": SECRET_TEXT})
    await layer.writes.flush()  # history is queued for its batch, then kept behind the waiting reply
    later = [reply_now(thread), reply_now(thread)]
    for reply in later:
        with pytest.raises(SavedLater):
            await store.save_reply(reply)
    assert store.outbox.waiting == 4
    own_postgres.start()
    await wait_until_written(store, timeout_s=20)
    assert [reply.id for reply in await store.replies_for_thread(thread)] == [first.id, *(r.id for r in later)]
    (refused,) = dead_letters(store)
    assert "SQLSTATE 22000" in refused["reason"] and refused["entry"]["parameters"]["name"] == 5
    assert SECRET_TEXT not in refused["reason"]
    assert store.outbox.state().set_aside == 1


async def test_a_refused_row_with_nothing_waiting_is_set_aside_at_once_and_says_so(postgres_store):
    """Written directly, a row PostgreSQL refuses is not retried and not kept waiting: the store
    raises RowRefused (a StoreError the app turns into a notice) and the next rows go in."""
    from store import RowRefused

    store, _, _ = postgres_store
    thread = new_id()
    bad = dataclasses.replace(reply_now(thread), output_tokens="many")  # a forged figure of the wrong type
    with pytest.raises(RowRefused) as refused:
        await store.save_reply(bad)
    assert "many" not in str(refused.value) and "dead-letter" in str(refused.value)
    assert store.outbox.waiting == 0
    good = reply_now(thread)
    await store.save_reply(good)
    assert [reply.id for reply in await store.replies_for_thread(thread)] == [good.id]
    assert [letter["entry"]["statements"][0]["insert"]["id"] for letter in dead_letters(store)] == [bad.id]


async def test_a_reply_holding_nul_is_saved_with_the_nul_marked(postgres_store):
    store, layer, _ = postgres_store
    thread = new_id()
    reply = dataclasses.replace(reply_now(thread), reply_text="before\x00after",
                                record={"note": "a\x00b", "ratio": float("nan")})
    await store.save_reply(reply)
    (stored,) = await store.replies_for_thread(thread)
    assert stored.reply_text == "before\ufffdafter" and stored.record == {"note": "a\ufffdb", "ratio": None}
    await layer.update_thread(thread)
    step = new_id()
    await layer.execute_sql('INSERT INTO steps ("id", "threadId", "name", "type", "streaming", "output", "metadata") '
                            'VALUES (:id, :thread, :name, :type, false, :output, :metadata)',
                            {"id": step, "thread": thread, "name": "Bot\x00", "type": "assistant_message",
                             "output": "x\x00y", "metadata": json.dumps({"k\x00": "v\x00"})})
    await layer.writes.flush()  # the chat history is written in batches
    async with store._transaction() as connection:
        row = (await connection.execute(text('SELECT name, output, metadata FROM steps WHERE id = :id'),
                                        {"id": step})).one()
    assert (row.name, row.output, row.metadata) == ("Bot\ufffd", "x\ufffdy", {"k\ufffd": "v\ufffd"})
    assert store.outbox.state().set_aside == 0


# ---------------------------------------------------------------- a hung database


async def test_a_hung_postgresql_sends_writes_to_the_outbox_within_seconds(own_postgres, postgres_store):
    """A paused server (SIGSTOP) accepts connections and never answers: the first write gives up
    after the connect and statement timeouts, the next ones go straight to the outbox, and all are
    written once it runs again. The bounds here are safety bounds; experiments/ measure."""
    store, layer, _ = postgres_store
    thread = new_id()
    before = reply_now(thread)
    await store.save_reply(before)
    own_postgres.pause()
    try:
        started = time.monotonic()
        with pytest.raises(SavedLater):
            await store.save_reply(first := reply_now(thread))
        first_s = time.monotonic() - started
        started = time.monotonic()
        with pytest.raises(SavedLater):
            await store.save_reply(second := reply_now(thread))
        await layer.update_thread(thread, name="renamed while hung")
        await layer.writes.flush()  # its batch goes behind the waiting rows, without trying the server
        second_s = time.monotonic() - started
    finally:
        own_postgres.resume()
    assert first_s < 20, f"the first write on a hung server took {first_s:.1f} s"
    # Straight to the outbox: a write that waited on the hung server even once would take its
    # connect timeout (5 s by default, store/db.py); under half of it, a safety bound only.
    assert second_s < timeouts_s()[0] / 2, f"a write behind a waiting one took {second_s:.1f} s"
    await wait_until_written(store, timeout_s=30)
    assert [reply.id for reply in await store.replies_for_thread(thread)] == [before.id, first.id, second.id]
    async with store._transaction() as connection:
        assert (await connection.scalar(text("SELECT name FROM threads WHERE id = :id"), {"id": thread})
                == "renamed while hung")


# ---------------------------------------------------------------- history kept during an outage


def as_session_of(identifier: str) -> None:
    """The current task runs as a request of `identifier`'s session (Chainlit's own context)."""
    from chainlit.context import ChainlitContext, context_var
    from chainlit.session import HTTPSession
    from chainlit.user import User

    context_var.set(ChainlitContext(HTTPSession(id=new_id(), client_type="webapp", user=User(identifier=identifier))))


async def test_threads_kept_during_an_outage_keep_their_owner_and_never_overwrite_a_thread(
        own_postgres, postgres_store):
    from chainlit.user import User

    store, layer, _ = postgres_store
    alice = await layer.create_user(User(identifier="alice"))
    existing = new_id()
    await layer.update_thread(existing, name="Existing chat", user_id=alice.id, metadata={"kept": 1})
    async with store._transaction() as connection:
        created_before = await connection.scalar(text('SELECT "createdAt" FROM threads WHERE id = :id'),
                                                 {"id": existing})
    own_postgres.stop()
    as_session_of("alice")  # her chat: a thread is changed only by its owner's session
    # A step written to the existing chat (Chainlit's create_step) changes nothing of a thread this
    # process has written: nothing waits for it.
    await layer.update_thread(existing)
    await layer.update_thread(existing, metadata={"added": 2})
    as_session_of("bob")  # logged in during the outage: Chainlit could not read bob's user row
    for _ in range(3):  # every request of bob's asks for his user row
        assert await layer.create_user(User(identifier="bob")) is None
    fresh = new_id()
    await layer.update_thread(fresh)  # bob's first message makes the thread...
    await layer.update_thread(fresh, name="Bob's chat")  # ...and names it, with no user id known
    await layer.writes.flush()
    # bob's user row (three upserts waiting as one), the metadata change, the new thread and its name.
    assert store.outbox.waiting == 4, "bob's three user upserts should wait as one"
    own_postgres.start()
    await wait_until_written(store, timeout_s=20)
    async with store._transaction() as connection:
        rows = {row.id: row for row in await connection.execute(
            text('SELECT id, "createdAt", name, "userId", "userIdentifier", metadata FROM threads'))}
        bob_ids = (await connection.execute(text("SELECT id FROM users WHERE identifier = 'bob'"))).scalars().all()
    assert rows[existing].createdAt == created_before and rows[existing].name == "Existing chat"
    assert rows[existing].metadata == {"kept": 1, "added": 2} and rows[existing].userId == alice.id
    assert len(bob_ids) == 1
    assert (rows[fresh].name, rows[fresh].userId, rows[fresh].userIdentifier) == ("Bob's chat", bob_ids[0], "bob")
    assert dead_letters(store) == []
    listed = await layer.get_all_user_threads(user_id=bob_ids[0])
    assert [thread["id"] for thread in listed] == [fresh], "bob's chat is missing from his sidebar"


# ---------------------------------------------------------------- the outbox's bounds and file


async def test_the_outbox_is_bounded_in_bytes_as_well_as_rows(sqlite_store):
    store, path = sqlite_store
    store.outbox.max_bytes = 20_000
    path.rename(path.with_name("gone.db"))
    with pytest.raises(SavedLater):
        await store.save_reply(make_reply(thread_id=new_id()))
    big = dataclasses.replace(make_reply(thread_id=new_id()), reply_text="x" * 30_000)
    with pytest.raises(NotSaved) as lost:
        await store.save_reply(big)
    assert "LAB_OUTBOX_MAX_BYTES" in str(lost.value)
    assert store.outbox.waiting == 1 and store.outbox.state().waiting_bytes < 20_000


async def test_the_outbox_file_is_named_without_the_password_and_a_new_password_finds_its_rows(
        own_postgres, fresh_outboxes):
    """Rows kept under one password are written by the next start with another: the file's name
    comes from the URL without its password, and holds neither password."""
    import asyncpg
    from sqlalchemy.engine import make_url

    database = await new_postgres_database(own_postgres.url)
    admin = await asyncpg.connect(database)
    try:
        await admin.execute("CREATE ROLE lab LOGIN PASSWORD 'first-secret'; GRANT ALL ON SCHEMA public TO lab")
    finally:
        await admin.close()
    first_url = normalise_url(make_url(database).set(username="lab", password="first-secret")
                              .render_as_string(hide_password=False))
    second_url = first_url.replace("first-secret", "second-secret")
    store = await Store.open(first_url)
    await store.migrate()
    thread = new_id()
    try:
        own_postgres.stop()
        with pytest.raises(SavedLater):
            await store.save_reply(kept := reply_now(thread))
    finally:
        await store.aclose()
        own_postgres.start()
    admin = await asyncpg.connect(database)
    try:
        await admin.execute("ALTER ROLE lab PASSWORD 'second-secret'")
    finally:
        await admin.close()
    names = " ".join(path.name for path in fresh_outboxes.iterdir())
    assert "secret" not in names and outbox_module.outbox_stem(first_url) == outbox_module.outbox_stem(second_url)
    outbox_module._OUTBOXES.clear()  # a new process, configured with the new password
    second = await Store.open(second_url)
    try:
        assert second.outbox.waiting == 1
        await wait_until_written(second)
        assert [reply.id for reply in await second.replies_for_thread(thread)] == [kept.id]
    finally:
        await second.aclose()


# ---------------------------------------------------------------- locks after a restart


async def test_the_apps_locks_are_taken_again_after_a_restart_of_postgresql(own_postgres, postgres_store,
                                                                           monkeypatch):
    """A replica's alive lock (its replies in flight are its own) and a load run's lock end with the
    server's sessions; the app takes both again once it is back, and replies are saved after it."""
    from core.app_state import LOAD_LOCK_NAME, PROCESS_LOCK_NAME
    from core.notices import Notice
    from core.replica import process_key
    from store import locks
    from store.locks import LOAD_RUN, PROCESS_ALIVE_SPACE, LockKey
    from tests.fakes import FakeBackend, fake_state

    monkeypatch.setattr(locks, "KEEP_INTERVAL_S", 0.5)
    _, _, url = postgres_store
    state = fake_state(FakeBackend("a"))
    state.database_url, state.storage_problem, state._storage_tried = url, None, False
    state.replica = "replica-under-test"
    release = asyncio.Event()
    keys = [LockKey(PROCESS_ALIVE_SPACE, process_key()), LOAD_RUN]
    expected = {keys[0]: PROCESS_LOCK_NAME + state.replica, keys[1]: LOAD_LOCK_NAME + state.replica}
    store = await state.storage()
    try:
        assert (await state.in_flight_mark())["in_flight"]["replica"] == state.replica
        assert await state.start_load(Notice("simulate_busy", {"users": 2, "backend": "a"}), release.wait()) is None
        assert await store.lock_holders(keys) == expected
        own_postgres.stop()
        await asyncio.sleep(1.5)
        own_postgres.start()
        deadline = time.monotonic() + 20
        while True:
            try:
                holders = await store.lock_holders(keys)
            except DatabaseUnavailable:
                holders = {}
            if holders == expected or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.2)
        assert holders == expected
        thread = new_id()
        reply = reply_now(thread)
        assert await state.save_reply(reply) in (None, Notice("saved_later", {"waiting": 1}))
        await wait_until_written(store, timeout_s=10)
        assert [stored.id for stored in await store.replies_for_thread(thread)] == [reply.id]
    finally:
        release.set()
        await state.load_task
        await state.end_load(state.load_task)
        await state._alive.release()
        await store.aclose()


# ---------------------------------------------------------------- a database down at start


async def test_a_database_down_at_start_is_tried_again_and_what_waited_is_written(own_postgres, fresh_outboxes,
                                                                                   monkeypatch):
    """The app's storage on a database that is down when the process starts (and was never
    migrated): replies are kept meanwhile, and once it is up the app opens it, creates the tables and
    writes them, with no restart."""
    from core import app_state as app_state_module
    from tests.fakes import FakeBackend, fake_state

    monkeypatch.setattr(app_state_module, "STORAGE_RETRY_FIRST_S", 0.2)
    monkeypatch.setattr(app_state_module, "STORAGE_RETRY_S", 1.0)
    url = normalise_url(await new_postgres_database(own_postgres.url))
    state = fake_state(FakeBackend("a"))
    state.database_url, state.storage_problem, state._storage_tried = url, None, False
    thread = new_id()
    own_postgres.stop()
    try:
        waiting_store = await state.storage()
        assert waiting_store is not None and "Cannot open the database" in state.storage_problem
        kept = [reply_now(thread), reply_now(thread)]
        for reply in kept:
            notice = await state.save_reply(reply)
            assert notice is not None and notice.key == "saved_later", notice
    finally:
        own_postgres.start()
    deadline = time.monotonic() + 30
    while state.storage_problem is not None or (await state.storage()).outbox.waiting:
        assert time.monotonic() < deadline, f"storage still unavailable: {state.storage_problem}"
        await asyncio.sleep(0.2)
    store = await state.storage()
    try:
        assert store is not waiting_store
        assert [reply.id for reply in await store.replies_for_thread(thread)] == [reply.id for reply in kept]
        assert await state.save_reply(reply_now(thread)) is None  # and new ones go straight in
    finally:
        await store.aclose()


# ---------------------------------------------------------------- the chat history's batches


STEP_SQL = ('INSERT INTO steps ("id", "threadId", "name", "type", "streaming", "output") '
            'VALUES (:id, :thread, :name, :type, false, :output)')


async def steps_of(store: Store, thread: str) -> list[str]:
    async with store._transaction() as connection:
        rows = await connection.execute(text('SELECT output FROM steps WHERE "threadId" = :thread ORDER BY output'),
                                        {"thread": thread})
        return [row.output for row in rows]


async def test_history_writes_of_a_burst_go_in_one_transaction_and_a_read_sees_them(postgres_store):
    store, layer, _ = postgres_store
    thread = new_id()
    await layer.update_thread(thread, name="a class")
    for number in range(30):
        await layer.execute_sql(STEP_SQL, {"id": new_id(), "thread": thread, "name": "Bot", "type": "assistant_message",
                                           "output": f"reply {number:02d}"})
    assert await steps_of(store, thread) == []  # queued, not written yet
    batches = layer.writes.batches
    # Chainlit's own read of the thread waits for the writes queued before it.
    read = await layer.execute_sql('SELECT "id" FROM steps WHERE "threadId" = :thread', {"thread": thread})
    assert len(read) == 30 and layer.writes.batches == batches + 1  # the thread and 30 steps: one transaction
    assert await steps_of(store, thread) == [f"reply {number:02d}" for number in range(30)]


async def test_a_batch_flushes_by_itself_within_its_window(postgres_store):
    store, layer, _ = postgres_store
    thread = new_id()
    await layer.update_thread(thread)
    await layer.execute_sql(STEP_SQL, {"id": new_id(), "thread": thread, "name": "Bot", "type": "assistant_message",
                                       "output": "on its own"})
    await asyncio.sleep(BATCH_WINDOW_S + 0.5)
    assert await steps_of(store, thread) == ["on its own"]


async def test_a_hurried_batch_is_written_at_once_not_at_the_end_of_its_window(postgres_store):
    """A reply's start hurries the batch (ui/chat_history.write_history_soon): what is queued is
    written within HURRY_S. Control: the same writes, not hurried, still wait for the window."""
    store, layer, _ = postgres_store
    written = {}
    for hurried in (False, True):
        thread = new_id()
        await layer.update_thread(thread)
        await layer.execute_sql(STEP_SQL, {"id": new_id(), "thread": thread, "name": "Bot",
                                           "type": "assistant_message", "output": f"hurried {hurried}"})
        if hurried:
            layer.writes.hurry()
        await asyncio.sleep(BATCH_WINDOW_S / 2)
        written[hurried] = await steps_of(store, thread)
        await layer.writes.flush()
    assert written == {False: [], True: ["hurried True"]}


async def test_waiting_for_the_history_returns_once_what_was_queued_is_in_the_database(postgres_store):
    """A reply's end (ui/chat_history.history_written): every write queued before the wait is in
    the database when it returns, in one batch, long before the window would have written it."""
    store, layer, _ = postgres_store
    thread = new_id()
    await layer.update_thread(thread)
    for number in range(3):
        await layer.execute_sql(STEP_SQL, {"id": new_id(), "thread": thread, "name": "Bot",
                                           "type": "assistant_message", "output": f"step {number}"})
    batches = layer.writes.batches
    assert await steps_of(store, thread) == []
    await asyncio.wait_for(layer.writes.written(), timeout=BATCH_WINDOW_S * 0.9)  # not left to the window
    assert await steps_of(store, thread) == ["step 0", "step 1", "step 2"] and layer.writes.batches == batches + 1
    await asyncio.wait_for(layer.writes.written(), timeout=1)  # nothing queued: returns at once


async def test_a_refused_write_in_a_batch_is_set_aside_and_the_rest_of_the_batch_is_written(postgres_store):
    """A step whose name is a number is refused by the driver for good: alone in its batch it would be
    set aside; amid others, the batch is written again a write at a time and only it is set aside."""
    store, layer, _ = postgres_store
    thread = new_id()
    await layer.update_thread(thread)
    for number, name in enumerate(["Bot", 5, "Bot"]):
        await layer.execute_sql(STEP_SQL, {"id": new_id(), "thread": thread, "name": name, "type": "assistant_message",
                                           "output": f"step {number}"})
    # A reply's end waits for its history (ui/chat_history.history_written): a refused write ends the wait too.
    await asyncio.wait_for(layer.writes.written(), timeout=30)
    assert await steps_of(store, thread) == ["step 0", "step 2"]
    assert len(dead_letters(store)) == 1 and store.outbox.waiting == 0


async def test_a_batch_the_database_cannot_take_waits_whole_and_in_order(own_postgres, postgres_store):
    store, layer, _ = postgres_store
    thread = new_id()
    await layer.update_thread(thread)
    await layer.writes.flush()
    own_postgres.stop()
    for number in range(3):
        await layer.execute_sql(STEP_SQL, {"id": new_id(), "thread": thread, "name": "Bot", "type": "assistant_message",
                                           "output": f"step {number}"})
    await asyncio.wait_for(layer.writes.written(), timeout=30)  # kept in the outbox: the wait ends
    assert store.outbox.waiting == 3
    own_postgres.start()
    await wait_until_written(store, timeout_s=20)
    assert await steps_of(store, thread) == ["step 0", "step 1", "step 2"] and dead_letters(store) == []


async def test_a_thread_this_process_wrote_is_not_written_again_for_every_step(postgres_store):
    store, layer, _ = postgres_store
    thread = new_id()
    await layer.update_thread(thread, name="named once")
    await layer.writes.flush()
    queued = layer.writes.waiting
    for _ in range(5):  # Chainlit's create_step asks before every step
        await layer.update_thread(thread)
    assert layer.writes.waiting == queued
    await layer.update_thread(thread, name="renamed")  # a change is still written
    assert layer.writes.waiting == queued + 1
    await layer.writes.flush()
    async with store._transaction() as connection:
        assert await connection.scalar(text("SELECT name FROM threads WHERE id = :id"), {"id": thread}) == "renamed"


async def test_a_step_written_while_rows_wait_never_goes_ahead_of_its_queued_thread(own_postgres, postgres_store):
    """The CI failure of a hung database: a chat's thread was queued for its batch, the app's own
    row then started the outbox waiting, and the chat's next step went to the outbox at once, ahead
    of its thread; written back in that order, the database refused the step (no such thread)."""
    store, layer, _ = postgres_store
    layer.writes.window_s = 60  # the batch stays queued while the server stops (that takes longer than 0.1 s)
    thread = new_id()
    await layer.update_thread(thread, name="queued first")  # in the batch, not written yet
    own_postgres.stop()
    assert layer.writes.waiting == 1
    try:
        with pytest.raises(SavedLater):  # the app's own row waits: the outbox is waiting
            await store.save_reply(reply_now(thread))
        assert store.outbox.waiting == 1
        await layer.execute_sql(STEP_SQL, {"id": new_id(), "thread": thread, "name": "Bot",
                                           "type": "assistant_message", "output": "after its thread"})
        await layer.writes.flush()
    finally:
        own_postgres.start()
    await wait_until_written(store, timeout_s=30)
    assert await steps_of(store, thread) == ["after its thread"]
    assert dead_letters(store) == []
