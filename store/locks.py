"""Locks that hold across every app process (replica) on one PostgreSQL database.

A session-level advisory lock taken on a connection of its own: it is held until it is released
or until that connection ends - which it does when the process holding it dies, however it dies
(the server sees the socket close). Which process holds one is told by the holder's
`application_name`, read from `pg_locks` + `pg_stat_activity` (no table to clean up after a crash).

    held = await try_lock(url, LOAD_RUN, "serving-lab load replica-1")   # None: someone else holds it
    held.keep()                          # taken again on a new connection if the server restarts
    await lock_holder(url, LOAD_RUN)     # "serving-lab load replica-1", or None when it is free
    await held.release()

A restarted (or failed-over) PostgreSQL ends every session, and with them the locks: a process
that still runs would look dead to the others (its replies in flight "interrupted"), and a load
run would no longer keep out another. `keep()` checks the lock's connection every few seconds
and, once it broke, takes the lock again on a new one.

SQLite has no such locks: a single-process app keeps its own (core.app_state).
Nothing here imports Chainlit.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass

from sqlalchemy import text
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, create_async_engine
from sqlalchemy.pool import NullPool

from store.errors import DatabaseUnavailable

log = logging.getLogger(__name__)
# How often a held lock's connection is checked (and, once broken, the lock taken again).
KEEP_INTERVAL_S = 5.0
# PostgreSQL keeps 63 bytes of an application_name.
NAME_BYTES = 63


@dataclass(frozen=True)
class LockKey:
    """The two 32-bit keys of one advisory lock (`pg_try_advisory_lock(int, int)`); both non-negative,
    so they read back unchanged from pg_locks (classid, objid)."""

    space: int
    item: int = 0


# One load run (a simulation, a capacity sweep or /bench) at a time in the whole deployment.
LOAD_RUN = LockKey(7_312_001)
# Held by each running app process on its own key: a reply marked with a process whose lock is free
# was cut off by that process's death (see `alive`).
PROCESS_ALIVE_SPACE = 7_312_002


def _name(name: str) -> str:
    return name.encode()[:NAME_BYTES].decode(errors="ignore")


def _lock_engine(url: str) -> AsyncEngine:
    from store.db import postgres_connect_args  # store.db imports this module

    # NullPool: closing the connection ends the database session, so nothing (a lock, a name) outlives it.
    # Every step has a timeout: a hung server must not hold the caller (a reply about to stream).
    return create_async_engine(url, hide_parameters=True, poolclass=NullPool, connect_args=postgres_connect_args())


_CONNECTION_ERRORS = (SQLAlchemyError, OSError, asyncio.TimeoutError)


class HeldLock:
    """An advisory lock this process holds on its own connection, until `release()` or its death
    (and, with `keep()`, again after the server restarted)."""

    def __init__(self, url: str, engine: AsyncEngine, connection: AsyncConnection, key: LockKey, name: str) -> None:
        self.url, self._engine, self._connection, self.key, self.name = url, engine, connection, key, name
        self.held = True  # False from a broken connection until the lock is taken again
        self._keeper: asyncio.Task | None = None

    def keep(self, interval_s: float | None = None) -> None:
        """Check the lock's connection every `interval_s` (default KEEP_INTERVAL_S) and take the lock
        again on a new one once it broke (call on the event loop; `release` stops it)."""
        if self._keeper is None or self._keeper.done():
            self._keeper = asyncio.get_running_loop().create_task(self._keep(interval_s or KEEP_INTERVAL_S),
                                                                 name=f"lock-keeper {self.name}")

    async def _keep(self, interval_s: float) -> None:
        while True:
            await asyncio.sleep(interval_s)
            if self.held and await self._answers():
                continue
            if self.held:
                log.warning("lock %r: its connection broke (the database restarted?); taking it again", self.name)
                self.held = False
                await self._close()
            try:
                taken = await _take(self.url, self.key, self.name)
            except DatabaseUnavailable:
                continue  # not back yet: the next round tries again
            if taken is None:
                log.warning("lock %r: another process holds it now; trying again in %g s", self.name, interval_s)
                continue
            self._engine, self._connection = taken
            self.held = True
            log.warning("lock %r: taken again", self.name)

    async def _answers(self) -> bool:
        try:
            await self._connection.execute(text("SELECT 1"))
            await self._connection.commit()
        except _CONNECTION_ERRORS:
            return False
        return True

    async def _close(self) -> None:
        try:
            await self._connection.close()
        except _CONNECTION_ERRORS:
            pass  # a broken connection: its session (and lock) already ended, or ends when the server notices
        finally:
            await self._engine.dispose()

    async def release(self) -> None:
        """Unlock and close the connection (closing it alone would release the lock too)."""
        if self._keeper is not None:
            self._keeper.cancel()
            await asyncio.gather(self._keeper, return_exceptions=True)
            self._keeper = None
        if not self.held:
            await self._close()
            return
        try:
            await self._connection.execute(text("SELECT pg_advisory_unlock(:space, :item)"),
                                           {"space": self.key.space, "item": self.key.item})
            await self._connection.commit()
        except _CONNECTION_ERRORS:
            pass  # a connection that broke has ended its session, and with it the lock
        finally:
            await self._close()


async def try_lock(url: str, key: LockKey, name: str) -> HeldLock | None:
    """Take the lock `key` on a new connection named `name`, or return None when another session holds it.
    Raises DatabaseUnavailable when the database does not answer."""
    taken = await _take(url, key, name)
    return HeldLock(url, *taken, key, name) if taken is not None else None


async def _take(url: str, key: LockKey, name: str) -> tuple[AsyncEngine, AsyncConnection] | None:
    engine = _lock_engine(url)
    connection: AsyncConnection | None = None
    try:
        connection = await engine.connect()
        await connection.execute(text("SELECT set_config('application_name', :name, false)"), {"name": _name(name)})
        got = await connection.scalar(text("SELECT pg_try_advisory_lock(:space, :item)"),
                                      {"space": key.space, "item": key.item})
        await connection.commit()
    except _CONNECTION_ERRORS as error:
        if connection is not None:
            try:
                await connection.close()
            except _CONNECTION_ERRORS:
                pass
        await engine.dispose()
        raise DatabaseUnavailable(f"(could not take a lock: {type(error).__name__})") from error
    if not got:
        await connection.close()
        await engine.dispose()
        return None
    return engine, connection


_HOLDERS = text(
    "SELECT a.application_name FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid "
    "WHERE l.locktype = 'advisory' AND l.granted AND l.classid = :space AND l.objid = :item AND l.objsubid = 2 "
    "AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())")


async def lock_holders(engine: AsyncEngine, keys: list[LockKey]) -> dict[LockKey, str]:
    """The name of the session holding each of `keys` now (keys nobody holds are absent)."""
    held: dict[LockKey, str] = {}
    try:
        async with engine.connect() as connection:
            for key in keys:
                name = await connection.scalar(_HOLDERS, {"space": key.space, "item": key.item})
                if name is not None:
                    held[key] = name
    except _CONNECTION_ERRORS as error:
        raise DatabaseUnavailable(f"(could not read the locks: {type(error).__name__})") from error
    return held
