"""The database schema: Chainlit's history tables and the app's own.

Chainlit's `SQLAlchemyDataLayer` (2.12) writes raw SQL with quoted camelCase
column names, so its tables below mirror exactly the columns it reads and
writes. Ids are UUID strings stored as text on both databases; JSON is JSONB
on PostgreSQL and JSON text on SQLite; `tags` is a text array on PostgreSQL
and a JSON list on SQLite (ui/chat_history.py bridges what Chainlit sends).

The app's tables: `replies` (one per streamed answer, with its figures),
`compare_rounds` + `round_columns` (a compare or blind round and which backend
each column ran), `votes` (one per person per round, enforced by two unique
indexes), `capacity_sweeps` (a teacher's sweep from the engine panel), `login_attempts` (failed logins
counted for the login limits, shared by every replica: store/login_attempts.py),
`revoked_tokens` + `signed_out` (login tokens the app no longer accepts: store/revocations.py) and
`schema_version` (what `Store.migrate()` has applied).

Changing the schema: bump `SCHEMA_VERSION`. A new table or a new column needs
nothing else (migrate() creates missing tables and adds missing columns; a new
column must be nullable or have a server default). Anything else (renames,
type changes, data fixes) goes in `MIGRATION_STEPS[version]`.
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Callable

from sqlalchemy import (
    JSON,
    Boolean,
    Column,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    PrimaryKeyConstraint,
    Table,
    Text,
)
from sqlalchemy.dialects.postgresql import ARRAY, JSONB
from sqlalchemy.engine import Connection
from sqlalchemy.types import TypeDecorator

# 2: compare_rounds.revealed_view. 3: compare_rounds.reveal, votes.unrated_reason, one vote per
# person per round (the unique constraint on round_id becomes two unique indexes). 4: capacity_sweeps.
# 5: login_attempts. 6: compare_rounds.person, speed_seen and not_blind_reason (the blind rule per person,
# core/disclosure.py), filled in for older rounds with a logged-in owner; indexes for the rule's queries.
# 7: revoked_tokens and signed_out.
SCHEMA_VERSION = 7

JsonDocument = JSON().with_variant(JSONB(), "postgresql")
TextList = JSON().with_variant(ARRAY(Text()), "postgresql")


class UtcDateTime(TypeDecorator):
    """A timezone-aware datetime, stored in UTC, read back in UTC on both databases."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError(f"naive datetime {value!r}: pass a timezone-aware one, e.g. datetime.now(timezone.utc)")
        value = value.astimezone(timezone.utc)
        # SQLite has no time zones: keep the UTC wall time.
        return value.replace(tzinfo=None) if dialect.name == "sqlite" else value

    def process_result_value(self, value: datetime | None, dialect) -> datetime | None:
        if value is None:
            return None
        return value.replace(tzinfo=timezone.utc) if value.tzinfo is None else value.astimezone(timezone.utc)


metadata = MetaData()

# --- Chainlit's tables (chainlit/data/sql_alchemy.py in chainlit 2.12.0) -----

users = Table(
    "users", metadata,
    Column("id", Text, primary_key=True),
    Column("identifier", Text, nullable=False, unique=True),
    Column("createdAt", Text),
    Column("metadata", JsonDocument, nullable=False),
)

threads = Table(
    "threads", metadata,
    Column("id", Text, primary_key=True),
    Column("createdAt", Text),
    Column("name", Text),
    Column("userId", Text, ForeignKey("users.id", ondelete="CASCADE")),
    Column("userIdentifier", Text),
    Column("tags", TextList),
    Column("metadata", JsonDocument),
    Index("ix_threads_userId", "userId"),
)

steps = Table(
    "steps", metadata,
    Column("id", Text, primary_key=True),
    Column("name", Text, nullable=False),
    Column("type", Text, nullable=False),
    Column("threadId", Text, ForeignKey("threads.id", ondelete="CASCADE"), nullable=False),
    Column("parentId", Text),
    Column("command", Text),
    Column("modes", JsonDocument),
    Column("streaming", Boolean, nullable=False),
    Column("waitForAnswer", Boolean),
    Column("isError", Boolean),
    Column("metadata", JsonDocument),
    Column("tags", TextList),
    Column("input", Text),
    Column("output", Text),
    Column("createdAt", Text),
    Column("start", Text),
    Column("end", Text),
    Column("generation", JsonDocument),
    Column("showInput", Text),
    Column("language", Text),
    Column("defaultOpen", Boolean),
    Column("autoCollapse", Boolean),
    Index("ix_steps_threadId", "threadId"),
)

