"""What every session of this app process shares: the backends, the chat defaults and presets, a
cache of each backend's status, the database (opened once, retried), login, and the one load run
at a time. Chainlit-free: the UI keeps one AppState per process and hands it to the flows.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from dataclasses import dataclass, field
from typing import Awaitable, Callable, Mapping

from backends.errors import BackendError, BackendTimeout, BackendUnavailable, ConnectionLost
from backends.registry import BackendStatus, Registry
from config import ChatDefaults, ConfigurationError, backend_names, load_env
from core.auth import AuthConfig, auth_from_env
from core.capacity import TeacherSweep
from core.engines import Simulation
from core.notices import Notice
from core.settings import load_presets
from store import SavedLater, Store, StoredReply, StoredSweep, StoreError

log = logging.getLogger(__name__)

INFO_CACHE_S = 30.0
STORAGE_RETRY_S = 30.0  # a database that could not be opened is tried again after this long
STATUS_TIMEOUT_S = 4.0


@dataclass
class AppState:
    """Shared by every session in this process: backends, defaults, presets, a status cache."""

    registry: Registry
    defaults: ChatDefaults
    presets: dict[str, str]
    database_url: str | None = None  # None: DATABASE_URL, else the SQLite file
    _statuses: dict[str, tuple[float, BackendStatus]] = field(default_factory=dict)
    auth: AuthConfig = field(default_factory=AuthConfig)
    _store: Store | None = None
    storage_problem: str | None = None
    _store_lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    _storage_failed_at: float = 0.0
    # One load run at a time in the whole app - a simulation of N users or a /bench - so a classroom
    # cannot multiply the load. The running one's task is kept here until it ends (asyncio itself
    # keeps only a weak reference to a task), with the notice that refuses another meanwhile.
    simulation: Simulation | None = None
    capacity_sweep: "TeacherSweep | None" = None
    load_task: asyncio.Task | None = None
    load_notice: Notice | None = None
    load_lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> "AppState":
        if env is None:
            load_env()
            env = dict(os.environ)
        return cls(
            registry=Registry.from_env(env),
            defaults=ChatDefaults.from_env(env, backend_names(env)),
            presets=load_presets(),
            auth=auth_from_env(env),
        )

    async def status(self, name: str, fresh: bool = False) -> BackendStatus:
        """Health + info of one backend, cached briefly so a classroom does not hammer servers.
        A backend that was down is always probed again."""
        cached = self._statuses.get(name)
        if cached and not fresh and time.monotonic() - cached[0] < INFO_CACHE_S and cached[1].available:
            return cached[1]
        status = await self.registry.status(name, STATUS_TIMEOUT_S)
        self._statuses[name] = (time.monotonic(), status)
        return status

    async def storage(self) -> Store | None:
        """The database (opened and migrated once per process), or None with `storage_problem`
        saying why: the chat keeps working without it, it only cannot keep replies and votes.
        A database that could not be opened is tried again after STORAGE_RETRY_S."""
        async with self._store_lock:
            retry = (self.storage_problem is not None
                     and time.monotonic() - self._storage_failed_at >= STORAGE_RETRY_S)
            if self._store is None and (self.storage_problem is None or retry):
                try:
                    store = await Store.open(self.database_url)
                    await store.migrate()
                except (StoreError, ConfigurationError) as error:  # unavailable, or DATABASE_URL unusable
                    self.storage_problem = str(error)
                    self._storage_failed_at = time.monotonic()
                    log.error("storage unavailable: %s", error)
                else:
                    self._store, self.storage_problem = store, None
            return self._store

    async def save_reply(self, reply: StoredReply) -> Notice | None:
        """Store one reply; None when it is in the database, else what the person should be told:
        kept to be written later (the database is unavailable), or not kept, and why."""
        return await self._save(f"reply {reply.id}", lambda store: store.save_reply(reply))

    async def save_sweep(self, sweep: StoredSweep) -> Notice | None:
        """Store a capacity sweep; None when it is in the database, else what the person should be told."""
        return await self._save(f"capacity sweep {sweep.id}", lambda store: store.save_sweep(sweep))

    async def _save(self, what: str, write: Callable[[Store], Awaitable[None]]) -> Notice | None:
        store = await self.storage()
        if store is None:
            return Notice("not_saved", {"problem": self.storage_problem or "no database"})
        try:
            await write(store)
        except SavedLater as later:
            log.warning("%s waits in the outbox: %s", what, later.problem)
            return Notice("saved_later", {"waiting": later.waiting})
        except StoreError as error:
            log.error("could not store %s: %s", what, error)
            return Notice("not_saved", {"problem": str(error)})
        return None

    async def earlier_sweeps(self, limit: int = 10) -> list[StoredSweep]:
        """The newest capacity sweeps stored (none when the database is unavailable)."""
        store = await self.storage()
        if store is None:
            return []
        try:
            return await store.sweeps(limit=limit)
        except StoreError as error:
            log.warning("could not read the capacity sweeps: %s", error)
            return []

    async def statuses(self, fresh: bool = False) -> dict[str, BackendStatus]:
        """Every configured backend's status, probed concurrently, in configuration order
        (`fresh`: probe every one now, as /status does)."""
        results = await asyncio.gather(*(self.status(name, fresh) for name in self.registry.names))
        return {status.name: status for status in results}

    def cached_statuses(self) -> dict[str, BackendStatus]:
        """The last status seen of each backend probed so far (no probing)."""
        return {name: status for name, (_, status) in self._statuses.items()}

    def running_load(self) -> Notice | None:
        """The load run going on now, as the notice that refuses another one; None when there is none."""
        if self.load_task is None or self.load_task.done():
            return None
        return self.load_notice

    def start_load(self, task: asyncio.Task, notice: Notice) -> None:
        """Make `task` the app's one load run (under `load_lock`, after `running_load()` said None);
        the task calls `end_load` when it ends."""
        self.load_task, self.load_notice = task, notice

    def end_load(self, task: asyncio.Task | None) -> None:
        if self.load_task is task:
            self.load_task, self.load_notice = None, None


def load_refusal(state: AppState, mode: str, user: str | None) -> Notice | None:
    """Why this person may not start load (a simulation or /bench) now, or None. With login on only
    teachers may; never in blind mode (an engine's load would show which column is which); and one
    load run at a time in the app."""
    if not state.auth.is_teacher(user):
        return Notice("simulate_teachers_only")
    if mode == "blind":
        return Notice("panel_blind")
    return state.running_load()


# A reply that failed this way may mean the server went down: probe it again and show the result.
SERVER_MAY_BE_DOWN = (BackendUnavailable, BackendTimeout, ConnectionLost)


def server_may_be_down(error: BackendError | None) -> bool:
    """Whether a failed reply should make the app probe its backend again (and update the list)."""
    return isinstance(error, SERVER_MAY_BE_DOWN)


