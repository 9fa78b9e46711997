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
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Awaitable, Callable, Coroutine, Mapping

from backends.base import display_label
from backends.errors import BackendError, BackendTimeout, BackendUnavailable, ConnectionLost
from backends.registry import BackendStatus, Registry
from config import ChatDefaults, ConfigurationError, backend_names, load_env, parse_seconds
from core.auth import AuthConfig, auth_from_env
from core.capacity import TeacherSweep
from core.disclosure import Disclosure, DisclosureBook, HeldRound, identifying_words
from core.engines import CacheLesson, EngineReadings, Simulation
from core.notices import Notice
from core.replica import process_key, replica_id
from core.settings import load_presets
from store import DatabaseUnavailable, SavedLater, Store, StoredReply, StoredSweep, StoreError
from store.changes import ChangeFeed
from store.db import BLIND_CHANNEL
from store.locks import LOAD_RUN, PROCESS_ALIVE_SPACE, HeldLock, LockKey
from store.records import utc_now

if TYPE_CHECKING:
    from core.load.class_fit import ClassFit

log = logging.getLogger(__name__)

INFO_CACHE_S = 30.0
# A database that could not be opened (or migrated) is tried again in the background, first after
# STORAGE_RETRY_FIRST_S, then twice as long each time up to STORAGE_RETRY_S.
STORAGE_RETRY_FIRST_S = 1.0
STORAGE_RETRY_S = 30.0
STATUS_TIMEOUT_S = 4.0
# How a replica names the connection that holds the deployment's load lock (see store.locks).
LOAD_LOCK_NAME = "serving-lab load "
PROCESS_LOCK_NAME = "serving-lab process "
# How long an unvoted blind round counts as open for the deployment's rule (live engine load for
# teachers only, core/disclosure.py): a lesson, by default; a round left longer stops holding others.
BLIND_OPEN_VARIABLE = "BLIND_OPEN_S"
DEFAULT_BLIND_OPEN_S = 7200.0
# With login off nobody can be told apart, so nobody sees live load while a round is open: a round
# left unvoted (a rehearsal's) holds the panel for everyone, so only briefly.
DEFAULT_BLIND_OPEN_NO_LOGIN_S = 600.0