elements = Table(
    "elements", metadata,
    Column("id", Text, primary_key=True),
    Column("threadId", Text, ForeignKey("threads.id", ondelete="CASCADE")),
    Column("type", Text),
    Column("url", Text),
    Column("chainlitKey", Text),
    Column("name", Text, nullable=False),
    Column("display", Text),
    Column("objectKey", Text),
    Column("size", Text),
    Column("page", Integer),
    Column("autoPlay", Boolean),
    Column("playerConfig", JsonDocument),
    Column("language", Text),
    Column("forId", Text),
    Column("mime", Text),
    Column("props", JsonDocument),
    Index("ix_elements_threadId", "threadId"),
)

feedbacks = Table(
    "feedbacks", metadata,
    Column("id", Text, primary_key=True),
    Column("forId", Text, nullable=False),
    Column("threadId", Text, ForeignKey("threads.id", ondelete="CASCADE")),
    Column("value", Integer, nullable=False),
    Column("comment", Text),
    Index("ix_feedbacks_forId", "forId"),
)


# --- The app's tables -------------------------------------------------------

replies = Table(
    "replies", metadata,
    Column("id", Text, primary_key=True),  # the Chainlit step id of the reply message
    Column("thread_id", Text, index=True),  # no foreign key: a reply outlives a deleted chat
    Column("user_identifier", Text),
    Column("created_at", UtcDateTime, nullable=False, index=True),
    Column("backend", Text, nullable=False, index=True),
    Column("backend_label", Text, nullable=False),
    Column("model", Text, nullable=False),
    Column("mode", Text, nullable=False),
    Column("round_id", Text, index=True),
    Column("column_label", Text),
    Column("prompt", Text, nullable=False),
    Column("reply_text", Text, nullable=False),
    Column("status", Text, nullable=False),
    Column("first_token_s", Float),
    Column("decode_tokens_per_s", Float),
    Column("output_tokens", Integer, nullable=False),
    Column("total_s", Float, nullable=False),
    Column("ms_per_output_token", Float),
    Column("settings_sent", JsonDocument, nullable=False),
    Column("record", JsonDocument, nullable=False),
    Column("error", Text),
)

compare_rounds = Table(
    "compare_rounds", metadata,
    Column("id", Text, primary_key=True),
    Column("thread_id", Text, index=True),
    Column("user_identifier", Text),
    Column("created_at", UtcDateTime, nullable=False),
    Column("prompt", Text, nullable=False),
    Column("mode", Text, nullable=False),
    Column("run_order", Text, nullable=False),
    # How a blind round showed its text before the vote (finished | pace); None for compare rounds.
    Column("reveal", Text),
    # A round's element as it shows once voted on (names, models, figures), for a vote cast after
    # the chat was reopened. Kept here, never in Chainlit's elements table: the browser receives
    # those rows when the chat is reopened, and a blind round's names must wait for the vote.
    Column("revealed_view", JsonDocument),
    # Whose blind rule the round belongs to (core/disclosure.py): "user:<identifier>" with login,
    # "browser:<digest of the browser's id cookie>" without, "session:<id>" for a client without it.
    Column("person", Text, index=True),
    # A blind round stopped before every column ended: its partial texts were shown at once, and
    # their lengths tell which column was faster, so its vote saw speed (core.ratings). NULL: did not.
    Column("speed_seen", Boolean),
    # Its person chose to see something that could name its columns before voting (UNRATED_REASONS):
    # it is held no more, and a vote on it is kept but not rated. NULL: still blind.
    Column("not_blind_reason", Text),
    Index("ix_compare_rounds_mode_created_at", "mode", "created_at"),
)

round_columns = Table(
    "round_columns", metadata,
    Column("round_id", Text, ForeignKey("compare_rounds.id", ondelete="CASCADE"), nullable=False),
    Column("label", Text, nullable=False),
    Column("position", Integer, nullable=False),
    Column("backend", Text, nullable=False),
    Column("reply_id", Text, ForeignKey("replies.id")),
    PrimaryKeyConstraint("round_id", "label"),
)

votes = Table(
    "votes", metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("round_id", Text, ForeignKey("compare_rounds.id", ondelete="CASCADE"), nullable=False),
    Column("outcome", Text, nullable=False),
    Column("winner_label", Text),
    Column("judgements", JsonDocument, nullable=False),
    Column("comment", Text, nullable=False),
    Column("user_identifier", Text),
    Column("created_at", UtcDateTime, nullable=False),
    Column("unrated_reason", Text),  # kept but not rated (store.records.UNRATED_REASONS), else NULL
    Index("ix_votes_user_identifier_created_at", "user_identifier", "created_at"),  # the daily cap
)

# One vote per person per round, decided by the database so two concurrent casts cannot both
# win. With login on each vote names its voter: one per (round, voter). With login off there is
# one local user and no identifier (NULL, which a unique index never compares equal): the partial
# index keeps that to one vote per round.
ONE_VOTE_PER_VOTER = Index("uq_votes_round_id_user_identifier", votes.c.round_id, votes.c.user_identifier,
                           unique=True)
