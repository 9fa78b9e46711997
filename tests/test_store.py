"""The storage layer against a SQLite file and a real PostgreSQL cluster.

Every database test runs on both: a fresh SQLite file in tmp_path, and a fresh
database on the throwaway cluster from tests/fixtures_postgres.py. "Restart"
means closing the Store (its engine and every connection) and opening a new
one on the same URL, as the app does when it starts again.
"""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import sys
import uuid
from dataclasses import replace
from datetime import datetime, timedelta, timezone

import pytest
from sqlalchemy import insert, text
from sqlalchemy.exc import IntegrityError

from store import (
    SCHEMA_VERSION,
    CompareRound,
    ConfigurationError,
    DatabaseUnavailable,
    RoundColumn,
    RoundNotFound,
    SchemaTooNew,
    Store,
    StoredReply,
    Vote,
    VoteLimitReached,
    VoteRejected,
    database_url,
    names_in_comment,
    mask_password,
    normalise_url,
)
from store import schema
from store.db import create_engine
from store.urls import DEFAULT_SQLITE_PATH, REPO
from tests.fixtures_postgres import POSTGRES_PASSWORD, new_postgres_database

T0 = datetime(2025, 3, 1, 12, 0, 0, 123456, tzinfo=timezone.utc)


@pytest.fixture(params=["sqlite", "postgresql"])
async def db_url(request, tmp_path) -> str:
    """A normalised URL of an empty database of each kind."""
    if request.param == "sqlite":
        return normalise_url(f"sqlite:///{tmp_path}/serving_lab.db")
    return normalise_url(await new_postgres_database(request.getfixturevalue("postgres_url")))


@pytest.fixture
async def store(db_url):
    store = await Store.open(db_url)
    await store.migrate()
    yield store
    await store.aclose()


def new_id() -> str:
    return str(uuid.uuid4())


def make_reply(*, thread_id: str | None, backend: str = "vllm", mode: str = "chat", round_id: str | None = None,
               column_label: str | None = None, created_at: datetime = T0, status: str = "completed") -> StoredReply:
    return StoredReply(
        id=new_id(), thread_id=thread_id, user_identifier="alice", created_at=created_at,
        backend=backend, backend_label=backend.upper(), model="SmolLM2-135M-Instruct", mode=mode,
        round_id=round_id, column_label=column_label, prompt="Why is the sky blue? 天空",
        reply_text="Rayleigh scattering. 瑞利散射", status=status, first_token_s=0.25, decode_tokens_per_s=61.5,
        output_tokens=42, total_s=0.92, ms_per_output_token=16.3,
        settings_sent={"temperature": 0.7, "top_p": 0.9, "max_tokens": 256, "stop": None},
        record={"timeline_s": [0.25, 0.27, 0.3], "token_counts": [1, 2, 1], "server": {"ttft_s": 0.2}},
        error="stopped by user" if status == "stopped" else None,
    )


def make_round(*, thread_id: str | None = None, mode: str = "compare",
               backends: tuple[str, ...] = ("llama_cpp", "vllm", "tgi")) -> CompareRound:
    return CompareRound(
        id=new_id(), thread_id=thread_id, user_identifier="alice", created_at=T0,
        prompt="Compare me", mode=mode, run_order="concurrent",
        columns=tuple(RoundColumn(label=label, backend=backend) for label, backend in zip("ABCD", backends)),
    )


# --- schema and migrations ---------------------------------------------------

async def test_migrate_twice_is_harmless_and_records_the_version(db_url):
    async with await Store.open(db_url) as store:
        assert await store.schema_version() is None
        assert await store.migrate() == SCHEMA_VERSION
        reply = make_reply(thread_id=new_id())
        await store.save_reply(reply)
        assert await store.migrate() == SCHEMA_VERSION
        assert await store.schema_version() == SCHEMA_VERSION
        counts = await store.row_counts()
    assert set(counts) == set(schema.metadata.tables)
    assert counts["schema_version"] == 1 and counts["replies"] == 1


async def test_migrate_adds_a_column_missing_from_an_older_database(store, db_url):
    engine = create_engine(db_url)
    async with engine.begin() as connection:
        await connection.execute(text("ALTER TABLE replies DROP COLUMN error"))
    await engine.dispose()
    await store.migrate()
    reply = make_reply(thread_id=new_id(), status="stopped")
    await store.save_reply(reply)
    assert await store.replies_for_thread(reply.thread_id) == [reply]


async def test_a_database_from_a_newer_app_is_refused(store, db_url):
    engine = create_engine(db_url)
    async with engine.begin() as connection:
        await connection.execute(insert(schema.schema_version).values(version=SCHEMA_VERSION + 1, applied_at=T0))
    await engine.dispose()
    with pytest.raises(SchemaTooNew, match="newer than this app"):
        await store.migrate()


# --- survives a restart --------------------------------------------------------

