"""Database faults lose nothing and leak nothing: a real SQLite file that disappears or cannot be
written, and a real PostgreSQL stopped and started again, under a Store that keeps writing.

Rows the database cannot take wait in the outbox (store/outbox.py) and are written, in order,
once it answers again, also by the next process after a restart; the outbox is bounded; a row
the database refuses for good is set aside; and no error's text carries SQL or a row's values.
"""

from __future__ import annotations

import asyncio
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
from ui.chat_history import chainlit_data_layer
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
    assert store.outbox.failed == 1
    failed = store.outbox.path.with_suffix(".failed.jsonl").read_text().splitlines()
    assert len(failed) == 1 and "IntegrityError" in json.loads(failed[0])["error"]


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
