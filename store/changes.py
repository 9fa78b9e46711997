"""Changes other replicas made, as PostgreSQL tells them: LISTEN on one connection of its own.

A replica caches each person's blind rule (core/disclosure.py) instead of asking the database at
every view. Another replica that keeps a blind round, a vote or a give-up sends a NOTIFY on
`store.db.BLIND_CHANNEL` in the same transaction, with the person's key; this feed hands each one to
`on_change(person)` within milliseconds of the commit. When its connection breaks (the database
restarted, the network dropped) it says so (`on_lost()`: the caches are then stale, and are asked
again on a timer until the feed is back) and connects again; `live` says whether it listens now.

    feed = ChangeFeed(url, BLIND_CHANNEL, on_change=book.changed, on_lost=book.feed_lost)
    feed.start()      # on the event loop
    await feed.stop()

SQLite has no such thing: the app on SQLite is one process, and its own changes are its own.
Nothing here imports Chainlit.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Callable

import asyncpg
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from store.errors import DatabaseUnavailable
from store.locks import _CONNECTION_ERRORS, _lock_engine

# What the listening connection (asyncpg's own, under SQLAlchemy's) raises when it broke.
_LISTEN_ERRORS = (*_CONNECTION_ERRORS, asyncpg.PostgresError, asyncpg.InterfaceError)

log = logging.getLogger(__name__)

# How often the listening connection is checked; and, once broken, how often it is tried again.
CHECK_INTERVAL_S = 2.0


class ChangeFeed:
    """LISTEN on `channel` on a connection of its own, connected again after it breaks."""

    def __init__(self, url: str, channel: str, *, on_change: Callable[[str], None],
                 on_lost: Callable[[], None], check_interval_s: float = CHECK_INTERVAL_S) -> None:
        self.url, self.channel = url, channel
        self.on_change, self.on_lost = on_change, on_lost
        self.check_interval_s = check_interval_s
        self.live = False
        self._task: asyncio.Task | None = None
        self._engine: AsyncEngine | None = None
        self._connection: AsyncConnection | None = None
        self._driver = None  # asyncpg's connection, on which the listener is

    def start(self) -> None:
        """Listen from now on, in a task on the running loop (again after `stop`)."""
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._run(), name=f"listen {self.channel}")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
        await self._close()

    async def _run(self) -> None:
        while True:
            if not self.live:
                try:
                    await self._listen()
                except DatabaseUnavailable as error:
                    log.warning("changes of blind rounds: not listening (%s); trying again in %g s",
                                error, self.check_interval_s)
                else:
                    self.live = True
                    # What changed while it did not listen is unknown: every cached answer is asked again.
                    self.on_lost()
            await asyncio.sleep(self.check_interval_s)
            if self.live and not await self._answers():
                log.warning("changes of blind rounds: the listening connection broke; connecting again")
                self.live = False
                self.on_lost()
                await self._close()

    async def _listen(self) -> None:
        engine = _lock_engine(self.url)
        connection: AsyncConnection | None = None
        try:
            connection = await engine.connect()
            raw = await connection.get_raw_connection()
            driver = raw.driver_connection
            await driver.add_listener(self.channel, self._notified)
        except _LISTEN_ERRORS as error:
            if connection is not None:
                try:
                    await connection.close()
                except _LISTEN_ERRORS:
                    pass
            await engine.dispose()
            raise DatabaseUnavailable(f"(could not listen: {type(error).__name__})") from error
        self._engine, self._connection, self._driver = engine, connection, driver

    def _notified(self, _connection, _pid: int, _channel: str, payload: str) -> None:
        self.on_change(payload)

    async def _answers(self) -> bool:
        try:
            await asyncio.wait_for(self._driver.fetchval("SELECT 1"), timeout=self.check_interval_s * 2)
        except _LISTEN_ERRORS as error:
            log.debug("listening connection check failed: %r", error)
            return False
        return True

    async def _close(self) -> None:
        connection, engine = self._connection, self._engine
        self._connection = self._engine = self._driver = None
        self.live = False
        if connection is not None:
            try:
                await connection.close()
            except _LISTEN_ERRORS:
                pass
        if engine is not None:
            await engine.dispose()