async def test_reply_round_and_vote_survive_a_restart(db_url):
    thread_id = new_id()
    round_ = make_round(thread_id=thread_id)
    chat_reply = make_reply(thread_id=thread_id, created_at=T0 - timedelta(minutes=1))
    column_replies = [
        make_reply(thread_id=thread_id, backend=column.backend, mode="compare", round_id=round_.id,
                   column_label=column.label, created_at=T0 + timedelta(seconds=i))
        for i, column in enumerate(round_.columns)
    ]
    vote = Vote(round_id=round_.id, outcome="win", winner_label="B", judgements={"A": "bad", "B": "good"},
                comment="B was faster and right", user_identifier="alice", created_at=T0 + timedelta(minutes=2))

    async with await Store.open(db_url) as store:
        await store.migrate()
        await store.save_reply(chat_reply)
        await store.save_round(round_)
        for reply in column_replies:
            await store.save_reply(reply)
            await store.set_round_reply(round_.id, reply.column_label, reply.id)
        await store.cast_vote(vote)

    async with await Store.open(db_url) as store:  # the app starting again
        await store.migrate()
        assert await store.replies_for_thread(thread_id) == [chat_reply, *column_replies]
        saved_round = await store.get_round(round_.id)
        assert saved_round == replace(round_, columns=tuple(
            replace(column, reply_id=reply.id) for column, reply in zip(round_.columns, column_replies)))
        assert await store.rounds(thread_id=thread_id) == [saved_round]
        [record] = await store.votes()
        assert record.vote == vote
        assert record.mode == "compare"
        assert record.backends == ("llama_cpp", "vllm", "tgi")
        assert record.winner_backend == "vllm"
        assert chat_reply.created_at.tzinfo is not None
        with pytest.raises(VoteRejected, match="already has a vote"):
            await store.cast_vote(replace(vote, outcome="tie", winner_label=None))


async def test_a_blind_rounds_revealed_view_survives_a_restart_apart_from_the_round(db_url):
    round_ = make_round(thread_id=new_id(), mode="blind")
    view = {"kind": "compare", "roundId": round_.id, "revealed": True,
            "columns": [{"label": c.label, "backend": c.backend, "text": "答案 ✓"} for c in round_.columns]}
    async with await Store.open(db_url) as store:
        await store.migrate()
        await store.save_round(round_)
        assert await store.revealed_view(round_.id) is None
        await store.set_revealed_view(round_.id, view)
        with pytest.raises(RoundNotFound, match="does not exist"):
            await store.set_revealed_view(new_id(), view)
    async with await Store.open(db_url) as store:
        assert await store.revealed_view(round_.id) == view
        assert await store.get_round(round_.id) == round_  # the round itself carries no names
        assert await store.revealed_view(new_id()) is None


async def test_migrate_brings_a_version_1_database_to_the_revealed_view(store, db_url):
    engine = create_engine(db_url)
    async with engine.begin() as connection:
        await connection.execute(text("ALTER TABLE compare_rounds DROP COLUMN revealed_view"))
        await connection.execute(text("DELETE FROM schema_version"))
        await connection.execute(insert(schema.schema_version).values(version=1, applied_at=T0))
    await engine.dispose()
    assert await store.migrate() == SCHEMA_VERSION
    round_ = make_round(thread_id=new_id(), mode="blind")
    await store.save_round(round_)
    await store.set_revealed_view(round_.id, {"columns": []})
    assert await store.revealed_view(round_.id) == {"columns": []}


async def test_replies_newest_first_filtered_by_backend_and_time(store):
    thread_id = new_id()
    saved = [make_reply(thread_id=thread_id, backend=backend, created_at=T0 + timedelta(minutes=i))
             for i, backend in enumerate(["vllm", "tgi", "vllm", "llama_cpp"])]
    for reply in saved:
        await store.save_reply(reply)
    assert await store.replies() == saved[::-1]
    assert await store.replies(limit=2) == saved[:1:-1]
    assert await store.replies(backend="vllm") == [saved[2], saved[0]]
    assert await store.replies(since=T0 + timedelta(minutes=1)) == saved[:0:-1]
    # The same instant given in another time zone selects the same rows.
    tokyo = timezone(timedelta(hours=9))
    assert await store.replies(since=(T0 + timedelta(minutes=2)).astimezone(tokyo)) == saved[:1:-1]
    # The leaderboard's medians read the speed figures alone.
    speeds = await store.reply_speeds(limit=3)
    assert [(s.backend, s.status, s.first_token_s, s.decode_tokens_per_s) for s in speeds] == [
        ("llama_cpp", "completed", 0.25, 61.5), ("vllm", "completed", 0.25, 61.5), ("tgi", "completed", 0.25, 61.5)]


# --- votes ------------------------------------------------------------------

async def test_vote_for_an_unknown_round_is_rejected(store):
    missing = new_id()
    with pytest.raises(VoteRejected, match=f"Round {missing} does not exist"):
        await store.cast_vote(Vote(round_id=missing, outcome="tie"))
    assert await store.votes() == []


