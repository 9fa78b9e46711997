"""The reply flow without Chainlit: shared state, backend status, and preparing a reply as data.

`plan_reply` does everything that happens before a reply streams - checking
the backend, fitting the history into its context, fixing the sampling
settings and preparing the request (lookups, templating) - and returns
either a `ReplyPlan` or a `Refusal`, with what the person should be told as
`Notice`s. The Chainlit layer (`ui/session_view.py`) only renders them; tests
drive this module with a fake backend.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
import uuid
from dataclasses import asdict, dataclass, field, replace
from typing import Mapping, Sequence

from backends.base import SETTING_LABELS, Backend, ChatMessage, PreparedRequest, display_label
from backends.engine_metrics import EngineSnapshot
from backends.errors import BackendError, BackendTimeout, BackendUnavailable, ConnectionLost
from backends.registry import BackendStatus, Registry
from backends.watchdog import watched
from core.auth import AuthConfig, auth_from_env
from core.engines import Simulation, take_snapshot
from core.history import fit_to_context
from core.texts import text
from core.settings import SessionSettings, load_presets
from config import ChatDefaults, ConfigurationError, backend_names, load_env
from store import SavedLater, Store, StoredReply, StoreError
from store.records import utc_now
from core.timing import RequestRecord, TimedStream

log = logging.getLogger(__name__)

INFO_CACHE_S = 30.0
STORAGE_RETRY_S = 30.0  # a database that could not be opened is tried again after this long
STATUS_TIMEOUT_S = 4.0
ENGINE_STATE_TIMEOUT_S = 1.0


@dataclass(frozen=True)
class Notice:
    """Something the person should know about a reply, as data (rendered by core.texts)."""

    key: str
    values: Mapping[str, object] = field(default_factory=dict)

    def render(self, lang: str) -> str:
        return text(self.key, lang, **self.values)


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
        store = await self.storage()
        if store is None:
            return Notice("not_saved", {"problem": self.storage_problem or "no database"})
        try:
            await store.save_reply(reply)
        except SavedLater as later:
            log.warning("reply %s waits in the outbox: %s", reply.id, later.problem)
            return Notice("saved_later", {"waiting": later.waiting})
        except StoreError as error:
            log.error("could not store reply %s: %s", reply.id, error)
            return Notice("not_saved", {"problem": str(error)})
        return None

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


@dataclass(frozen=True)
class ReplyPlan:
    """A reply ready to stream: the backend, the prepared request, notices to show first, and
    the engine's state when it started (running/waiting requests, KV cache), where reported."""

    backend: Backend
    model: str
    request: PreparedRequest
    notices: tuple[Notice, ...] = ()
    engine_at_start: EngineSnapshot | None = None
    stand_in: str | None = None  # the server stands in for another engine (the TGI-protocol test server)

    @property
    def label(self) -> str:
        """The backend's name wherever this reply's numbers are shown ("TGI (stand-in)")."""
        return display_label(self.backend.label, self.stand_in)

    def open_stream(self) -> TimedStream:
        """The measured stream under the backend's first-token and stall limits; the request
        leaves (and the clock starts) on its first iteration."""
        return TimedStream(watched(self.backend, self.request), backend=self.label, model=self.model)


@dataclass(frozen=True)
class Refusal:
    """The reply cannot be sent now; `reason` says why and what to do."""

    label: str
    reason: str


def system_message(settings: SessionSettings, presets: Mapping[str, str]) -> ChatMessage | None:
    prompt = settings.system_prompt(presets)
    return ChatMessage("system", prompt) if prompt else None


async def plan_reply(
    state: AppState,
    settings: SessionSettings,
    history: Sequence[ChatMessage],
    user_text: str,
) -> ReplyPlan | Refusal:
    """Check the backend, fit the conversation into its context, prepare the request."""
    backend = state.registry.get(settings.backend)
    turns = [*history, ChatMessage("user", user_text)]
    try:
        status = await state.status(settings.backend)
        if not status.available:
            status = await state.status(settings.backend, fresh=True)
        if not status.available:
            return Refusal(status.label, status.reason or "")
        context = status.info.context_length if status.info else None
        fitted = await fit_to_context(system_message(settings, state.presets), turns,
                                      backend.count_prompt_tokens, context, settings.max_new_tokens)
        params = replace(settings.params(), max_new_tokens=fitted.max_new_tokens)
        request = await backend.prepare(fitted.messages, params)
    except BackendError as error:
        return Refusal(backend.label, error.describe())
    notices = []
    if fitted.dropped_messages:
        notices.append(Notice("trimmed", {"dropped": fitted.dropped_messages, "backend": backend.label,
                                          "context": context}))
    if fitted.max_new_tokens < settings.max_new_tokens:
        notices.append(Notice("capped", {"tokens": fitted.max_new_tokens, "backend": backend.label}))
    model = status.info.model_id if status.info else request.model
    # Before the clock: what the engine was busy with, so a slow reply can be explained later.
    engine = (await take_snapshot(backend, ENGINE_STATE_TIMEOUT_S)).snapshot
    return ReplyPlan(backend, model, request, tuple(notices), engine,
                     stand_in=status.info.stand_in if status.info else None)


def empty_reply_notice(record: RequestRecord, reply_text: str) -> Notice | None:
    """A reply that completed without any text must not pass as a normal answer: say so."""
    if record.status != "completed" or reply_text.strip():
        return None
    return Notice("empty_reply", {"tokens": record.output_tokens, "finish_reason": record.finish_reason or "?"})


def ignored_notes(request: PreparedRequest) -> list[str]:
    """One line per setting the engine could not honour, e.g. 'top-k is not supported by ...: ignored'."""
    return [ignored.describe() for ignored in request.ignored]


def sent_summary(request: PreparedRequest) -> str:
    """What went on the wire, in the engine's own names: 'temperature=0.7, top_p=0.9, ...'."""
    return ", ".join(f"{name}={value}" for name, value in request.sent.items())


def setting_label(name: str) -> str:
    return SETTING_LABELS.get(name, name)


def stored_reply(
    plan: ReplyPlan,
    record: RequestRecord,
    *,
    user_text: str,
    reply_text: str,
    mode: str = "chat",
    reply_id: str | None = None,
    thread_id: str | None = None,
    user_identifier: str | None = None,
    round_id: str | None = None,
    column_label: str | None = None,
) -> StoredReply:
    """What the database keeps of a finished reply: who answered, what was sent, every figure."""
    return StoredReply(
        id=reply_id or str(uuid.uuid4()),
        thread_id=thread_id,
        user_identifier=user_identifier,
        created_at=utc_now(),
        backend=plan.backend.name,
        backend_label=plan.label,
        model=plan.model,
        mode=mode,
        round_id=round_id,
        column_label=column_label,
        prompt=user_text,
        reply_text=reply_text,
        status=record.status,
        first_token_s=record.first_token_s,
        decode_tokens_per_s=record.decode_tokens_per_s,
        output_tokens=record.output_tokens,
        total_s=record.total_s,
        ms_per_output_token=record.ms_per_output_token,
        settings_sent={"sent": dict(plan.request.sent), "chosen": plan.request.params.chosen(),
                       "ignored": ignored_notes(plan.request), "notes": list(plan.request.notes)},
        record={**record.as_dict(include_timeline=True),
                "engine_at_start": asdict(plan.engine_at_start) if plan.engine_at_start else None},
        error=record.error,
    )
