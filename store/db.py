"""The app's database: open it, migrate it, save and read replies, rounds and votes.

    store = await Store.open()        # DATABASE_URL, or .data/serving_lab.db
    await store.migrate()             # idempotent; the app calls it at startup
    await store.save_reply(reply)
    await store.aclose()

Chainlit's history uses the same database through `ui.chat_history`.
Nothing here imports Chainlit.
"""

from __future__ import annotations

import asyncio
import os
from collections import defaultdict
from contextlib import asynccontextmanager
from dataclasses import asdict, fields, replace
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, AsyncIterator, Awaitable, Callable, Iterable
from urllib.parse import quote

from sqlalchemy import event, func, insert, inspect, select, text, update
from sqlalchemy.engine import Connection, make_url
from sqlalchemy.exc import DBAPIError, IntegrityError, SQLAlchemyError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, create_async_engine
from sqlalchemy.pool import NullPool
from sqlalchemy.schema import CreateColumn

from store import schema
from store.changes import ChangeFeed
from store.locks import HeldLock, LockKey, lock_holders, try_lock
from store.errors import (ConfigurationError, DatabaseUnavailable, RoundNotFound, RowRefused, SavedLater,
                          SchemaTooNew, StoreError, VoteLimitReached, VoteRejected)
from store.faults import Fault, classify, clean, first_line, transient_reason
from store.outbox import Outbox, Refused, Unavailable, outbox_for
from store.records import (UNRATED_CLOSED_BY_TEACHER, UNRATED_REASONS, ColumnReply, CompareRound, ReplySpeed, RoundColumn, StoredReply,
                           StoredSweep, Vote, VoteRecord, check_vote, utc_now)
from store.urls import database_url, mask_password, normalise_url

SQLITE_BUSY_TIMEOUT_MS = 10_000
# A PostgreSQL that does not answer (stopped, unreachable, hung: a paused server accepts
# connections and never replies) must cost a write seconds, then the row waits in the outbox;
# without these a hung server held every request, a blind round's start included, for good.
CONNECT_TIMEOUT_VARIABLE = "DATABASE_CONNECT_TIMEOUT_S"
STATEMENT_TIMEOUT_VARIABLE = "DATABASE_STATEMENT_TIMEOUT_S"
DEFAULT_CONNECT_TIMEOUT_S = 5.0
DEFAULT_STATEMENT_TIMEOUT_S = 5.0
# The client gives up this long after the server's own statement timeout would have answered.
CLIENT_GRACE_S = 1.0
# Creating or migrating tables (and waiting for another replica doing so) may take longer.
MIGRATION_TIMEOUT_S = 120.0
# Any constant works; it only has to be the same for every process migrating this database.
_POSTGRES_MIGRATION_LOCK = 7_311_999
_REASON_CHARS = 160
# With the voter's hash as the second key: one person's votes are cast one at a time (the daily cap).
_POSTGRES_VOTER_LOCK = 7_312_000
VOTE_CAP_WINDOW = timedelta(hours=24)
# PostgreSQL's NOTIFY channel for changes of a person's blind rounds (a blind round kept, voted on or
# given up), with the person's key as payload: every replica listening drops its cached answer for
# that person (core/disclosure.py, store/changes.py). Sent in the transaction of the change itself.
BLIND_CHANNEL = "serving_lab_blind"


# ---------------------------------------------------------------- engines


def sqlite_path(url: str) -> Path | None:
    """The file of a SQLite URL (None for another database)."""
    parsed = make_url(url)
    return Path(parsed.database) if parsed.get_backend_name() == "sqlite" else None


def timeouts_s() -> tuple[float, float]:
    """(connect, statement) timeouts in seconds, from DATABASE_CONNECT_TIMEOUT_S and
    DATABASE_STATEMENT_TIMEOUT_S (defaults 5 and 5; a value that is not a positive number is ignored)."""
    return (_seconds(CONNECT_TIMEOUT_VARIABLE, DEFAULT_CONNECT_TIMEOUT_S),
            _seconds(STATEMENT_TIMEOUT_VARIABLE, DEFAULT_STATEMENT_TIMEOUT_S))


def _seconds(variable: str, default: float) -> float:
    try:
        value = float((os.environ.get(variable) or "").strip() or default)
    except ValueError:
        return default
    return value if value > 0 else default


def postgres_connect_args(statement_timeout_s: float | None = None) -> dict[str, Any]:
    """asyncpg's connection arguments with every timeout set: connecting, each command on the client
    (a hung server never answers), and the server's own statement timeout (a live but stuck server
    cancels the statement itself and says so)."""
    connect_s, statement_s = timeouts_s()
    statement_s = statement_timeout_s or statement_s
    return {"timeout": connect_s, "command_timeout": statement_s + CLIENT_GRACE_S,
            "server_settings": {"statement_timeout": str(int(statement_s * 1000))}}