@pytest.mark.parametrize("vote_fields, message", [
    ({"outcome": "win", "winner_label": "Z"}, r"Winner 'Z' is not a column of round .* \(its columns: A, B, C\)"),
    ({"outcome": "win"}, "must name the winning column"),
    ({"outcome": "tie", "winner_label": "A"}, "'tie' vote has no winner"),
    ({"outcome": "landslide"}, "outcome 'landslide' is not one of win, tie, both_bad"),
    ({"outcome": "tie", "judgements": {"E": "good"}}, "Judgement for 'E', which is not a column"),
    ({"outcome": "tie", "judgements": {"A": "great"}}, "Judgement 'great' for column A is not one of good, bad"),
    ({"outcome": "win", "winner_label": "A", "judgements": {"A": "bad"}}, "cannot both win and be judged bad"),
    ({"outcome": "both_bad", "judgements": {"B": "good"}}, "cannot judge a column good"),
])
async def test_forged_votes_are_rejected_and_leave_the_round_open(store, vote_fields, message):
    round_ = make_round()
    await store.save_round(round_)
    with pytest.raises(VoteRejected, match=message):
        await store.cast_vote(Vote(round_id=round_.id, **vote_fields))
    await store.cast_vote(Vote(round_id=round_.id, outcome="both_bad", judgements={"A": "bad"}))
    assert [record.vote.outcome for record in await store.votes()] == ["both_bad"]


async def test_a_second_vote_is_rejected(store):
    round_ = make_round(mode="blind", backends=("vllm", "tgi"))
    await store.save_round(round_)
    await store.cast_vote(Vote(round_id=round_.id, outcome="win", winner_label="A"))
    with pytest.raises(VoteRejected, match=f"Round {round_.id} already has a vote; each round can be voted on once"):
        await store.cast_vote(Vote(round_id=round_.id, outcome="win", winner_label="B"))
    [record] = await store.votes()
    assert (record.mode, record.winner_backend) == ("blind", "vllm")


async def test_judgements_and_comments_reach_the_leaderboard(store):
    from core.ratings.battles import PromptCatalogue, battles_from_votes, rounds_from_battles
    from core.ratings.ratings import build_leaderboard

    three = make_round(mode="blind")  # A llama_cpp, B vllm, C tgi
    two = make_round(mode="blind", backends=("vllm", "tgi"))
    named = make_round(mode="compare")  # names visible: stored, not rated
    votes = [
        Vote(round_id=three.id, outcome="win", winner_label="B", judgements={"A": "bad", "B": "good", "C": "good"},
             comment="B was right", created_at=T0),
        Vote(round_id=two.id, outcome="both_bad", judgements={"A": "bad", "B": "bad"}, comment=" ",
             created_at=T0 + timedelta(seconds=1)),
        Vote(round_id=named.id, outcome="tie", judgements={"A": "good"}, comment="seen with names",
             created_at=T0 + timedelta(seconds=2)),
    ]
    for round_, vote in zip((three, two, named), votes):
        await store.save_round(round_)
        await store.cast_vote(vote)
    records = await store.votes()
    assert [record.verdicts for record in records] == [("bad", "good", "good"), ("bad", "bad"), ("good", None, None)]
    counted = [battle for battle in battles_from_votes(records, PromptCatalogue()) if battle.counted]
    board = build_leaderboard(rounds_from_battles(counted), [], bootstrap_samples=1)
    judged = {row.backend: (row.good_verdicts, row.bad_verdicts) for row in board.rows}
    assert judged == {"llama_cpp": (0, 1), "vllm": (1, 1), "tgi": (1, 1)}
    assert (board.total_votes, board.commented_votes) == (2, 1)


async def test_two_concurrent_votes_on_a_round_exactly_one_wins(store):
    round_ = make_round()
    await store.save_round(round_)
    outcomes = await asyncio.gather(
        *(store.cast_vote(Vote(round_id=round_.id, outcome="win", winner_label=label)) for label in "ABC"),
        return_exceptions=True,
    )
    assert sorted(type(outcome).__name__ for outcome in outcomes) == ["NoneType", "VoteRejected", "VoteRejected"]
    assert all("already has a vote" in str(outcome) for outcome in outcomes if outcome is not None)
    assert len(await store.votes()) == 1


async def test_the_database_itself_refuses_a_second_vote(store, db_url):
    round_ = make_round()
    await store.save_round(round_)
    await store.cast_vote(Vote(round_id=round_.id, outcome="tie"))
    engine = create_engine(db_url)
    try:
        with pytest.raises(IntegrityError):
            async with engine.begin() as connection:  # around the Store's checks
                await connection.execute(insert(schema.votes).values(
                    round_id=round_.id, outcome="tie", judgements={}, comment="", created_at=T0))
    finally:
        await engine.dispose()


