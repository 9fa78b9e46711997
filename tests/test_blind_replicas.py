"""The blind rule across replicas of one PostgreSQL database (real PostgreSQL, the throwaway cluster):
a blind round started on one replica holds its person's views and replies on the other within
moments (PostgreSQL announces the change; the other replica reads the person's rounds again, once),
other people's views of live engine load wait while it is open, the vote or a give-up on either
replica releases both, the change feed comes back after the database restarts, and schema 6 fills
in the owner of older rounds. Each replica is an AppState with its own engine, store and feed, as
an app process has (tests/test_replicas.py does the same for the load lock); fake backends."""

from __future__ import annotations

import asyncio
import time
from dataclasses import replace

from sqlalchemy import text

from core.app_state import live_load_refusal
from core.disclosure import Disclosure
from core.notices import Notice
from core.replies import answer
from core.round_flow import cast_vote, give_up_rounds, play
from core.session_state import LabSession
from core.settings import SessionSettings
from store import Store, normalise_url, schema
from store.outbox import outbox_for
from store.records import CompareRound, RoundColumn, utc_now
from tests.fakes import FakeBackend, FakeReply, fake_state
from tests.fixtures_postgres import PostgresCluster, new_postgres_database
from tests.test_blind_rule import ChatView, Display

WORDS = [f"w{i} " for i in range(60)]
# A change made on one replica is seen on the other well within this (measured: milliseconds).
SEEN_WITHIN_S = 5.0


def replica(url: str, name: str) -> tuple:
    """An app replica on `url` with the same two backends as every other: its state and backends."""
    left = FakeBackend("left", label="Left Engine", replies=[FakeReply(WORDS, 0.03) for _ in range(4)])
    right = FakeBackend("right", label="Right Engine", replies=[FakeReply(WORDS, 0.03) for _ in range(4)])
    state = fake_state(left, right)
    state.database_url, state.storage_problem, state._storage_tried = url, None, False
    state.replica = name
    state.auth = replace(state.auth, users={"alice": "x", "bob": "x", "teacher": "x"},
                         teachers=frozenset({"teacher"}))
    return state, left, right


def session_of(state, person: str, mode: str = "blind", backend: str = "left") -> LabSession:
    settings = replace(SessionSettings.initial(state.defaults, state.presets, state.registry.names),
                       mode=mode, backend=backend, compare_backends=("left", "right"), run_order="concurrent")
    return LabSession(settings=settings, person=person, disclosure=state.disclosures.person(person))


def counting_reads(state) -> list[str]:
    """Every read of a person's rounds this replica makes, by person."""
    reads: list[str] = []
    read = state.disclosures.read_person

    async def counted(person):
        reads.append(person)
        return await read(person)

    state.disclosures.read_person = counted
    return reads


async def until(condition, timeout_s: float = SEEN_WITHIN_S) -> float:
    """Seconds until `await condition()` is true."""
    started = time.monotonic()
    while not await condition():
        assert time.monotonic() - started < timeout_s, "not seen in time"
        await asyncio.sleep(0.02)
    return time.monotonic() - started


async def feed_live(state) -> None:
    await state.storage()
    await until(lambda: asyncio.sleep(0, state.disclosures.feed_live))


async def close(*states) -> None:
    for state in states:
        if state._store is not None:
            await state._store.aclose()


async def test_a_round_on_one_replica_holds_the_person_on_the_other_and_its_vote_releases_both(postgres_url):
    url = normalise_url(await new_postgres_database(postgres_url))
    (first, _, _), (second, left_2, _) = replica(url, "app-1"), replica(url, "app-2")
    try:
        await feed_live(first)
        await feed_live(second)
        reads = counting_reads(second)
        tab1 = session_of(first, "user:alice")
        tab2 = session_of(second, "user:alice", mode="compare")
        bob = session_of(second, "user:bob", mode="compare")
        teacher = session_of(second, "user:teacher", mode="compare")
        assert (await second.rule("user:alice")).refusal("engines") is None
        assert await live_load_refusal(second, "compare", "bob", rule=bob.disclosure) is None
        for _ in range(100):  # a hundred views with nothing changing: no read of the database
            await second.rule("user:alice")
        assert reads.count("user:alice") == 1

        round_task = asyncio.create_task(play(first, tab1, "hello", Display(), thread_id="t1", user="alice",
                                              lang="en"))
        seen_s = await until(lambda: _held(second, "user:alice"))
        print(f"a blind round on app-1 held alice on app-2 after {seen_s * 1000:.0f} ms")
        assert not round_task.done(), "the round ended before the other replica saw it: nothing was tested"
        rule = await second.rule("user:alice")
        assert rule.refusal("status").key == "blind_wait" and rule.refusal("engines") is not None
        assert not rule.health_shown() and not rule.engine_state_shown()
        assert "Left Engine" not in rule.screen("Left Engine is down")
        view = ChatView()
        await answer(second, tab2, "hello", view, thread_id="t2", user="alice")
        assert [w.key for w in view.waited] == ["blind_wait_reply"] and left_2.requests == []
        # Live engine load: another student waits while the round is open, a teacher does not.
        assert (await live_load_refusal(second, "compare", "bob", rule=bob.disclosure)).key == "panel_class_blind"
        assert await live_load_refusal(second, "compare", "teacher", rule=teacher.disclosure) is None
        assert reads.count("user:alice") <= 3  # read again on the change, not per view

        round_ = await round_task
        voted = await cast_vote(first, tab1, {"round_id": round_.round_id, "outcome": "tie"}, thread_id="t1",
                                user="alice", lang="en")
        assert voted.ok
        released_s = await until(lambda: _free(second, "user:alice"))
        print(f"its vote on app-1 released alice on app-2 after {released_s * 1000:.0f} ms")
        await until(lambda: _no_refusal(second, "bob", bob.disclosure))
    finally:
        await close(first, second)