def create_engine(url: str, *, immediate_transactions: bool = False, create_file: bool = False,
                  statement_timeout_s: float | None = None) -> AsyncEngine:
    """An async engine for a normalised URL, made so that a fault cannot lose or leak a row.

    - Parameters are hidden from every error message (`hide_parameters`): no row's values in a
      message, a log line or (through an error) a browser.
    - SQLite: a connection per transaction (NullPool) that opens the file read-write but never
      creates it (`mode=rw`; `create_file` only where the tables are made: start-up, `python -m
      store init`), so a file that disappeared under the app is an error, not a new empty database
      or writes into the deleted file's ghost, and a file that became unwritable fails at once.
    - PostgreSQL: a pooled connection is tested before use (`pool_pre_ping`), so a restarted
      server is reconnected to; connecting, waiting for a pooled connection and every statement
      give up after a few seconds (`timeouts_s`; `statement_timeout_s` for a longer one).
    """
    path = sqlite_path(url)
    if path is not None:
        if create_file:
            path.parent.mkdir(parents=True, exist_ok=True)
        mode = "rwc" if create_file else "rw"
        engine = create_async_engine(f"sqlite+aiosqlite:///file:{quote(str(path))}?mode={mode}&uri=true",
                                     hide_parameters=True, poolclass=NullPool)
    else:
        engine = create_async_engine(url, hide_parameters=True, pool_pre_ping=True, pool_timeout=timeouts_s()[0],
                                     connect_args=postgres_connect_args(statement_timeout_s))
    configure_engine(engine, immediate_transactions=immediate_transactions)
    return engine


def configure_engine(engine: AsyncEngine, *, immediate_transactions: bool = False) -> None:
    """On SQLite, for two engines (app and Chainlit) sharing one file: foreign keys are enforced
    (as on PostgreSQL), WAL lets readers run beside the writer, a busy timeout replaces instant
    "database is locked", and with `immediate_transactions` every transaction takes the write lock
    at BEGIN, so a check-then-insert (one vote per round) cannot interleave with another."""
    if engine.dialect.name != "sqlite":
        return

    @event.listens_for(engine.sync_engine, "connect")
    def _configure_sqlite(dbapi_connection, _record) -> None:
        if immediate_transactions:
            dbapi_connection.isolation_level = None  # BEGIN is emitted below instead
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.close()

    if immediate_transactions:
        @event.listens_for(engine.sync_engine, "begin")
        def _begin_immediate(connection) -> None:
            connection.exec_driver_sql("BEGIN IMMEDIATE")


# ---------------------------------------------------------------- faults at the edge


def unavailable_reason(error: BaseException) -> str | None:
    """Why the database did not answer, in words safe to show anyone (never SQL or values), or None
    when `error` is not about the database being unavailable (store.faults decides)."""
    return transient_reason(error)


def safe_message(error: BaseException) -> str:
    """The driver's own message, first line only: SQLAlchemy's text would add the statement."""
    return first_line(error)


# Everything a write can raise that is about the database or the row, not a bug of the app: the
# driver's errors, a connection's (OSError, timeouts) and a value the driver cannot encode.
WRITE_ERRORS = (SQLAlchemyError, OSError, asyncio.TimeoutError, UnicodeError)


@asynccontextmanager
async def transaction(engine: AsyncEngine) -> AsyncIterator[AsyncConnection]:
    """`engine.begin()`, with an unavailable database raised as `DatabaseUnavailable` (a safe message)."""
    try:
        async with engine.begin() as connection:
            yield connection
    except StoreError:
        raise
    except (SQLAlchemyError, OSError, asyncio.TimeoutError) as error:
        reason = unavailable_reason(error)
        if reason is None:
            raise
        raise DatabaseUnavailable(f"the database is unavailable ({reason})") from error


async def write_or_classify(engine: AsyncEngine, work: Callable[[AsyncConnection], Awaitable[Any]]) -> Any:
    """Run `work` in one transaction; raise `Unavailable` (wait and retry) or `Refused` (set aside)
    when it fails, as store.faults classifies the failure. Errors the work raises on purpose
    (StoreError) pass through."""
    try:
        async with engine.begin() as connection:
            return await work(connection)
    except StoreError:
        raise
    except WRITE_ERRORS as error:
        fault = classify(error)
        if fault.transient:
            raise Unavailable(fault.reason) from error
        raise Refused(fault) from error


# ---------------------------------------------------------------- writes as data (what the outbox keeps)


def insert_row(table: str, values: dict[str, Any]) -> dict:
    """An INSERT as data, its values cleaned of what a database refuses (store.faults.clean)."""
    return {"table": table, "insert": _cleaned(values)}


def update_rows(table: str, where: dict[str, Any], values: dict[str, Any]) -> dict:
    """An UPDATE as data, its values cleaned like `insert_row`'s."""
    return {"table": table, "where": where, "update": _cleaned(values)}