async def test_one_vote_per_person_per_round_and_one_per_round_without_login(store):
    round_ = make_round(mode="blind", backends=("vllm", "tgi"))
    await store.save_round(round_)
    await store.cast_vote(Vote(round_id=round_.id, outcome="win", winner_label="A", user_identifier="alice"))
    with pytest.raises(VoteRejected, match="already has a vote from you; each person votes once per round"):
        await store.cast_vote(Vote(round_id=round_.id, outcome="tie", user_identifier="alice"))
    await store.cast_vote(Vote(round_id=round_.id, outcome="win", winner_label="B", user_identifier="bob"))
    # Login off: one local user without an identifier, so one vote per round.
    await store.cast_vote(Vote(round_id=round_.id, outcome="tie"))
    with pytest.raises(VoteRejected, match="already has a vote; each round can be voted on once"):
        await store.cast_vote(Vote(round_id=round_.id, outcome="both_bad"))
    assert [(r.vote.user_identifier, r.vote.outcome) for r in await store.votes()] == [
        ("alice", "win"), ("bob", "win"), (None, "tie")]


async def test_the_database_itself_keeps_one_vote_per_person(store, db_url):
    round_ = make_round()
    await store.save_round(round_)
    row = dict(round_id=round_.id, outcome="tie", judgements={}, comment="", created_at=T0)
    engine = create_engine(db_url)
    try:
        async with engine.begin() as connection:  # around the Store's checks
            for voter in ("alice", "bob", None):
                await connection.execute(insert(schema.votes).values(**row, user_identifier=voter))
        for voter in ("alice", None):  # a second vote by the same person, or a second without login
            await connection_insert_fails(engine, {**row, "user_identifier": voter})
    finally:
        await engine.dispose()


async def connection_insert_fails(engine, row: dict) -> None:
    """Inserting `row` into votes straight, around the Store, is refused by the database."""
    with pytest.raises(IntegrityError):
        async with engine.begin() as connection:
            await connection.execute(insert(schema.votes).values(**row))


async def test_a_daily_cap_counts_each_persons_votes_in_any_24_hours(store):
    rounds = [make_round(mode="blind", backends=("vllm", "tgi")) for _ in range(4)]
    for round_ in rounds:
        await store.save_round(round_)

    def ballot(round_, voter, hours):
        return Vote(round_id=round_.id, outcome="tie", user_identifier=voter, created_at=T0 + timedelta(hours=hours))

    await store.cast_vote(ballot(rounds[0], "alice", 0), votes_per_day=2)
    await store.cast_vote(ballot(rounds[1], "alice", 1), votes_per_day=2)
    with pytest.raises(VoteLimitReached, match=r"You have cast 2 votes in the last 24 hours.*VOTES_PER_DAY=2.*"
                                               r"you can vote again from 2025-03-02 12:00 UTC"):
        await store.cast_vote(ballot(rounds[2], "alice", 2), votes_per_day=2)
    await store.cast_vote(ballot(rounds[2], "bob", 2), votes_per_day=2)  # another person
    await store.cast_vote(ballot(rounds[2], None, 2), votes_per_day=2)  # login off: no person to count
    await store.cast_vote(ballot(rounds[2], "alice", 2))  # no cap
    # A day after her first vote, it no longer counts.
    await store.cast_vote(Vote(round_id=rounds[3].id, outcome="tie", user_identifier="alice",
                               created_at=T0 + timedelta(hours=24, seconds=1)), votes_per_day=3)
    assert len([r for r in await store.votes() if r.vote.user_identifier == "alice"]) == 4


async def test_concurrent_votes_of_one_person_never_pass_the_cap(store):
    rounds = [make_round(mode="blind", backends=("vllm", "tgi")) for _ in range(5)]
    for round_ in rounds:
        await store.save_round(round_)
    outcomes = await asyncio.gather(*(
        store.cast_vote(Vote(round_id=round_.id, outcome="tie", user_identifier="carol"), votes_per_day=2)
        for round_ in rounds), return_exceptions=True)
    assert sorted(type(outcome).__name__ for outcome in outcomes) == ["NoneType"] * 2 + ["VoteLimitReached"] * 3
    assert len(await store.votes()) == 2


async def test_votes_come_back_with_reveal_prompt_replies_and_whether_they_are_rated(store):
    round_ = replace(make_round(mode="blind", backends=("vllm", "tgi")), reveal="pace")
    await store.save_round(round_)
    reply = make_reply(thread_id=None, backend="vllm", mode="blind", round_id=round_.id, column_label="A")
    await store.save_reply(reply)
    await store.set_round_reply(round_.id, "A", reply.id)
    vote = Vote(round_id=round_.id, outcome="win", winner_label="A", comment="A is surely vLLM",
                unrated_reason="comment_names_backend", created_at=T0)
    await store.cast_vote(vote)
    assert (await store.get_round(round_.id)).reveal == "pace"
    [plain] = await store.votes()
    assert (plain.vote, plain.prompt, plain.reveal, plain.replies, plain.rated) == (
        vote, "Compare me", "pace", (), False)
    [full] = await store.votes(with_replies=True)
    first, second = full.replies
    assert second is None  # column B has no reply
    assert (first.reply_text, first.first_token_s, first.decode_tokens_per_s, first.output_tokens) == (
        reply.reply_text, 0.25, 61.5, 42)
    assert (first.backend_label, first.model, first.status, first.settings_sent) == (
        "VLLM", "SmolLM2-135M-Instruct", "completed", reply.settings_sent)
    with pytest.raises(ValueError, match="reveal is 'sometimes'"):
        replace(round_, reveal="sometimes")
    with pytest.raises(ValueError, match="unrated_reason is 'bored'"):
        replace(vote, unrated_reason="bored")