ONE_ANONYMOUS_VOTE = Index("uq_votes_round_id_anonymous", votes.c.round_id, unique=True,
                           sqlite_where=votes.c.user_identifier.is_(None),
                           postgresql_where=votes.c.user_identifier.is_(None))

# A teacher's capacity sweep from the engine panel: its conditions, its plain answer in both languages,
# and every level's figures (the same summary `python -m bench sweep` writes), listed for later.
capacity_sweeps = Table(
    "capacity_sweeps", metadata,
    Column("id", Text, primary_key=True),
    Column("created_at", UtcDateTime, nullable=False, index=True),
    Column("user_identifier", Text),
    Column("backend", Text, nullable=False),
    Column("backend_label", Text, nullable=False),
    Column("model", Text, nullable=False),
    Column("mode", Text, nullable=False),  # concurrency | rate
    Column("hardware", Text, nullable=False),
    Column("settings", JsonDocument, nullable=False),  # levels, requests, SLO, ...
    Column("answer_en", Text, nullable=False),
    Column("answer_zh", Text, nullable=False),
    Column("summary", JsonDocument, nullable=False),  # core.load.sweep_report.summary_json
    Column("interrupted", Boolean, nullable=False),
)

# Failed logins, counted per (name, address or browser) and per address (core/login_limits.py has the
# rules, store/login_attempts.py reads and writes it). Used on PostgreSQL, where replicas share it; on
# SQLite (one process) it exists and stays empty, the process keeps its own table.
# `key` is a keyed digest, never a name: people type passwords into the name field by mistake. Times
# are epoch seconds on the database's clock, the same for every replica.
login_attempts = Table(
    "login_attempts", metadata,
    Column("key", Text, primary_key=True),
    Column("failures", Integer, nullable=False),
    Column("last_failure_s", Float, nullable=False, index=True),  # the clean-up deletes by it
    Column("not_before_s", Float, nullable=False),
)

# Login tokens the app no longer accepts though their signature and time are good (core/revocations.py has
# the rule, store/revocations.py reads and writes them; every replica reads them every few seconds).
# A token that logged out, by its SHA-256 (never the token): kept until the token itself expires.
revoked_tokens = Table(
    "revoked_tokens", metadata,
    Column("digest", Text, primary_key=True),
    Column("expires_s", Float, nullable=False, index=True),  # the token's exp (epoch seconds); the clean-up deletes by it
)

# A person a teacher signed out: every token of theirs issued before `before_s` (epoch seconds) is refused.
signed_out = Table(
    "signed_out", metadata,
    Column("identifier", Text, primary_key=True),
    Column("before_s", Float, nullable=False),
)

schema_version = Table(
    "schema_version", metadata,
    Column("version", Integer, primary_key=True),
    Column("applied_at", UtcDateTime, nullable=False),
)


def _one_vote_per_voter(connection: Connection) -> None:
    """Version 3: the unique constraint on votes.round_id becomes the two unique indexes above.

    PostgreSQL drops the constraint by name. SQLite cannot drop a constraint, so the table is
    rebuilt: renamed, created anew in this shape, its rows copied, the old one dropped (nothing
    refers to votes, so the foreign keys stay as they are).
    """
    if connection.dialect.name == "postgresql":
        connection.exec_driver_sql("ALTER TABLE votes DROP CONSTRAINT IF EXISTS uq_votes_round_id")
        for index in votes.indexes:
            index.create(connection, checkfirst=True)
        return
    connection.exec_driver_sql("ALTER TABLE votes RENAME TO votes_before_v3")
    # Indexes move with a renamed table under their names: free the names for the new table.
    for index in votes.indexes:
        connection.exec_driver_sql(f'DROP INDEX IF EXISTS "{index.name}"')
    votes.create(connection)
    names = ", ".join(f'"{column.name}"' for column in votes.columns)
    connection.exec_driver_sql(f"INSERT INTO votes ({names}) SELECT {names} FROM votes_before_v3")
    connection.exec_driver_sql("DROP TABLE votes_before_v3")


def _rounds_per_person(connection: Connection) -> None:
    """Version 6: a round kept with a logged-in owner belongs to that person's blind rule (a round
    from before, without login, stays with its chat: without login there was no per-browser id yet).
    The indexes of the new columns and of the rule's queries, on a table that already existed."""
    connection.exec_driver_sql("UPDATE compare_rounds SET person = 'user:' || user_identifier "
                               "WHERE person IS NULL AND user_identifier IS NOT NULL")
    for index in compare_rounds.indexes:
        index.create(connection, checkfirst=True)


# Steps that bring an existing database from version N-1 to N, beyond adding
# tables and columns. Each takes the open (synchronous) connection.
MIGRATION_STEPS: dict[int, Callable[[Connection], None]] = {3: _one_vote_per_voter, 6: _rounds_per_person}