def notify_blind(person: str) -> dict:
    """A NOTIFY on BLIND_CHANNEL as data (nothing on SQLite, where the app is one process)."""
    return {"notify": BLIND_CHANNEL, "payload": person}


def _cleaned(values: dict[str, Any]) -> dict[str, Any]:
    return {column: clean(value) if isinstance(value, (str, dict, list)) else value for column, value in values.items()}


async def run_statements(connection: AsyncConnection, statements: Iterable[dict]) -> list[int]:
    """Execute table statements (`insert_row`, `update_rows`, `notify_blind`) in order; the rows each touched."""
    counts = []
    for statement in statements:
        if "notify" in statement:
            if connection.dialect.name == "postgresql":
                await connection.execute(text("SELECT pg_notify(:channel, :payload)"),
                                         {"channel": statement["notify"], "payload": statement["payload"]})
            counts.append(0)
            continue
        table = schema.metadata.tables[statement["table"]]
        if "insert" in statement:
            result = await connection.execute(insert(table).values(**statement["insert"]))
        else:
            conditions = [table.c[column] == value for column, value in statement["where"].items()]
            result = await connection.execute(update(table).where(*conditions).values(**statement["update"]))
        counts.append(result.rowcount)
    return counts


async def replay(engine: AsyncEngine, entry: dict) -> None:
    """Write one outbox entry: the app's table statements, one of Chainlit's SQL statements, or a
    change of a chat's thread row (store.history). Raises `Unavailable` or `Refused` (store.outbox)."""
    from store.history import apply_thread_change

    async def work(connection: AsyncConnection) -> None:
        if "statements" in entry:
            await run_statements(connection, entry["statements"])
        elif "thread" in entry:
            await apply_thread_change(connection, entry["thread"])
        else:
            await connection.execute(text(entry["sql"]), entry["parameters"])

    try:
        await write_or_classify(engine, work)
    except (KeyError, TypeError, ValueError) as malformed:  # an entry no version of the app could write
        raise Refused(Fault(False, f"not a writable outbox entry ({type(malformed).__name__})",
                            str(malformed)[:160])) from malformed