async def test_migrate_brings_a_version_2_database_to_one_vote_per_person(store, db_url):
    """A version-2 database (one vote per round by constraint, no reveal, no unrated_reason) keeps
    its votes and takes a second person's vote on the same round once migrated."""
    from sqlalchemy import Column, ForeignKey, Integer, MetaData, Table, Text, UniqueConstraint

    round_ = make_round(mode="blind", backends=("vllm", "tgi"))
    await store.save_round(round_)
    old = MetaData()
    Table("compare_rounds", old, Column("id", Text, primary_key=True))
    old_votes = Table(
        "votes", old,
        Column("id", Integer, primary_key=True, autoincrement=True),
        Column("round_id", Text, ForeignKey("compare_rounds.id", ondelete="CASCADE"), nullable=False),
        Column("outcome", Text, nullable=False), Column("winner_label", Text),
        Column("judgements", schema.JsonDocument, nullable=False), Column("comment", Text, nullable=False),
        Column("user_identifier", Text), Column("created_at", schema.UtcDateTime, nullable=False),
        UniqueConstraint("round_id", name="uq_votes_round_id"),
    )
    engine = create_engine(db_url)
    async with engine.begin() as connection:
        await connection.execute(text("DROP TABLE votes"))
        await connection.run_sync(lambda sync: old_votes.create(sync))
        await connection.execute(text("ALTER TABLE compare_rounds DROP COLUMN reveal"))
        await connection.execute(insert(old_votes).values(
            round_id=round_.id, outcome="win", winner_label="A", judgements={"A": "good"}, comment="A was right",
            user_identifier="alice", created_at=T0))
        await connection.execute(text("DELETE FROM schema_version"))
        await connection.execute(insert(schema.schema_version).values(version=2, applied_at=T0))
    await engine.dispose()

    assert await store.migrate() == SCHEMA_VERSION
    [kept] = await store.votes()
    assert (kept.vote.user_identifier, kept.vote.outcome, kept.vote.judgements, kept.rated) == (
        "alice", "win", {"A": "good"}, True)
    await store.cast_vote(Vote(round_id=round_.id, outcome="tie", user_identifier="bob"))
    with pytest.raises(VoteRejected, match="already has a vote from you"):
        await store.cast_vote(Vote(round_id=round_.id, outcome="tie", user_identifier="alice"))
    await store.cast_vote(Vote(round_id=round_.id, outcome="tie"))
    await store.cast_vote(Vote(round_id=round_.id, outcome="tie", user_identifier="dan"))
    assert len(await store.votes()) == 4
    engine = create_engine(db_url)
    try:
        await connection_insert_fails(engine, dict(round_id=round_.id, outcome="tie", judgements={}, comment="",
                                                   created_at=T0, user_identifier="bob"))
    finally:
        await engine.dispose()
    reveal_round = replace(make_round(mode="blind"), reveal="finished")
    await store.save_round(reveal_round)
    assert (await store.get_round(reveal_round.id)).reveal == "finished"


@pytest.mark.parametrize("comment, named", [
    ("vLLM was faster", ("vllm",)),
    ("I think A is TGI, B llama_cpp.", ("llama_cpp", "tgi")),
    ("vllm很快，答案也对", ("vllm",)),
    ("SmolLM2-135M-Instruct again?", ("SmolLM2-135M-Instruct",)),
    ("stgis and vllmx are not names; neither is 'tgi2'", ()),
    ("", ()),
])
def test_a_comment_that_names_a_backend_is_found(comment, named):
    identities = ["llama_cpp", "vllm", "tgi", "vLLM", "TGI", "", "SmolLM2-135M-Instruct"]
    assert names_in_comment(comment, identities) == named