async def _held(state, person: str) -> bool:
    return (await state.rule(person)).refusal("engines") is not None


async def _free(state, person: str) -> bool:
    rule = await state.rule(person)
    return rule.refusal("engines") is None and rule.reply_wait(["left", "right"]) is None


async def _no_refusal(state, user: str, rule: Disclosure) -> bool:
    return await live_load_refusal(state, "compare", user, rule=rule) is None


async def test_giving_a_round_up_on_one_replica_releases_the_replica_that_played_it(postgres_url):
    url = normalise_url(await new_postgres_database(postgres_url))
    (first, _, _), (second, _, right_2) = replica(url, "app-1"), replica(url, "app-2")
    try:
        await feed_live(first)
        await feed_live(second)
        tab1 = session_of(first, "user:alice")
        round_ = await play(first, tab1, "hello", Display(), thread_id="t1", user="alice", lang="en")
        assert tab1.disclosure.refusal("engines") is not None
        tab2 = session_of(second, "user:alice", mode="chat", backend="right")
        await until(lambda: _held(second, "user:alice"))
        notice = await give_up_rounds(second, tab2, ["right"])
        assert notice.key == "blind_given_up"
        await until(lambda: asyncio.sleep(0, tab1.disclosure.refusal("engines") is None))
        view = ChatView()
        await answer(second, tab2, "hello", view, thread_id="t2", user="alice")
        assert view.waited == [] and len(right_2.requests) == 1
        voted = await cast_vote(first, tab1, {"round_id": round_.round_id, "outcome": "win", "winner": "A"},
                                thread_id="t1", user="alice", lang="en")
        assert voted.ok and "kept but not rated" in voted.message
    finally:
        await close(first, second)


async def test_the_change_feed_comes_back_after_the_database_restarts(tmp_path, monkeypatch):
    monkeypatch.setenv("LAB_OUTBOX_DIR", str(tmp_path / "outbox"))
    cluster = PostgresCluster().start()
    try:
        url = normalise_url(await new_postgres_database(cluster.url))
        (first, _, _), (second, _, _) = replica(url, "app-1"), replica(url, "app-2")
        try:
            await feed_live(first)
            await feed_live(second)
            kept = await second.rule("user:alice")
            cluster.stop()
            await until(lambda: asyncio.sleep(0, not second.disclosures.feed_live), timeout_s=20)
            cluster.start()
            await until(lambda: asyncio.sleep(0, second.disclosures.feed_live), timeout_s=30)
            await until(lambda: asyncio.sleep(0, first.disclosures.feed_live), timeout_s=30)
            store = await first.storage()
            await until(lambda: _written(store), timeout_s=30)
            tab1 = session_of(first, "user:alice")
            await play(first, tab1, "after the restart", Display(), thread_id="t1", user="alice", lang="en")
            await until(lambda: _held(second, "user:alice"))
            assert kept.waiting_rounds == 1
        finally:
            await close(first, second)
    finally:
        cluster.remove()


async def _written(store: Store) -> bool:
    return not (store.outbox is not None and store.outbox.waiting)


async def test_schema_6_gives_older_rounds_their_logged_in_owner_and_the_rule_its_indexes(postgres_url):
    url = normalise_url(await new_postgres_database(postgres_url))
    store = await Store.open(url)
    try:
        await store.migrate()
        async with store._transaction() as connection:  # back to version 5's shape
            await connection.execute(text("DROP INDEX ix_compare_rounds_person"))
            await connection.execute(text("DROP INDEX ix_compare_rounds_mode_created_at"))
            for column in ("person", "speed_seen", "not_blind_reason"):
                await connection.execute(text(f"ALTER TABLE compare_rounds DROP COLUMN {column}"))
            await connection.execute(text("DELETE FROM schema_version"))
            await connection.execute(text("INSERT INTO schema_version (version, applied_at) VALUES (5, now())"))
            for round_id, user in (("with-login", "alice"), ("without", None)):
                await connection.execute(text(
                    "INSERT INTO compare_rounds (id, thread_id, user_identifier, created_at, prompt, mode, run_order) "
                    "VALUES (:id, 't', :user, now(), 'p', 'blind', 'concurrent')"), {"id": round_id, "user": user})
                for position, (label, backend) in enumerate((("A", "left"), ("B", "right"))):
                    await connection.execute(text(
                        "INSERT INTO round_columns (round_id, label, position, backend) VALUES (:id, :l, :p, :b)"),
                        {"id": round_id, "l": label, "p": position, "b": backend})
        assert await store.migrate() == schema.SCHEMA_VERSION >= 6
        assert [r.id for r in await store.waiting_blind_rounds("user:alice")] == ["with-login"]
        assert (await store.get_round("without")).person is None
        async with store._transaction() as connection:
            indexes = set((await connection.execute(text(
                "SELECT indexname FROM pg_indexes WHERE tablename = 'compare_rounds'"))).scalars())
        assert {"ix_compare_rounds_person", "ix_compare_rounds_mode_created_at"} <= indexes
        # A new round is kept with its person, and counts as open while it has no vote.
        await store.save_round(CompareRound(id="new", thread_id="t", user_identifier="bob", created_at=utc_now(),
                                            prompt="p", mode="blind", run_order="concurrent", person="user:bob",
                                            columns=(RoundColumn("A", "left"), RoundColumn("B", "right"))))
        assert await store.open_blind_rounds(utc_now().replace(year=2000)) == 3
        assert outbox_for(url).waiting == 0
    finally:
        await store.aclose()