class Store:
    """The app's storage on one database (SQLite file or PostgreSQL).

    Reads raise `DatabaseUnavailable` when the database does not answer. Writes
    of replies and rounds are never lost to a fault: a write the database
    cannot take now waits in the outbox (`store.outbox`) and `SavedLater` says
    so; a vote is refused instead (it is checked against its round).
    """

    def __init__(self, engine: AsyncEngine, url: str, outbox: Outbox | None = None) -> None:
        """Prefer `await Store.open(url)`, which checks the connection."""
        self._engine = engine
        self.url = url
        self.outbox = outbox
        self._feeds: list[ChangeFeed] = []

    @classmethod
    async def open(cls, url: str | None = None, *, create: bool = True, flush_outbox: bool = True) -> "Store":
        """Connect to `url` (default: `DATABASE_URL`, else the SQLite file); raise `DatabaseUnavailable`
        if that fails. `create`: a missing SQLite file is made (to be migrated); the running app's
        writes never make one (see `create_engine`). `flush_outbox`: write the rows that wait in the
        outbox in the background from now on (a one-off migration does not; the app opens with False,
        migrates, then calls `start_outbox`, so no waiting row is written before its table exists)."""
        url = normalise_url(url) if url else database_url()
        store: Store | None = None
        try:
            if create and sqlite_path(url) is not None:
                bootstrap = create_engine(url, create_file=True)
                try:
                    async with bootstrap.begin() as connection:
                        await connection.execute(text("SELECT 1"))
                finally:
                    await bootstrap.dispose()
            store = cls(create_engine(url, immediate_transactions=True), url, outbox_for(url))
            async with store._engine.connect() as connection:
                await connection.execute(text("SELECT 1"))
        except (DBAPIError, OSError) as error:  # OSError: refused connection, or no folder for the SQLite file
            if store is not None:
                await store.aclose()
            raise DatabaseUnavailable(
                f"Cannot open the database at {mask_password(url)}: {safe_message(error)}. "
                "Check DATABASE_URL in .env (and that the PostgreSQL server is running, if it is one)."
            ) from error
        if flush_outbox:
            store.start_outbox()
        return store

    @classmethod
    def waiting(cls, url: str | None = None) -> "Store":
        """A store on a database that did not answer when opened: nothing is checked, its writes wait
        in the outbox while the database is unavailable (its reads raise DatabaseUnavailable), and
        nothing is written from the outbox (that starts with a store opened and migrated)."""
        url = normalise_url(url) if url else database_url()
        return cls(create_engine(url, immediate_transactions=True), url, outbox_for(url))

    @property
    def masked_url(self) -> str:
        """The URL with its password hidden, safe to print."""
        return mask_password(self.url)

    async def aclose(self) -> None:
        """Close every connection; the Store cannot be used afterwards (rows waiting in the outbox
        stay there, for the next Store on this database)."""
        for feed in self._feeds:
            await feed.stop()
        if self.outbox is not None:
            await self.outbox.stop(self._engine)
        await self._engine.dispose()

    async def __aenter__(self) -> "Store":
        return self

    async def __aexit__(self, *exc) -> None:
        await self.aclose()

    def _transaction(self):
        return transaction(self._engine)

    async def _write(self, statements: list[dict],
                     check: Callable[[AsyncConnection, list[int]], Awaitable[None]] | None = None) -> None:
        """Write `statements` in one transaction. When the database is unavailable (or earlier rows
        still wait, to keep their order) keep them in the outbox and raise `SavedLater`; when it
        refuses them for what they hold, set them aside in the dead-letter file and raise `RowRefused`
        (nothing waits for them)."""
        outbox = self.outbox
        if outbox is not None and outbox.waiting:
            self._keep(statements, outbox.problem or "earlier rows still wait to be written")

        async def work(connection: AsyncConnection) -> None:
            counts = await run_statements(connection, statements)
            if check is not None:
                await check(connection, counts)

        try:
            await write_or_classify(self._engine, work)
        except Unavailable as unavailable:
            if outbox is None:
                raise DatabaseUnavailable(f"the database is unavailable ({unavailable})") from unavailable
            self._keep(statements, str(unavailable))
        except Refused as refused:
            dead_letter = None
            if outbox is not None:
                outbox.set_aside({"statements": statements}, refused.fault)
                dead_letter = outbox.dead_letter_path
            raise RowRefused(refused.fault.reason, str(dead_letter) if dead_letter else None) from refused

    def _keep(self, statements: list[dict], problem: str) -> None:
        waiting = self.outbox.put({"statements": statements}, problem)
        raise SavedLater(problem.strip("()"), waiting)

    def start_outbox(self) -> None:
        """Write the rows that wait in the outbox in the background from now on (once the tables
        exist: a row written before its table would be refused)."""
        if self.outbox is not None:
            engine = self._engine
            self.outbox.start(lambda entry: replay(engine, entry), owner=engine)

    # --- locks across app processes (PostgreSQL) -------------------------

    @property
    def shared_locks(self) -> bool:
        """Whether locks taken here hold across app processes (PostgreSQL); on SQLite they do not exist."""
        return self._engine.dialect.name == "postgresql"

    async def try_lock(self, key: LockKey, name: str) -> HeldLock | None:
        """Take `key` for this process on a connection of its own, named `name` (see store.locks);
        None when another process holds it."""
        return await try_lock(self.url, key, name)

    def listen(self, channel: str, *, on_change: Callable[[str], None], on_lost: Callable[[], None]) -> ChangeFeed | None:
        """Hear every NOTIFY on `channel` from any process (store.changes; PostgreSQL): started now, on
        the running loop, stopped with the store. None on SQLite, where the app is one process."""
        if not self.shared_locks:
            return None
        feed = ChangeFeed(self.url, channel, on_change=on_change, on_lost=on_lost)
        self._feeds.append(feed)
        feed.start()
        return feed

    async def lock_holders(self, keys: list[LockKey]) -> dict[LockKey, str]:
        """Who holds each of `keys` now, by the name it took it with."""
        return await lock_holders(self._engine, keys)

    # --- schema ----------------------------------------------------------

    async def migrate(self) -> int:
        """Create missing tables and columns, run pending steps, record the version; returns it.

        Safe to run at every start and from several processes at once. On PostgreSQL it runs on a
        connection of its own with a longer statement timeout (MIGRATION_TIMEOUT_S): waiting for
        another replica's migration, or altering a big table, may take longer than a row's write.
        """
        engine = self._engine
        if engine.dialect.name == "postgresql":
            engine = create_engine(self.url, statement_timeout_s=MIGRATION_TIMEOUT_S)
        try:
            async with transaction(engine) as connection:
                if connection.dialect.name == "postgresql":
                    await connection.execute(text(f"SELECT pg_advisory_xact_lock({_POSTGRES_MIGRATION_LOCK})"))
                return await connection.run_sync(_migrate)
        finally:
            if engine is not self._engine:
                await engine.dispose()

    async def schema_version(self) -> int | None:
        """The version recorded by `migrate()`, or None if the database was never migrated."""
        async with self._transaction() as connection:
            return await connection.run_sync(_recorded_version)

    async def row_counts(self) -> dict[str, int]:
        """Rows per table, for the tables that exist."""
        async with self._transaction() as connection:
            present = await connection.run_sync(lambda sync: set(inspect(sync).get_table_names()))
            return {
                table.name: await connection.scalar(select(func.count()).select_from(table))
                for table in schema.metadata.sorted_tables
                if table.name in present
            }

    # --- replies ---------------------------------------------------------

    async def save_reply(self, reply: StoredReply) -> None:
        """Store a finished reply (its id is the Chainlit message id; saving it twice is an error).
        Raises `SavedLater` when the database is unavailable: the row waits in the outbox."""
        # Its fields as they are (`asdict` would copy the record's timeline, number by number).
        await self._write([insert_row("replies", {field.name: getattr(reply, field.name) for field in fields(reply)})])

    async def replies_for_thread(self, thread_id: str) -> list[StoredReply]:
        """The replies of one chat, oldest first."""
        query = (select(schema.replies).where(schema.replies.c.thread_id == thread_id)
                 .order_by(schema.replies.c.created_at, schema.replies.c.id))
        async with self._transaction() as connection:
            return [StoredReply(**row._mapping) for row in await connection.execute(query)]

    async def replies(self, limit: int = 100, backend: str | None = None,
                      since: datetime | None = None) -> list[StoredReply]:
        """The newest replies first, optionally of one backend and from `since` (inclusive) on."""
        query = select(schema.replies).order_by(schema.replies.c.created_at.desc(), schema.replies.c.id).limit(limit)
        if backend is not None:
            query = query.where(schema.replies.c.backend == backend)
        if since is not None:
            query = query.where(schema.replies.c.created_at >= since)
        async with self._transaction() as connection:
            return [StoredReply(**row._mapping) for row in await connection.execute(query)]

    async def reply_speeds(self, limit: int = 10_000) -> list[ReplySpeed]:
        """The newest replies' speed figures (no text, no timeline), newest first."""
        table = schema.replies
        query = (select(table.c.backend, table.c.status, table.c.first_token_s, table.c.decode_tokens_per_s)
                 .order_by(table.c.created_at.desc(), table.c.id).limit(limit))
        async with self._transaction() as connection:
            return [ReplySpeed(**row._mapping) for row in await connection.execute(query)]

    # --- capacity sweeps --------------------------------------------------

    async def save_sweep(self, sweep: StoredSweep) -> None:
        """Store a finished (or stopped) capacity sweep. Raises `SavedLater` when the database is
        unavailable: the row waits in the outbox."""
        await self._write([insert_row("capacity_sweeps", asdict(sweep))])

    async def sweeps(self, limit: int = 20, backend: str | None = None) -> list[StoredSweep]:
        """The newest capacity sweeps first, optionally of one backend."""
        table = schema.capacity_sweeps
        query = select(table).order_by(table.c.created_at.desc(), table.c.id).limit(limit)
        if backend is not None:
            query = query.where(table.c.backend == backend)
        async with self._transaction() as connection:
            return [StoredSweep(**row._mapping) for row in await connection.execute(query)]

    # --- rounds ----------------------------------------------------------

    async def save_round(self, round_: CompareRound) -> None:
        """Store a round and its columns (usually before the replies stream; see `set_round_reply`).
        Raises `SavedLater` when the database is unavailable: the rows wait in the outbox."""
        round_row = asdict(round_)
        del round_row["columns"]
        held = [notify_blind(round_.person)] if round_.mode == "blind" and round_.person else []
        await self._write([insert_row("compare_rounds", round_row)] + [
            insert_row("round_columns", {"round_id": round_.id, "position": position, **asdict(column)})
            for position, column in enumerate(round_.columns)] + held)

    async def set_round_reply(self, round_id: str, label: str, reply_id: str) -> None:
        """Attach a saved reply to its column; raise `RoundNotFound` for an unknown round or label
        (`SavedLater` when the database is unavailable: the change waits in the outbox)."""
        async def found(connection: AsyncConnection, counts: list[int]) -> None:
            if counts[0] == 0:
                round_ = await _load_round(connection, round_id)
                if round_ is None:
                    raise RoundNotFound(f"Round {round_id} does not exist; save it before attaching replies.")
                raise RoundNotFound(f"Round {round_id} has no column {label!r} (its columns: {', '.join(round_.labels)}).")

        await self._write([update_rows("round_columns", {"round_id": round_id, "label": label},
                                       {"reply_id": reply_id})], check=found)

    async def set_revealed_view(self, round_id: str, view: dict[str, Any]) -> None:
        """Keep what a round's element shows once voted on (for a blind round: its names, hidden
        until then), for a vote cast after the chat was reopened or the app restarted; raise
        `RoundNotFound` for an unknown round (`SavedLater`: the change waits in the outbox)."""
        async def found(connection: AsyncConnection, counts: list[int]) -> None:
            if counts[0] == 0:
                raise RoundNotFound(f"Round {round_id} does not exist; save it before keeping its revealed view.")

        await self._write([update_rows("compare_rounds", {"id": round_id}, {"revealed_view": view})], check=found)

    async def revealed_view(self, round_id: str) -> dict[str, Any] | None:
        """What `set_revealed_view` kept for the round, or None."""
        query = select(schema.compare_rounds.c.revealed_view).where(schema.compare_rounds.c.id == round_id)
        async with self._transaction() as connection:
            return await connection.scalar(query)

    async def get_round(self, round_id: str) -> CompareRound | None:
        """One round with its columns in order, or None."""
        async with self._transaction() as connection:
            return await _load_round(connection, round_id)

    async def rounds(self, limit: int = 100, thread_id: str | None = None) -> list[CompareRound]:
        """The newest rounds first, optionally of one chat."""
        query = select(*_ROUND_FIELDS).order_by(
            schema.compare_rounds.c.created_at.desc(), schema.compare_rounds.c.id).limit(limit)
        if thread_id is not None:
            query = query.where(schema.compare_rounds.c.thread_id == thread_id)
        async with self._transaction() as connection:
            round_rows = (await connection.execute(query)).all()
            columns = await _columns_by_round(connection, [row.id for row in round_rows])
        return [CompareRound(**row._mapping, columns=columns[row.id]) for row in round_rows]

    async def set_speed_seen(self, round_id: str) -> None:
        """The blind round was stopped with its partial texts shown: its vote saw speed (`SavedLater`:
        the change waits in the outbox, behind the round)."""
        await self._write([update_rows("compare_rounds", {"id": round_id}, {"speed_seen": True})])

    async def waiting_blind_rounds(self, person: str) -> list[CompareRound]:
        """One person's blind rounds without a vote that are still blind (not given up), oldest first:
        what their rule holds (core/disclosure.py). One indexed query."""
        rounds = schema.compare_rounds
        query = (select(*_ROUND_FIELDS)
                 .where(rounds.c.person == person, rounds.c.mode == "blind", rounds.c.not_blind_reason.is_(None),
                        ~_has_any_vote(rounds.c.id))
                 .order_by(rounds.c.created_at, rounds.c.id))
        async with self._transaction() as connection:
            rows = (await connection.execute(query)).all()
            columns = await _columns_by_round(connection, [row.id for row in rows])
        return [CompareRound(**row._mapping, columns=columns[row.id]) for row in rows]

    async def open_blind_rounds(self, since: datetime) -> int:
        """How many blind rounds of anyone, started after `since`, still wait for their vote (the
        deployment's rule for live engine load, core/disclosure.py)."""
        rounds = schema.compare_rounds
        query = (select(func.count()).select_from(rounds)
                 .where(rounds.c.mode == "blind", rounds.c.created_at > since, rounds.c.not_blind_reason.is_(None),
                        ~_has_any_vote(rounds.c.id)))
        async with self._transaction() as connection:
            return int(await connection.scalar(query) or 0)

    async def give_up_blind_rounds(self, person: str, round_ids: Iterable[str], reason: str) -> None:
        """`person` chose to see what could name these rounds' columns before voting: they are held no
        more, and a vote on them is kept but not rated (`reason`, one of UNRATED_REASONS). Only that
        person's rounds change. `SavedLater`: the change waits in the outbox, behind the rounds."""
        if reason not in UNRATED_REASONS:
            raise ValueError(f"reason {reason!r} is not one of {', '.join(UNRATED_REASONS)}")
        changes = [update_rows("compare_rounds", {"id": round_id, "person": person}, {"not_blind_reason": reason})
                   for round_id in sorted(set(round_ids))]
        if changes:
            await self._write(changes + [notify_blind(person)])

    async def close_open_blind_rounds(self) -> dict[str, list[str]]:
        """A teacher closes every blind round of the deployment that waits for its vote, whatever its
        age: none holds its person or the class any more, and a later vote on one is kept but not
        rated (UNRATED_CLOSED_BY_TEACHER). Returns the closed rounds' ids by person. Written at once
        (a teacher waits for the answer): with the database unavailable it raises."""
        rounds = schema.compare_rounds
        query = (select(rounds.c.id, rounds.c.person)
                 .where(rounds.c.mode == "blind", rounds.c.not_blind_reason.is_(None), ~_has_any_vote(rounds.c.id))
                 .order_by(rounds.c.created_at, rounds.c.id))
        async with self._transaction() as connection:
            rows = (await connection.execute(query)).all()
            closed: dict[str, list[str]] = {}
            for row in rows:
                closed.setdefault(row.person or "", []).append(row.id)
            statements = [update_rows("compare_rounds", {"id": row.id}, {"not_blind_reason": UNRATED_CLOSED_BY_TEACHER})
                          for row in rows]
            statements += [notify_blind(person) for person in closed if person]
            await run_statements(connection, statements)
        return closed

    # --- votes -----------------------------------------------------------

    async def cast_vote(self, vote: Vote, *, votes_per_day: int | None = None) -> None:
        """Store a vote; raise `VoteRejected` for an unknown round, a second vote by the same person
        (with login off: a second vote on the round), or forged content, and `VoteLimitReached`
        when a logged-in person already cast `votes_per_day` votes in the last 24 hours. A vote on a
        round its person gave up as blind before voting (`give_up_blind_rounds`) is kept but not
        rated, with that reason (decided here, in the vote's transaction).

        A vote is checked against its round and the votes already cast, so it is never kept for
        later: with the database unavailable (or rows still waiting to be written, the round among
        them perhaps) it is refused with `DatabaseUnavailable`, and the person can vote again."""
        if self.outbox is not None and self.outbox.waiting:
            raise DatabaseUnavailable(f"the database is unavailable ({self.outbox.problem or 'rows wait'}); "
                                      f"{self.outbox.waiting} row(s) wait to be written first")
        try:
            async with self._transaction() as connection:
                round_ = await _load_round(connection, vote.round_id)
                if round_ is None:
                    raise VoteRejected(f"Round {vote.round_id} does not exist, so it cannot be voted on.")
                check_vote(vote, round_)
                if await _has_vote(connection, vote):
                    raise _already_voted(vote)
                if votes_per_day is not None and vote.user_identifier is not None:
                    await _check_daily_cap(connection, vote, votes_per_day)
                if round_.not_blind_reason is not None and vote.unrated_reason is None:
                    vote = replace(vote, unrated_reason=round_.not_blind_reason)
                await connection.execute(insert(schema.votes).values(**_cleaned(asdict(vote))))
                if round_.mode == "blind" and round_.person:
                    await run_statements(connection, [notify_blind(round_.person)])
        except IntegrityError:
            # Another cast passed the check above at the same moment; the unique index chose it.
            async with self._transaction() as connection:
                if await _has_vote(connection, vote):
                    raise _already_voted(vote) from None
            raise

    async def votes(self, *, with_replies: bool = False) -> list[VoteRecord]:
        """Every vote, oldest first, with its round's columns (label -> backend, in order), prompt
        and reveal; with `with_replies`, also each column's reply (text, figures, settings)."""
        rounds = schema.compare_rounds
        query = (select(schema.votes, rounds.c.mode, rounds.c.prompt, rounds.c.reveal, rounds.c.speed_seen)
                 .join(rounds, rounds.c.id == schema.votes.c.round_id)
                 .order_by(schema.votes.c.created_at, schema.votes.c.id))
        async with self._transaction() as connection:
            rows = (await connection.execute(query)).all()
            columns = await _columns_by_round(connection, [row.round_id for row in rows])
            replies = {}
            if with_replies:
                replies = await _column_replies(connection, [
                    column.reply_id for row in rows for column in columns[row.round_id] if column.reply_id])
        return [
            VoteRecord(vote=_vote_from_row(row._mapping), mode=row.mode, columns=columns[row.round_id],
                       prompt=row.prompt, reveal=row.reveal, speed_seen=bool(row.speed_seen),
                       replies=tuple(replies.get(column.reply_id) for column in columns[row.round_id])
                       if with_replies else ())
            for row in rows
        ]