async def test_stored_votes_export_as_battles_and_rate_the_same_read_back(store, tmp_path):
    from core.ratings.battles import PromptCatalogue, battles_from_votes, battles_jsonl, read_battles
    from core.ratings.board import board_json, build_board

    catalogue = PromptCatalogue({"Compare me": ("compare", "en")})
    for number, (outcome, winner, reveal) in enumerate([("win", "A", "pace"), ("win", "B", "finished"),
                                                         ("tie", None, "pace"), ("both_bad", None, None)]):
        round_ = replace(make_round(mode="blind"), reveal=reveal)  # A llama_cpp, B vllm, C tgi
        await store.save_round(round_)
        for column in round_.columns:
            reply = replace(make_reply(thread_id=None, backend=column.backend, mode="blind", round_id=round_.id,
                                       column_label=column.label), output_tokens=40 + 10 * number)
            await store.save_reply(reply)
            await store.set_round_reply(round_.id, column.label, reply.id)
        await store.cast_vote(Vote(round_id=round_.id, outcome=outcome, winner_label=winner, user_identifier="alice",
                                   created_at=T0 + timedelta(minutes=number)))
    battles = battles_from_votes(await store.votes(with_replies=True), catalogue)
    assert [len([b for b in battles if b.round_id == r]) for r in dict.fromkeys(b.round_id for b in battles)] == [
        2, 2, 3, 3]
    assert {b.category for b in battles} == {"compare"} and battles[0].a.tokens == 40
    assert battles[0].a.decode_tokens_per_s == 61.5 and battles[0].a.settings["temperature"] == 0.7
    path = tmp_path / "votes.jsonl"
    path.write_bytes(battles_jsonl(battles))
    assert read_battles(path) == battles
    assert board_json(build_board(read_battles(path), bootstrap_samples=50)) == board_json(
        build_board(battles, bootstrap_samples=50))


async def test_attaching_a_reply_to_an_unknown_round_or_column(store):
    round_ = make_round(backends=("vllm", "tgi"))
    await store.save_round(round_)
    reply = make_reply(thread_id=None, mode="compare", round_id=round_.id, column_label="A")
    await store.save_reply(reply)
    with pytest.raises(RoundNotFound, match=r"has no column 'C' \(its columns: A, B\)"):
        await store.set_round_reply(round_.id, "C", reply.id)
    with pytest.raises(RoundNotFound, match="does not exist"):
        await store.set_round_reply(new_id(), "A", reply.id)
    assert await store.get_round(new_id()) is None


# --- Chainlit's data layer on the same database --------------------------------

@pytest.mark.parametrize("with_file_storage", [False, True], ids=["no-file-storage", "file-storage"])
async def test_chainlit_history_on_the_same_database(store, db_url, monkeypatch, caplog, with_file_storage):
    """With or without a file storage service, a custom element (the figures) comes back with its chat."""
    import logging

    import chainlit.data
    from chainlit.context import init_http_context
    from chainlit.data.storage_clients.base import BaseStorageClient
    from chainlit.element import CustomElement
    from chainlit.types import Feedback, Pagination, ThreadFilter
    from chainlit.user import User

    from ui.chat_history import chainlit_data_layer

    class MemoryStorage(BaseStorageClient):
        """Chainlit keeps elements only through a storage client; this one keeps them in memory."""

        def __init__(self) -> None:
            self.files: dict[str, bytes | str] = {}

        async def upload_file(self, object_key, data, mime="application/octet-stream", overwrite=True,
                              content_disposition=None):
            self.files[object_key] = data
            return {"object_key": object_key, "url": f"memory://{object_key}"}

        async def delete_file(self, object_key):
            return self.files.pop(object_key, None) is not None

        async def get_read_url(self, object_key):
            return f"memory://{object_key}"

        async def close(self):
            pass

    storage = MemoryStorage()
    layer = chainlit_data_layer(db_url, storage_provider=storage if with_file_storage else None)
    # What @cl.data_layer gives the app; an HTTP context (as Chainlit's REST routes use) writes at once.
    monkeypatch.setattr(chainlit.data, "_data_layer", layer)
    monkeypatch.setattr(chainlit.data, "_data_layer_initialized", True)
    thread_id, user_step_id, reply_step_id = new_id(), new_id(), new_id()
    init_http_context(thread_id=thread_id, user=User(identifier="alice"))  # alice's own writes
    try:
        alice = await layer.create_user(User(identifier="alice", metadata={"role": "tester"}))
        bob = await layer.create_user(User(identifier="bob"))
        assert alice.metadata == {"role": "tester"}
        assert (await layer.get_user("alice")).id == alice.id

        await layer.update_thread(thread_id, name="Why is the sky blue?", user_id=alice.id,
                                  metadata={"chat_settings": {"backend": "vllm"}}, tags=["compare"])
        await layer.create_step({
            "id": user_step_id, "threadId": thread_id, "name": "alice", "type": "user_message",
            "output": "Why is the sky blue?", "createdAt": "2025-03-01T12:00:00.000Z",
            "start": "2025-03-01T12:00:00.000Z", "end": "2025-03-01T12:00:00.000Z",
            "streaming": False, "isError": False, "waitForAnswer": False, "metadata": {}, "tags": None,
        })
        await layer.create_step({
            "id": reply_step_id, "threadId": thread_id, "parentId": None, "name": "vLLM",
            "type": "assistant_message", "output": "Rayleigh scattering. 瑞利散射",
            "createdAt": "2025-03-01T12:00:01.000Z", "start": "2025-03-01T12:00:01.000Z",
            "end": "2025-03-01T12:00:02.000Z", "streaming": False, "isError": False, "waitForAnswer": False,
            "metadata": {"backend": "vllm", "first_token_s": 0.25}, "tags": ["reply"], "modes": {"engine": "vllm"},
        })
        reply = make_reply(thread_id=thread_id)
        await store.save_reply(replace(reply, id=reply_step_id))
        figures = CustomElement(name="Metrics", props={"first_token_s": 0.25, "decode_tokens_per_s": 61.5},
                                display="inline", for_id=reply_step_id, thread_id=thread_id)
        await layer.create_element(figures)
        feedback_id = await layer.upsert_feedback(Feedback(forId=reply_step_id, threadId=thread_id, value=1,
                                                           comment="fast"))

        alices = await layer.list_threads(Pagination(first=20), ThreadFilter(userId=alice.id))
        assert [thread["id"] for thread in alices.data] == [thread_id]
        bobs = await layer.list_threads(Pagination(first=20), ThreadFilter(userId=bob.id))
        assert bobs.data == []
        assert await layer.get_thread_author(thread_id) == "alice"

        thread = await layer.get_thread(thread_id)
        assert thread["name"] == "Why is the sky blue?"
        assert thread["metadata"] == {"chat_settings": {"backend": "vllm"}}
        assert thread["tags"] == ["compare"]
        user_step, reply_step = thread["steps"]
        assert (user_step["id"], user_step["type"], user_step["output"]) == (
            user_step_id, "user_message", "Why is the sky blue?")
        assert (reply_step["id"], reply_step["output"]) == (reply_step_id, "Rayleigh scattering. 瑞利散射")
        assert reply_step["metadata"] == {"backend": "vllm", "first_token_s": 0.25}
        assert reply_step["tags"] == ["reply"]
        assert reply_step["streaming"] is False and reply_step["isError"] is False
        assert reply_step["feedback"] == {"forId": reply_step_id, "id": feedback_id, "value": 1, "comment": "fast"}
        [element] = thread["elements"]
        assert (element["id"], element["forId"], element["name"]) == (figures.id, reply_step_id, "Metrics")
        assert element["props"] == {"first_token_s": 0.25, "decode_tokens_per_s": 61.5}
        assert element["type"] == "custom"
        assert bool(storage.files) == with_file_storage
        # Written again (the final figures after the live ones): one element, the newest props.
        figures.props = {"first_token_s": 0.25, "decode_tokens_per_s": 60.0, "state": "completed"}
        await layer.create_element(figures)
        [element] = (await layer.get_thread(thread_id))["elements"]
        assert element["props"]["decode_tokens_per_s"] == 60.0

        # The app's reply row and Chainlit's message share the step id.
        assert [saved.id for saved in await store.replies_for_thread(thread_id)] == [reply_step_id]

        # Chainlit's layer logs and swallows every SQL error: a silent failure would show here.
        assert [record.getMessage() for record in caplog.records if record.levelno >= logging.WARNING] == []

        await layer.delete_thread(thread_id)
        assert await layer.get_thread(thread_id) is None
        assert (await store.row_counts())["feedbacks"] == 0
        assert storage.files == {}
        # A reply's figures outlive the deleted chat (they feed the leaderboard).
        assert len(await store.replies_for_thread(thread_id)) == 1
        assert [record.getMessage() for record in caplog.records if record.levelno >= logging.WARNING] == []
    finally:
        await layer.close()


