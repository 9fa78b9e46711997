"""Where failed logins are counted: one table for every replica on PostgreSQL, one per process else.

The rules themselves live in `core.login_limits` (pure functions of the records and the time:
`judge` and `forgive`). A table here only keeps the records and applies
a rule to them atomically, so two attempts at once (in one process or in two replicas) can never
both read the same count:

- `LocalAttempts`: a dict in this process (SQLite, where the app is one process; and the fallback
  while PostgreSQL does not answer). Bounded: the least recently touched keys are forgotten first.
- `SharedAttempts`: the `login_attempts` table on PostgreSQL, read and written in one transaction
  per attempt with its rows locked (`SELECT ... FOR UPDATE`, always in key order so two
  transactions cannot deadlock), on the database's clock (replicas on several machines agree on
  it). N replicas do not give N times the tries: the counts are the deployment's.
- `FallbackAttempts`: the shared table, or the local one while the database does not answer
  within `STORE_TIMEOUT_S` (tried again every `RETRY_SHARED_S`). A database outage neither locks
  everyone out nor lifts the limits: they hold per replica until it is back.

Keys are keyed digests (HMAC-SHA256) of what they count (a name with an address or browser, an
address), never the name itself: people type their password into the name field by mistake, and
that must not end up in a table.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Callable, Protocol

from sqlalchemy import delete, select, text, update
from sqlalchemy.dialects.postgresql import insert as postgres_insert
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.ext.asyncio import AsyncEngine

from store import schema
from store.errors import DatabaseUnavailable

log = logging.getLogger(__name__)

# One login's reading and writing of its two rows: longer, and the login goes on without the
# shared table (see FallbackAttempts) rather than keeping a person waiting on a stuck database.
STORE_TIMEOUT_S = 2.0
# After the shared table failed, how long logins use this process's table before trying it again.
RETRY_SHARED_S = 15.0
# Forgotten rows are deleted at most this often per process.
CLEANUP_INTERVAL_S = 60.0
LOCAL_MAX_KEYS = 100_000


@dataclass(frozen=True)
class Failures:
    """The failed attempts counted under one key (a name from a source, or an address).

    `count`: failures counted (an attempt counts from the moment it is admitted); `last_s`: when the
    latest was counted; `not_before_s`: no attempt this applies to is admitted before then. Times
    are the table's clock: `time.monotonic` in a process, the database's epoch seconds on PostgreSQL.
    """

    count: int
    last_s: float
    not_before_s: float


# A rule: the records (pair, address) and the time -> what to answer, and the records to keep (None: delete).
Judge = Callable[[Failures | None, Failures | None, float], tuple[object, Failures | None, Failures | None]]


class AttemptTable(Protocol):
    """Applies a rule to the records of one attempt (its pair and its address), atomically."""

    async def apply(self, pair_key: str, address_key: str, rule: Judge) -> object:
        """Run `rule(pair, address, now)`, keep the records it returns, return its answer."""

    async def aclose(self) -> None:
        """Release connections (a no-op for a table in memory)."""


def _keep(records: dict, key: str, record: Failures | None) -> None:
    if record is None:
        records.pop(key, None)
    else:
        records[key] = record


class LocalAttempts:
    """The records in this process: exact for one process, and bounded (`max_keys`, least recently
    touched forgotten first; a name flood that could push a record out is itself slowed by its
    address's delay long before it gets near 100,000 keys)."""

    def __init__(self, *, clock: Callable[[], float] = time.monotonic, max_keys: int = LOCAL_MAX_KEYS) -> None:
        self.clock = clock
        self.max_keys = max_keys
        self._records: OrderedDict[str, Failures] = OrderedDict()

    def __len__(self) -> int:
        return len(self._records)

    async def apply(self, pair_key: str, address_key: str, rule: Judge) -> object:
        # No await between the read and the write: on one event loop this is atomic.
        answer, pair, address = rule(self._records.get(pair_key), self._records.get(address_key), self.clock())
        for key, record in ((pair_key, pair), (address_key, address)):
            _keep(self._records, key, record)
            if record is not None:
                self._records.move_to_end(key)
        while len(self._records) > self.max_keys:
            self._records.popitem(last=False)
        return answer

    async def aclose(self) -> None:
        return None


class SharedAttempts:
    """The `login_attempts` table on PostgreSQL, shared by every replica on the database.

    `clock`: None for the database's own clock (what the app uses); tests pass one of their own.
    `forget_after_s`: rows whose latest failure is older are deleted now and then (they no longer
    count under any rule).
    """

    def __init__(self, engine: AsyncEngine, *, forget_after_s: float, clock: Callable[[], float] | None = None) -> None:
        if engine.dialect.name != "postgresql":
            raise ValueError(f"SharedAttempts needs PostgreSQL, not {engine.dialect.name}: use LocalAttempts")
        self._engine = engine
        self.clock = clock
        self.forget_after_s = forget_after_s
        self._cleaned_at = time.monotonic()

    async def apply(self, pair_key: str, address_key: str, rule: Judge) -> object:
        table = schema.login_attempts
        keys = sorted({pair_key, address_key})
        try:
            async with self._engine.begin() as connection:
                # The server gives up on a statement or a lock wait that takes longer (FallbackAttempts
                # also stops waiting after STORE_TIMEOUT_S, e.g. for a server that does not answer at all).
                await connection.execute(text(f"SET LOCAL statement_timeout = {int(STORE_TIMEOUT_S * 1000)}"))
                await connection.execute(text(f"SET LOCAL lock_timeout = {int(STORE_TIMEOUT_S * 1000)}"))
                # Rows in key order, inserted then locked in that order: two attempts never wait on each other in a cycle.
                await connection.execute(postgres_insert(table).values(
                    [{"key": key, "failures": 0, "last_failure_s": 0.0, "not_before_s": 0.0} for key in keys]
                ).on_conflict_do_nothing(index_elements=["key"]))
                rows = (await connection.execute(
                    select(table, text("extract(epoch from clock_timestamp()) AS now_s"))
                    .where(table.c.key.in_(keys)).order_by(table.c.key).with_for_update())).all()
                found = {row.key: _record(row) for row in rows}
                now = self.clock() if self.clock is not None else float(rows[0].now_s)
                answer, pair, address = rule(found.get(pair_key), found.get(address_key), now)
                for key, record in ((pair_key, pair), (address_key, address)):
                    if record is None:
                        await connection.execute(delete(table).where(table.c.key == key))
                    elif record != found.get(key):
                        await connection.execute(update(table).where(table.c.key == key).values(
                            failures=record.count, last_failure_s=record.last_s, not_before_s=record.not_before_s))
        except SQLAlchemyError as error:
            raise DatabaseUnavailable(f"(login attempts: {type(error).__name__}: {_first_line(error)})") from error
        if time.monotonic() - self._cleaned_at > CLEANUP_INTERVAL_S:
            self._cleaned_at = time.monotonic()
            await self._clean(now)
        return answer

    async def _clean(self, now: float) -> None:
        """Delete the rows no rule reads any more (their latest failure is older than any rule remembers)."""
        table = schema.login_attempts
        try:
            async with self._engine.begin() as connection:
                await connection.execute(delete(table).where(table.c.last_failure_s < now - self.forget_after_s))
        except SQLAlchemyError as error:  # the rows stay until the next clean-up; nothing is lost by it
            log.warning("could not delete old login attempts: %s", _first_line(error))

    async def aclose(self) -> None:
        await self._engine.dispose()


def _record(row) -> Failures | None:
    """A row as a record; a row just inserted (no failure yet) is no record."""
    if row.failures <= 0 and row.not_before_s <= 0:
        return None
    return Failures(row.failures, row.last_failure_s, row.not_before_s)


def _first_line(error: BaseException) -> str:
    original = getattr(error, "orig", None) or error
    return (str(original).strip().splitlines() or [type(original).__name__])[0][:160]


class FallbackAttempts:
    """The shared table while it answers within `timeout_s`, else this process's own: a database
    outage must not lock everyone out, nor lift the limits, nor make every login wait for it.

    After the shared table failed, logins use the local one for `retry_s` before the shared one is
    tried again (each try of a hung database costs `timeout_s`, the first one up to ~2 s more while
    the driver gives the connection up). Logged when it switches, either way.
    """

    def __init__(self, shared: AttemptTable, local: LocalAttempts | None = None, *,
                 timeout_s: float = STORE_TIMEOUT_S, retry_s: float = RETRY_SHARED_S) -> None:
        self.shared = shared
        self.local = local or LocalAttempts()
        self.timeout_s = timeout_s
        self.retry_s = retry_s
        self.problem: str | None = None  # why logins use the local table now, else None
        self._failed_at = -float("inf")

    async def apply(self, pair_key: str, address_key: str, rule: Judge) -> object:
        if self.problem is not None and time.monotonic() - self._failed_at < self.retry_s:
            return await self.local.apply(pair_key, address_key, rule)
        try:
            async with asyncio.timeout(self.timeout_s):
                answer = await self.shared.apply(pair_key, address_key, rule)
        except (DatabaseUnavailable, OSError, TimeoutError) as error:
            if self.problem is None:
                log.warning("login limits kept in this process for now: the shared table did not answer (%s)",
                            str(error) or f"no answer within {self.timeout_s:g} s")
            self.problem = str(error) or f"no answer within {self.timeout_s:g} s"
            self._failed_at = time.monotonic()
            return await self.local.apply(pair_key, address_key, rule)
        if self.problem is not None:
            log.warning("login limits shared by every replica again (the database answers)")
            self.problem = None
        return answer

    async def aclose(self) -> None:
        await self.shared.aclose()