# The columns a CompareRound is made of (the revealed view is read on its own).
_ROUND_FIELDS = tuple(column for column in schema.compare_rounds.c if column.name != "revealed_view")


def _has_any_vote(round_id_column):
    """EXISTS (a vote on the round in `round_id_column`)."""
    return select(schema.votes.c.id).where(schema.votes.c.round_id == round_id_column).exists()


def _already_voted(vote: Vote) -> VoteRejected:
    if vote.user_identifier is None:
        return VoteRejected(f"Round {vote.round_id} already has a vote; each round can be voted on once.")
    return VoteRejected(f"Round {vote.round_id} already has a vote from you; each person votes once per round.")


def _vote_from_row(row: Any) -> Vote:
    return Vote(**{name: row[name] for name in (
        "round_id", "outcome", "winner_label", "judgements", "comment", "user_identifier", "created_at",
        "unrated_reason")})


async def _has_vote(connection: AsyncConnection, vote: Vote) -> bool:
    """Whether this voter (with login off: the one anonymous voter) has voted on the round."""
    voter = schema.votes.c.user_identifier
    query = select(schema.votes.c.id).where(
        schema.votes.c.round_id == vote.round_id,
        voter.is_(None) if vote.user_identifier is None else voter == vote.user_identifier)
    return await connection.scalar(query) is not None