# --- configuration -----------------------------------------------------------

@pytest.mark.parametrize("given, expected", [
    ("postgresql://u:pw@db.example:5432/lab", "postgresql+asyncpg://u:pw@db.example:5432/lab"),
    ("postgres://u:pw@db.example/lab", "postgresql+asyncpg://u:pw@db.example/lab"),
    ("postgresql+asyncpg://u@db.example/lab?ssl=require", "postgresql+asyncpg://u@db.example/lab?ssl=require"),
    ("sqlite:////var/lib/lab/lab.db", "sqlite+aiosqlite:////var/lib/lab/lab.db"),
    ("sqlite+aiosqlite:////var/lib/lab/lab.db", "sqlite+aiosqlite:////var/lib/lab/lab.db"),
    ("sqlite:///.data/other.db", f"sqlite+aiosqlite:///{REPO}/.data/other.db"),
])
def test_urls_are_normalised_to_the_async_drivers(given, expected):
    assert normalise_url(given) == expected


@pytest.mark.parametrize("given, message", [
    ("mysql://u:hunter2@h/db", "'mysql', which this app does not support. Use one of: sqlite:///"),
    ("postgresql+psycopg2://u:hunter2@h/db", "'postgresql+psycopg2', which this app does not support"),
    ("postgresql://u:hunter2@h", "names no database"),
    ("sqlite:///:memory:", "in-memory SQLite"),
    ("sqlite://", "in-memory SQLite"),
    ("not a url", "is not a database URL"),
])
def test_unusable_urls_say_what_to_use_and_hide_the_password(given, message):
    with pytest.raises(ConfigurationError, match=re.escape(message)) as raised:
        normalise_url(given)
    assert "hunter2" not in str(raised.value)