@dataclass
class AppState:
    """Shared by every session in this process: backends, defaults, presets, a status cache."""

    registry: Registry
    defaults: ChatDefaults
    presets: dict[str, str]
    database_url: str | None = None  # None: DATABASE_URL, else the SQLite file
    _statuses: dict[str, tuple[float, BackendStatus]] = field(default_factory=dict)
    # Each engine's state, read once per interval for every reply and panel (core.engines).
    readings: EngineReadings = field(default_factory=EngineReadings)
    auth: AuthConfig = field(default_factory=AuthConfig)
    _store: Store | None = None
    storage_problem: str | None = None
    _store_lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    _storage_tried: bool = False
    _storage_ready: bool = False  # opened and migrated (else `_store` only keeps writes for later)
    _storage_retry: asyncio.Task | None = None
    # One load run at a time in the whole deployment - a simulation of N users, a capacity sweep or a
    # /bench - so a classroom cannot multiply the load. The running one's task is kept here until it
    # ends (asyncio itself keeps only a weak reference to a task), with the notice that refuses
    # another meanwhile. On PostgreSQL the run also holds an advisory lock (`_held_load`), so no other
    # replica on the same database starts one; it is released when the run ends or this process dies.
    replica: str = field(default_factory=replica_id)
    simulation: Simulation | None = None
    capacity_sweep: "TeacherSweep | None" = None
    cache_lesson: "CacheLesson | None" = None  # the engine panel's prefix-cache lesson, running or last run
    class_replay: "ClassFit | None" = None  # "would today's class fit?", running or last run
    load_task: asyncio.Task | None = None
    load_notice: Notice | None = None
    load_lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    _held_load: HeldLock | None = None
    # Held while this process lives (PostgreSQL): its replies in flight are its own, not interrupted.
    _alive: HeldLock | None = None
    _alive_lock: asyncio.Lock = field(default_factory=asyncio.Lock)  # replies start together: one takes it
    # Every person's blind rule in this process (core/disclosure.py), read from the database and kept
    # until PostgreSQL announces a change (`_changes`) or, without that, for a moment.
    blind_open_s: float = DEFAULT_BLIND_OPEN_S
    disclosures: DisclosureBook = field(default=None)  # type: ignore[assignment] - made in __post_init__
    _changes: ChangeFeed | None = None

    def __post_init__(self) -> None:
        if self.disclosures is None:
            self.disclosures = DisclosureBook(self._waiting_rounds_of, self._open_blind_rounds)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> "AppState":
        if env is None:
            load_env()
            env = dict(os.environ)
        raw_open = (env.get(BLIND_OPEN_VARIABLE) or "").strip()
        auth = auth_from_env(env)
        default_open_s = DEFAULT_BLIND_OPEN_S if auth.enabled else DEFAULT_BLIND_OPEN_NO_LOGIN_S
        return cls(
            registry=Registry.from_env(env),
            defaults=ChatDefaults.from_env(env, backend_names(env)),
            presets=load_presets(),
            auth=auth,
            blind_open_s=parse_seconds(BLIND_OPEN_VARIABLE, raw_open) if raw_open else default_open_s,
        )

    # ------------------------------------------------------------ the blind rule (core/disclosure.py)

    async def rule(self, person: str, *, wait_s: float | None = None) -> Disclosure:
        """This person's blind rule, up to date (read again only after a change or, without a change
        feed, after a moment); the database is opened first so its change feed listens."""
        await self.storage()
        if wait_s is None:
            return await self.disclosures.current(person)
        return await self.disclosures.current(person, wait_s=wait_s)

    def backend_words(self, name: str, status: BackendStatus | None = None) -> set[str]:
        """What would name this backend in a browser (core.disclosure.identifying_words): its name,
        labels and address, and its model id where a status of it is known."""
        if name not in self.registry.names:
            return {name}
        backend = self.registry.get(name)
        status = status or self.cached_statuses().get(name)
        info = status.info if status is not None else None
        return identifying_words(name=backend.name, label=backend.label, url=backend.url,
                                 model=info.model_id if info else "",
                                 display_label=display_label(backend.label, info.stand_in if info else None))

    async def _waiting_rounds_of(self, person: str) -> dict[str, HeldRound]:
        """The book's reader: a person's blind rounds that wait for a vote, on every replica."""
        store = await self.storage()
        if store is None:  # no database: the rounds are this process's own, held where they started
            return {}
        if store.outbox is not None and store.outbox.waiting:
            # Rounds written by this process before a restart may be among them: the database cannot say.
            raise DatabaseUnavailable(f"{store.outbox.waiting} row(s) still wait to be written")
        waiting = await store.waiting_blind_rounds(person)
        held = {}
        for stored in waiting:
            names = [column.backend for column in stored.columns]
            words = set().union(*(self.backend_words(name) for name in names))
            held[stored.id] = HeldRound(frozenset(words), frozenset(names))
        return held

    async def _open_blind_rounds(self) -> int:
        """The book's counter: blind rounds of anyone, started within BLIND_OPEN_S, without a vote."""
        store = await self.storage()
        if store is None:
            return 0
        if store.outbox is not None and store.outbox.waiting:
            raise DatabaseUnavailable(f"{store.outbox.waiting} row(s) still wait to be written")
        return await store.open_blind_rounds(utc_now() - timedelta(seconds=self.blind_open_s))

    def _listen_for_changes(self, store: Store) -> None:
        """On PostgreSQL, other replicas announce changes of blind rounds; on SQLite (one process) and
        without a database every change is this process's own."""
        book = self.disclosures

        def lost() -> None:
            book.feed_live = self._changes is not None and self._changes.live
            book.feed_lost()

        self._changes = store.listen(BLIND_CHANNEL, on_change=book.changed, on_lost=lost)
        book.one_process = self._changes is None

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

        A database that is unavailable at start (stopped, unreachable, hung) is not given up: a
        store is returned all the same, whose writes wait in the outbox (its reads fail with
        DatabaseUnavailable, as in any outage), `storage_problem` says why, and the database is
        tried again in the background until it opens; then it is migrated and what waits is
        written. None only for a DATABASE_URL this app cannot use or a database migrated by a
        newer version, which waiting does not change."""
        async with self._store_lock:
            if not self._storage_tried:
                self._storage_tried = True
                await self._open_storage()
            return self._store

    async def _open_storage(self) -> None:
        """Open and migrate the database; on an outage keep a store that waits (see `storage`)."""
        store: Store | None = None
        try:
            store = await Store.open(self.database_url, flush_outbox=False)
            await store.migrate()
        except DatabaseUnavailable as error:
            if store is not None:
                await store.aclose()
            self.storage_problem = str(error)
            log.error("storage unavailable, tried again in the background: %s", error)
            if self._store is None:
                self._store = Store.waiting(self.database_url)
            self._retry_storage()
            return
        except (StoreError, ConfigurationError) as error:  # DATABASE_URL unusable, or a newer schema
            if store is not None:
                await store.aclose()
            self.storage_problem = str(error)
            log.error("storage unavailable: %s", error)
            self.disclosures.one_process = True  # nothing stored: every round is this process's own
            return
        waiting, self._store = self._store, store
        self.storage_problem, self._storage_ready = None, True
        store.start_outbox()  # after the migration: no waiting row before its table
        self._listen_for_changes(store)
        if waiting is not None:
            await waiting.aclose()
            log.warning("storage: the database answers again; rows kept meanwhile are being written")

    def _retry_storage(self) -> None:
        if self._storage_retry is None or self._storage_retry.done():
            self._storage_retry = asyncio.get_running_loop().create_task(self._keep_trying_storage(),
                                                                        name="storage-retry")

    async def _keep_trying_storage(self) -> None:
        delay = STORAGE_RETRY_FIRST_S
        while not self._storage_ready and self.storage_problem is not None:
            await asyncio.sleep(delay)
            delay = min(delay * 2, STORAGE_RETRY_S)
            async with self._store_lock:
                await self._open_storage()

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

    async def in_flight_mark(self) -> dict:
        """Metadata for a reply about to stream: which process answers it. Should this process die
        mid-reply, a reopened chat shows that reply as interrupted (ui.chat_history), never as an
        empty or finished one; the mark is replaced when the reply ends. Empty where no other
        process could tell (SQLite: one process) or the database does not answer."""
        store = await self.storage()
        if store is None or not store.shared_locks:
            return {}
        if self._alive is None and store.outbox is not None and store.outbox.unavailable_within(STORAGE_RETRY_S):
            return {}  # the database was unavailable just now: a reply does not wait for its timeout
        async with self._alive_lock:
            if self._alive is None:
                try:
                    self._alive = await store.try_lock(LockKey(PROCESS_ALIVE_SPACE, process_key()),
                                                       PROCESS_LOCK_NAME + self.replica)
                except StoreError as error:
                    log.warning("replies are not marked in flight (database unavailable): %s", error)
                    return {}
                if self._alive is not None:
                    self._alive.keep()  # taken again after a restart of the database
            if self._alive is None:
                return {}
        return {"in_flight": {"replica": self.replica, "process": process_key()}}

    async def running_load(self) -> Notice | None:
        """The load run going on now, here or on another replica of this database, as the notice
        that refuses another one; None when there is none."""
        if self.load_task is not None and not self.load_task.done():
            return self.load_notice
        store = await self.storage()
        if store is None or not store.shared_locks:
            return None
        try:
            holders = await store.lock_holders([LOAD_RUN])
        except StoreError as error:  # the database is down: only this process's own rule holds now
            log.warning("could not ask the database for a load run on another replica: %s", error)
            return None
        return _elsewhere(holders.get(LOAD_RUN))

    async def start_load(self, notice: Notice, run: Coroutine[Any, Any, None] | None = None) -> Notice | None:
        """Make `run` (started as a task here) or, without it, the current task the deployment's one
        load run, after `running_load()` said None (under `load_lock`). Returns the notice that refuses
        it when another replica took the deployment's load lock first (`run` is then closed, never
        started). The task calls `end_load` when it ends."""
        store = await self.storage()
        if store is not None and store.shared_locks:
            try:
                held = await store.try_lock(LOAD_RUN, LOAD_LOCK_NAME + self.replica)
            except StoreError as error:
                log.warning("load run started without the deployment's lock (database unavailable): %s", error)
                held = None
            else:
                if held is None:
                    if run is not None:
                        run.close()
                    try:
                        holder = (await store.lock_holders([LOAD_RUN])).get(LOAD_RUN)
                    except StoreError:
                        holder = None
                    return _elsewhere(holder) or Notice("load_elsewhere", {"replica": "?"})
            if held is not None:
                held.keep()  # taken again after a restart of the database, while the run goes on
            self._held_load = held
        self.load_task = asyncio.current_task() if run is None else asyncio.create_task(run)
        self.load_notice = notice
        return None

    async def end_load(self, task: asyncio.Task | None) -> None:
        """The load run `task` ended: free the app (and the deployment's lock) for the next one."""
        if self.load_task is not task:
            return
        held, self._held_load = self._held_load, None
        self.load_task, self.load_notice = None, None
        if held is not None:
            await asyncio.shield(held.release())  # a cancelled run still frees the lock


def _elsewhere(holder: str | None) -> Notice | None:
    if holder is None:
        return None
    return Notice("load_elsewhere", {"replica": holder.removeprefix(LOAD_LOCK_NAME) or "?"})


def class_blind_notice(state: AppState) -> Notice:
    """Live load waits for the class's open blind rounds: for how long at most, and who can end it."""
    return Notice("panel_class_blind", {"minutes": max(1, round(state.blind_open_s / 60))})


def sees_live_load(state: AppState, user: str | None) -> bool:
    """Whether this person may see live per-engine load while blind rounds are open in the
    deployment: a teacher, with login on. With login off nobody can be told apart, so nobody
    (core/disclosure.py, docs/deploying/classroom.md, "Blind is per person")."""
    return state.auth.enabled and state.auth.is_teacher(user)


async def live_load_refusal(state: AppState, mode: str, user: str | None, *, rule: Disclosure) -> Notice | None:
    """Why this person may not watch the engines' live load now (the engine panel), or None: never in
    blind mode or while a blind round of theirs waits; while any blind round in the deployment is open,
    teachers only."""
    if mode == "blind":
        return Notice("panel_blind")
    if (wait := rule.refusal("engines")) is not None:
        return Notice(wait.key, wait.values)
    if not sees_live_load(state, user) and await state.disclosures.deployment_open():
        return class_blind_notice(state)
    return None


async def load_refusal(state: AppState, mode: str, user: str | None, *, rule: Disclosure) -> Notice | None:
    """Why this person may not start load (a simulation, a sweep or /bench) now, or None. With login on
    only teachers may; never in blind mode or while a blind round of theirs waits (an engine's load
    would show which column is which), nor, for anyone but a teacher, while any blind round in the
    deployment is open; and one load run at a time in the deployment."""
    if not state.auth.is_teacher(user):
        return Notice("simulate_teachers_only")
    if mode == "blind":
        return Notice("panel_blind")
    if (wait := rule.load_refusal()) is not None:
        return Notice(wait.key, wait.values)
    if not sees_live_load(state, user) and await state.disclosures.deployment_open():
        return class_blind_notice(state)
    return await state.running_load()


# A reply that failed this way may mean the server went down: probe it again and show the result.
SERVER_MAY_BE_DOWN = (BackendUnavailable, BackendTimeout, ConnectionLost)


def server_may_be_down(error: BackendError | None) -> bool:
    """Whether a failed reply should make the app probe its backend again (and update the list)."""
    return isinstance(error, SERVER_MAY_BE_DOWN)