async def _check_daily_cap(connection: AsyncConnection, vote: Vote, votes_per_day: int) -> None:
    """Raise `VoteLimitReached` if the voter cast `votes_per_day` votes in the 24 hours before this one."""
    if connection.dialect.name == "postgresql":  # SQLite's BEGIN IMMEDIATE already serialises casts
        await connection.execute(text("SELECT pg_advisory_xact_lock(:lock, hashtext(:voter))"),
                                 {"lock": _POSTGRES_VOTER_LOCK, "voter": vote.user_identifier})
    since = vote.created_at - VOTE_CAP_WINDOW
    recent = (await connection.execute(
        select(schema.votes.c.created_at)
        .where(schema.votes.c.user_identifier == vote.user_identifier, schema.votes.c.created_at > since)
        .order_by(schema.votes.c.created_at))).scalars().all()
    if len(recent) >= votes_per_day:
        next_vote_at = recent[len(recent) - votes_per_day] + VOTE_CAP_WINDOW
        raise VoteLimitReached(
            f"You have cast {len(recent)} votes in the last 24 hours, the most allowed per person "
            f"(VOTES_PER_DAY={votes_per_day}); you can vote again from {next_vote_at:%Y-%m-%d %H:%M} UTC."
        )


async def _column_replies(connection: AsyncConnection, reply_ids: Iterable[str]) -> dict[str, ColumnReply]:
    """The replies with these ids (text, figures and settings, not the timeline), by id."""
    reply_ids = sorted(set(reply_ids))
    fields = [getattr(schema.replies.c, name) for name in ColumnReply.__dataclass_fields__]
    found: dict[str, ColumnReply] = {}
    # In slices: one IN list per query stays well below every driver's parameter limit.
    for start in range(0, len(reply_ids), 500):
        query = select(schema.replies.c.id, *fields).where(schema.replies.c.id.in_(reply_ids[start:start + 500]))
        for row in await connection.execute(query):
            found[row.id] = ColumnReply(**{name: row._mapping[name] for name in ColumnReply.__dataclass_fields__})
    return found