def test_default_is_the_sqlite_file_in_the_repository():
    assert database_url({}) == f"sqlite+aiosqlite:///{DEFAULT_SQLITE_PATH}"
    assert database_url({"DATABASE_URL": "  "}) == f"sqlite+aiosqlite:///{DEFAULT_SQLITE_PATH}"
    assert DEFAULT_SQLITE_PATH == REPO / ".data" / "serving_lab.db"
    assert database_url({"DATABASE_URL": "postgres://u:pw@h/lab"}) == "postgresql+asyncpg://u:pw@h/lab"


def test_passwords_are_masked():
    assert mask_password("postgresql+asyncpg://lab:s3cr%40t@h:5432/lab") == "postgresql+asyncpg://lab:***@h:5432/lab"
    assert mask_password("postgresql://lab@h/lab") == "postgresql://lab@h/lab"
    assert mask_password("sqlite+aiosqlite:////tmp/x.db") == "sqlite+aiosqlite:////tmp/x.db"


async def test_an_unreachable_database_is_a_clear_error(postgres_url, tmp_path):
    from tests.fixtures_app import closed_loopback_port

    with pytest.raises(DatabaseUnavailable, match=r"Cannot open the database at postgresql\+asyncpg://postgres:\*\*\*@") as raised:
        await Store.open(f"postgresql://postgres:{POSTGRES_PASSWORD}@127.0.0.1:{closed_loopback_port()}/lab")
    assert POSTGRES_PASSWORD not in str(raised.value)
    wrong_password = postgres_url.replace(POSTGRES_PASSWORD, "wrong-password")
    with pytest.raises(DatabaseUnavailable, match="password authentication failed") as raised:
        await Store.open(wrong_password)
    assert "wrong-password" not in str(raised.value)
    (tmp_path / "a-file").write_text("not a folder")
    with pytest.raises(DatabaseUnavailable, match="Cannot open the database at sqlite"):
        await Store.open(f"sqlite:///{tmp_path}/a-file/lab.db")


async def test_open_without_a_url_reads_database_url(tmp_path, monkeypatch):
    monkeypatch.setenv("DATABASE_URL", f"sqlite:///{tmp_path}/from-env/lab.db")
    async with await Store.open() as store:
        assert store.url == f"sqlite+aiosqlite:///{tmp_path}/from-env/lab.db"
        await store.migrate()
    assert (tmp_path / "from-env" / "lab.db").is_file()


def test_init_and_info_commands(db_url):
    env = {**os.environ, "DATABASE_URL": db_url}
    run = [sys.executable, "-m", "store"]
    info = subprocess.run([*run, "info"], env=env, cwd=REPO, capture_output=True, text=True, timeout=60)
    assert info.returncode == 0, info.stderr
    assert "not initialised: run `python -m store init`" in info.stdout
    init = subprocess.run([*run, "init"], env=env, cwd=REPO, capture_output=True, text=True, timeout=60)
    assert init.returncode == 0, init.stderr
    assert f"(schema version {SCHEMA_VERSION})" in init.stdout
    info = subprocess.run([*run, "info"], env=env, cwd=REPO, capture_output=True, text=True, timeout=60)
    assert f"Schema version: {SCHEMA_VERSION}\n" in info.stdout
    assert "  replies                0 rows" in info.stdout
    assert POSTGRES_PASSWORD not in info.stdout + init.stdout
    bad = subprocess.run([*run, "info"], env={**env, "DATABASE_URL": "mysql://u:hunter2@h/db"}, cwd=REPO,
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 1 and "does not support" in bad.stderr and "hunter2" not in bad.stderr


# --- capacity sweeps -----------------------------------------------------------


async def test_a_capacity_sweep_is_stored_with_its_answer_and_listed_newest_first(store):
    from store import StoredSweep

    def sweep(backend: str, minutes: int) -> StoredSweep:
        return StoredSweep(
            id=new_id(), created_at=T0 + timedelta(minutes=minutes), user_identifier="teacher", backend=backend,
            backend_label=backend.upper(), model="SmolLM2-135M-Instruct", mode="concurrency",
            hardware="2 cores; no GPU", settings={"levels": [1, 2, 4], "slo": {"ttft_ms": 500, "tpot_ms": 50}},
            answer_en="vLLM: up to 4 people at once keep …", answer_zh="vLLM：最多 4 人同时使用时…",
            summary={"engines": [{"levels": [{"level": 1.0, "slo_share": 1.0}]}]}, interrupted=minutes == 2)

    first, second, other = sweep("vllm", 1), sweep("vllm", 2), sweep("tgi", 3)
    for row in (first, second, other):
        await store.save_sweep(row)
    listed = await store.sweeps()
    assert [s.id for s in listed] == [other.id, second.id, first.id]
    assert listed[1] == second and listed[1].answer("zh").startswith("vLLM：最多 4 人")
    assert [s.id for s in await store.sweeps(backend="vllm", limit=1)] == [second.id]
    assert (await store.row_counts())["capacity_sweeps"] == 3
    with pytest.raises(ValueError, match="mode"):
        replace(first, mode="users")
