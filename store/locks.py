"""Locks that hold across every app process (replica) on one PostgreSQL database.

A session-level advisory lock taken on a connection of its own: it is held until it is released
or until that connection ends - which it does when the process holding it dies, however it dies
(the server sees the socket close). Which process holds one is told by the holder's
`application_name`, read from `pg_locks` + `pg_stat_activity` (no table to clean up after a crash).

    held = await try_lock(url, LOAD_RUN, "serving-lab load replica-1")   # None: someone else holds it
    await lock_holder(url, LOAD_RUN)     # "serving-lab load replica-1", or None when it is free
    await held.release()

SQLite has no such locks: a single-process app keeps its own (core.app_state).
Nothing here imports Chainlit.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from sqlalchemy import text
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, create_async_engine
from sqlalchemy.pool import NullPool

from store.errors import DatabaseUnavailable

CONNECT_TIMEOUT_S = 5.0
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
    # NullPool: closing the connection ends the database session, so nothing (a lock, a name) outlives it.
    return create_async_engine(url, hide_parameters=True, poolclass=NullPool,
                               connect_args={"timeout": CONNECT_TIMEOUT_S})


class HeldLock:
    """An advisory lock this process holds on its own connection, until `release()` or its death."""

    def __init__(self, engine: AsyncEngine, connection: AsyncConnection, key: LockKey, name: str) -> None:
        self._engine, self._connection, self.key, self.name = engine, connection, key, name

    async def release(self) -> None:
        """Unlock and close the connection (closing it alone would release the lock too)."""
        try:
            await self._connection.execute(text("SELECT pg_advisory_unlock(:space, :item)"),
                                           {"space": self.key.space, "item": self.key.item})
            await self._connection.commit()
        except (SQLAlchemyError, OSError, asyncio.TimeoutError):
            pass  # a connection that broke has ended its session, and with it the lock
        finally:
            try:
                await self._connection.close()
            finally:
                await self._engine.dispose()


async def try_lock(url: str, key: LockKey, name: str) -> HeldLock | None:
    """Take the lock `key` on a new connection named `name`, or return None when another session holds it.
    Raises DatabaseUnavailable when the database does not answer."""
    engine = _lock_engine(url)
    connection: AsyncConnection | None = None
    try:
        connection = await engine.connect()
        await connection.execute(text("SELECT set_config('application_name', :name, false)"), {"name": _name(name)})
        got = await connection.scalar(text("SELECT pg_try_advisory_lock(:space, :item)"),
                                      {"space": key.space, "item": key.item})
        await connection.commit()
    except (SQLAlchemyError, OSError, asyncio.TimeoutError) as error:
        if connection is not None:
            await connection.close()
        await engine.dispose()
        raise DatabaseUnavailable(f"(could not take a lock: {type(error).__name__})") from error
    if not got:
        await connection.close()
        await engine.dispose()
        return None
    return HeldLock(engine, connection, key, name)


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
    except (SQLAlchemyError, OSError, asyncio.TimeoutError) as error:
        raise DatabaseUnavailable(f"(could not read the locks: {type(error).__name__})") from error
    return held