async def _load_round(connection: AsyncConnection, round_id: str) -> CompareRound | None:
    row = (await connection.execute(
        select(*_ROUND_FIELDS).where(schema.compare_rounds.c.id == round_id))).first()
    if row is None:
        return None
    columns = await _columns_by_round(connection, [round_id])
    return CompareRound(**row._mapping, columns=columns[round_id])


async def _columns_by_round(connection: AsyncConnection,
                            round_ids: Iterable[str]) -> dict[str, tuple[RoundColumn, ...]]:
    round_ids = sorted(set(round_ids))
    grouped: dict[str, list[RoundColumn]] = defaultdict(list)
    if round_ids:
        table = schema.round_columns
        query = select(table).where(table.c.round_id.in_(round_ids)).order_by(table.c.round_id, table.c.position)
        for row in await connection.execute(query):
            grouped[row.round_id].append(RoundColumn(label=row.label, backend=row.backend, reply_id=row.reply_id))
    return {round_id: tuple(grouped[round_id]) for round_id in round_ids}


def _recorded_version(connection: Connection) -> int | None:
    if not inspect(connection).has_table(schema.schema_version.name):
        return None
    return connection.scalar(select(func.max(schema.schema_version.c.version)))


def _migrate(connection: Connection) -> int:
    recorded = _recorded_version(connection)
    if recorded is not None and recorded > schema.SCHEMA_VERSION:
        raise SchemaTooNew(
            f"The database is at schema version {recorded}, newer than this app's {schema.SCHEMA_VERSION}: "
            "update the app (git pull) before using this database."
        )
    existing_tables = set(inspect(connection).get_table_names())
    schema.metadata.create_all(connection)
    _add_missing_columns(connection, existing_tables)
    if recorded is not None:  # a fresh database is created in the newest shape: no steps to run
        for version in range(recorded + 1, schema.SCHEMA_VERSION + 1):
            if step := schema.MIGRATION_STEPS.get(version):
                step(connection)
    if recorded != schema.SCHEMA_VERSION:
        connection.execute(insert(schema.schema_version).values(version=schema.SCHEMA_VERSION, applied_at=utc_now()))
    return schema.SCHEMA_VERSION


def _add_missing_columns(connection: Connection, existing_tables: set[str]) -> None:
    """ALTER TABLE ... ADD COLUMN for every column the schema has and an older table lacks."""
    inspector = inspect(connection)
    preparer = connection.dialect.identifier_preparer
    for table in schema.metadata.sorted_tables:
        if table.name not in existing_tables:
            continue
        present = {column["name"] for column in inspector.get_columns(table.name)}
        for column in table.columns:
            if column.name not in present:
                definition = CreateColumn(column).compile(dialect=connection.dialect)
                connection.exec_driver_sql(f"ALTER TABLE {preparer.format_table(table)} ADD COLUMN {definition}")


def migrate_blocking(url: str | None = None) -> int:
    """Open the database and migrate it from synchronous code, whether or not an event loop runs
    in this thread (the app calls it at import, before Chainlit's data layer touches a table)."""
    import asyncio
    import threading

    outcome: dict[str, Any] = {}

    async def run() -> None:
        async with await Store.open(url, flush_outbox=False) as store:
            outcome["version"] = await store.migrate()

    def work() -> None:
        try:
            asyncio.run(run())
        except (StoreError, ConfigurationError) as error:
            outcome["error"] = error

    worker = threading.Thread(target=work, name="store-migrate")
    worker.start()
    worker.join()
    if "error" in outcome:
        raise outcome["error"]
    return outcome["version"]
