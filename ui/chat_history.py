"""Chainlit's chat history on the app's database.

    @cl.data_layer
    def data_layer():
        return chainlit_data_layer()

Registering it with `@cl.data_layer` matters: without it, Chainlit sees
`DATABASE_URL` and starts its own PostgreSQL-only data layer, which expects a
different schema. The tables come from `Store.migrate()` (or `python -m store init`).

History is as safe from database faults as the app's own rows: every write
Chainlit's layer makes goes through `execute_sql`, and one the database cannot
take now waits in the outbox (store/outbox.py), in order with the app's rows,
until it answers again. Errors are logged by their driver's message only,
never with the SQL or the row's values.

History is written behind the chat, in batches (`HistoryWrites`): Chainlit
writes a step per message, per run and per update, each through its own
transaction (on SQLite a connection and a thread each), on the event loop
every reply shares. Measured with 30 students sending at once, that cost
~130 ms of CPU per reply (3x a bare Chainlit app) and put +600 ms before
every student's first text. So a write is queued and returns at once, and
one transaction writes everything queued within `BATCH_WINDOW_S`, in order;
a read first waits for the writes queued before it (a chat reopened sees its
last message). Chainlit also reads a thread back before every step it writes
(does it exist yet?): a thread this process wrote or read is known to exist,
so only its first step asks. What a crash can lose is the last window's
history (its replies' own rows are written by the app, not here).

The one module of this package that imports Chainlit.
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

from chainlit.data.sql_alchemy import SQLAlchemyDataLayer
from chainlit.data.utils import queue_until_user_message
from chainlit.data.storage_clients.base import BaseStorageClient
from sqlalchemy import text
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import sessionmaker

from core.replica import process_key
from core.texts import text as ui_text
from store.db import create_engine, safe_message, unavailable_reason
from store.errors import NotSaved, StoreError
from store.locks import PROCESS_ALIVE_SPACE, LockKey, lock_holders
from store.outbox import Outbox, outbox_for
from store.urls import database_url, normalise_url

log = logging.getLogger(__name__)
WRITE_VERBS = ("INSERT", "UPDATE", "DELETE")
BATCH_WINDOW_S = 0.1  # history writes queued within this long go in one transaction

# Columns Chainlit reads back as JSON documents or lists, under the names its queries give them.
_JSON_RESULT_KEYS = frozenset({
    "metadata", "tags", "generation", "props", "modes", "playerConfig",
    "thread_metadata", "thread_tags", "step_metadata", "step_tags", "step_generation",
})
_BOOLEAN_RESULT_KEYS = frozenset({
    "streaming", "waitForAnswer", "isError", "defaultOpen", "autoCollapse", "autoPlay",
    "step_streaming", "step_waitforanswer", "step_iserror",
})


class AppDataLayer(SQLAlchemyDataLayer):
    """Chainlit's `SQLAlchemyDataLayer`, made to store and read back the same values on SQLite and PostgreSQL.

    Chainlit sends a few values as Python objects its SQL cannot bind (dicts
    everywhere, lists on SQLite, which has no arrays): they are sent as JSON.
    SQLite returns JSON as text and booleans as 0/1: they are decoded, so the
    UI gets the same thread on both databases (the browser reads a custom
    element's props as an object).

    Without a file storage service Chainlit keeps no elements at all; a custom
    element is only its props, so it is kept here in the elements table
    (the app's figures and compare rounds then come back when a chat is
    reopened from the history sidebar). Files still need a storage service.

    Known gaps in Chainlit 2.12 itself, on both databases: `get_element`
    (elements shown with display="page") json.loads() props that are already
    decoded and raises TypeError; `get_favorite_steps` uses LIKE on the
    metadata, which PostgreSQL's JSONB refuses (favorites are off by default).
    """

    outbox: Outbox | None = None
    writes: "HistoryWrites | None" = None
    known_threads: set[str] | None = None

    async def execute_sql(self, query: str, parameters: dict) -> list[dict[str, Any]] | int | None:
        on_sqlite = self.engine.dialect.name == "sqlite"
        parameters = {key: without_nul(value) for key, value in parameters.items()}
        parameters = {
            key: json.dumps(value) if isinstance(value, dict) or (on_sqlite and isinstance(value, list)) else value
            for key, value in parameters.items()
        }
        writing = query.lstrip().split(None, 1)[0].upper() in WRITE_VERBS
        if writing and self.outbox is not None and self.outbox.waiting:
            return self._keep(query, parameters, self.outbox.problem or "earlier rows still wait")
        if self.writes is not None:
            if writing:
                self.writes.queue(query, parameters)
                return None  # Chainlit's writes use no result
            await self.writes.flush()  # a read sees every write queued before it
        try:
            async with self.async_session() as session:
                async with session.begin():
                    result = await session.execute(text(query), parameters)
                    rows = [dict(row._mapping) for row in result.fetchall()] if result.returns_rows else None
        except (SQLAlchemyError, OSError, TimeoutError) as error:
            reason = unavailable_reason(error)
            if reason is not None and writing and self.outbox is not None:
                return self._keep(query, parameters, reason)
            # Chainlit's own layer logs and returns None too; here without the SQL or the values.
            log.warning("chat history: a %s failed: %s", query.lstrip().split(None, 1)[0].upper(), safe_message(error))
            return None
        if rows is None:
            return result.rowcount
        cleaned = self.clean_result(rows)
        return [_decode_sqlite_row(row) for row in cleaned] if on_sqlite else cleaned

    def _keep(self, query: str, parameters: dict, problem: str) -> None:
        """A history write the database cannot take now: it waits in the outbox, in order."""
        try:
            waiting = self.outbox.put({"sql": query, "parameters": parameters}, problem)
        except NotSaved as lost:
            log.error("chat history: a write is lost: %s", lost)
            return None
        log.warning("chat history: the database is unavailable (%s); %d row(s) wait to be written", problem, waiting)
        return None

    async def update_thread(self, thread_id: str, name=None, user_id=None, metadata=None, tags=None):
        """Chainlit's upsert of a thread, without reading it first unless metadata is to be merged.

        Chainlit reads the thread (and the user's identifier) before every write to it, also before
        every step it writes: in a burst each read waited for the history queued before it. Here a
        thread known to exist and nothing to change is left alone; otherwise one statement inserts it
        or sets only the fields given (name, owner, tags), never its `createdAt` or `metadata`, and
        finds the owner's identifier itself. Metadata (the session saved at disconnect) is merged
        with what is stored, which needs Chainlit's read."""
        known = self.known_threads
        if metadata is not None or known is None:
            result = await super().update_thread(thread_id, name=name, user_id=user_id, metadata=metadata, tags=tags)
            if known is not None:
                known.add(thread_id)
            if self.writes is not None:
                # Chainlit saves the session (the settings panel's values) here as a chat is left, often
                # as the app stops: written now, not a batch window later.
                await self.writes.flush()
            return result
        given = {key: value for key, value in (("name", name), ("userId", user_id), ("tags", tags)) if value is not None}
        if not given and thread_id in known:
            return None
        values = {"id": thread_id, "createdAt": await self.get_current_timestamp(), "metadata": {}, **given}
        columns = list(values)
        placeholders = [f":{column}" for column in columns]
        if user_id is not None:  # the owner's identifier, as Chainlit stores it beside the owner's id
            columns.append("userIdentifier")
            placeholders.append('(SELECT "identifier" FROM users WHERE "id" = :userId)')
        updates = ", ".join(f'"{column}" = EXCLUDED."{column}"' for column in columns
                            if column not in ("id", "createdAt", "metadata"))
        conflict = f"DO UPDATE SET {updates}" if updates else "DO NOTHING"
        await self.execute_sql(
            f'INSERT INTO threads ({", ".join(chr(34) + c + chr(34) for c in columns)}) '
            f'VALUES ({", ".join(placeholders)}) ON CONFLICT ("id") {conflict};', values)
        known.add(thread_id)  # its insert is queued ahead of its steps
        return None

    async def get_thread(self, thread_id: str):
        """The thread as Chainlit reads it, with the replies of app processes that died mid-reply
        marked interrupted (and kept so): see `_mark_interrupted`."""
        thread = await super().get_thread(thread_id)
        if thread and self.engine.dialect.name == "postgresql":
            await self._mark_interrupted(thread)
        return thread

    async def _mark_interrupted(self, thread: dict) -> None:
        """A reply still marked in flight (core.app_state.in_flight_mark) whose process no longer holds
        its alive lock was cut off when that process (a replica) died: its text, if any, stays, followed
        by a line that says so; the step becomes an error and loses its in-flight mark."""
        marked = []
        for step in thread.get("steps") or []:
            metadata = step.get("metadata")
            if isinstance(metadata, str):
                metadata = json.loads(metadata or "{}")
            in_flight = (metadata or {}).get("in_flight")
            if isinstance(in_flight, dict) and in_flight.get("process") != process_key():
                marked.append((step, metadata, in_flight))
        if not marked:
            return
        keys = {LockKey(PROCESS_ALIVE_SPACE, int(in_flight["process"])) for _, _, in_flight in marked}
        try:
            alive = await lock_holders(self.engine, sorted(keys, key=lambda key: key.item))
        except StoreError as error:
            log.warning("chat history: cannot tell whether replies in flight are interrupted: %s", error)
            return
        for step, metadata, in_flight in marked:
            if LockKey(PROCESS_ALIVE_SPACE, int(in_flight["process"])) in alive:
                continue  # still being answered by a live replica
            replica = str(in_flight.get("replica") or "?")
            note = ui_text("reply_interrupted", "en", replica=replica)
            output = f"{step.get('output') or ''}\n\n{note}".strip()
            metadata = {key: value for key, value in metadata.items() if key != "in_flight"}
            metadata["interrupted"] = {"replica": replica}
            step.update(output=output, metadata=metadata, isError=True)
            await self.execute_sql('UPDATE steps SET "output" = :output, "metadata" = :metadata, "isError" = :is_error '
                                   'WHERE "id" = :id', {"output": output, "metadata": metadata, "is_error": True,
                                                        "id": step["id"]})

    @queue_until_user_message()
    async def create_element(self, element) -> None:
        if element.type != "custom" or self.storage_provider is not None:
            return await super().create_element(element)
        if not element.for_id:
            return
        row = {key: value for key, value in element.to_dict().items()
               # A session file (chainlitKey) does not outlive the session; the props are the element.
               if value is not None and key not in ("url", "chainlitKey", "objectKey")}
        columns = ", ".join(f'"{column}"' for column in row)
        placeholders = ", ".join(f":{column}" for column in row)
        updates = ", ".join(f'"{column}" = :{column}' for column in row if column != "id")
        await self.execute_sql(
            f"INSERT INTO elements ({columns}) VALUES ({placeholders}) ON CONFLICT (id) DO UPDATE SET {updates};",
            row)


class HistoryWrites:
    """Chainlit's history writes, queued and written in order, a batch per transaction (see the module).

    A batch the database cannot take now (unavailable) goes to the outbox whole, in order, as its
    writes would have one by one. A batch it refuses for what a write holds is written again one
    write per transaction, so one refused write is logged and the others are kept.
    """

    def __init__(self, layer: AppDataLayer, window_s: float = BATCH_WINDOW_S) -> None:
        self.layer = layer
        self.window_s = window_s
        self._queued: list[tuple[str, dict]] = []
        self._timer: asyncio.TimerHandle | None = None
        self._lock = asyncio.Lock()
        self._tasks: set[asyncio.Task] = set()

    @property
    def waiting(self) -> int:
        return len(self._queued)

    def queue(self, query: str, parameters: dict) -> None:
        self._queued.append((query, parameters))
        if self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(self.window_s, self._flush_soon)

    def _flush_soon(self) -> None:
        self._timer = None
        task = asyncio.get_running_loop().create_task(self.flush())
        self._tasks.add(task)  # kept until done: the loop holds only a weak reference
        task.add_done_callback(self._tasks.discard)

    async def flush(self) -> None:
        """Write everything queued so far (a read waits for this first)."""
        async with self._lock:
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None
            batch, self._queued = self._queued, []
            if batch:
                await self._write(batch)

    async def _write(self, batch: list[tuple[str, dict]]) -> None:
        layer = self.layer
        try:
            async with layer.engine.begin() as connection:
                for query, parameters in batch:
                    await connection.execute(text(query), parameters)
        except (SQLAlchemyError, OSError, TimeoutError) as error:
            reason = unavailable_reason(error)
            if reason is not None and layer.outbox is not None:
                for query, parameters in batch:
                    layer._keep(query, parameters, reason)
                return
            if len(batch) == 1:
                log.warning("chat history: a %s failed: %s", batch[0][0].lstrip().split(None, 1)[0].upper(),
                            safe_message(error))
                return
            for single in batch:  # which one was refused: the others are kept
                await self._write([single])


async def flush_history() -> None:
    """Write the history still queued (the app is stopping): Chainlit's data layer, if it is this one."""
    from chainlit.data import get_data_layer

    layer = get_data_layer()
    if isinstance(layer, AppDataLayer) and layer.writes is not None:
        await layer.writes.flush()


class _DropMessage(logging.Filter):
    def __init__(self, fragment: str) -> None:
        super().__init__()
        self.fragment = fragment

    def filter(self, record: logging.LogRecord) -> bool:
        return self.fragment not in record.getMessage()


def without_nul(value: Any) -> Any:
    """`value` without NUL characters, in its strings and in those of its dicts and lists (JSON documents
    included): PostgreSQL's text and JSON cannot hold NUL, so a step or thread named by a message that held
    one would be refused, and with it every step of that chat. Chainlit keeps the raw message as the
    name of a new chat and the input of its run step; the app's own copy is already cleaned (core.input)."""
    if isinstance(value, str):
        return value.replace("\x00", "") if "\x00" in value else value
    if isinstance(value, dict):
        return {key: without_nul(item) for key, item in value.items()}
    if isinstance(value, list):
        return [without_nul(item) for item in value]
    return value


def _decode_sqlite_row(row: dict[str, Any]) -> dict[str, Any]:
    decoded = dict(row)
    for key, value in row.items():
        if key in _JSON_RESULT_KEYS and isinstance(value, str):
            decoded[key] = json.loads(value)
        elif key in _BOOLEAN_RESULT_KEYS and isinstance(value, int):
            decoded[key] = bool(value)
    return decoded


def chainlit_data_layer(url: str | None = None, *,
                        storage_provider: BaseStorageClient | None = None) -> AppDataLayer:
    """Chainlit's data layer on `url` (default: `DATABASE_URL`, else the SQLite file), ready for each database.

    Without a `storage_provider` Chainlit keeps no files; messages, threads,
    feedback and custom elements (their props) are stored. Its engine is made
    like the app's (`store.db.create_engine`: parameters hidden, a vanished
    SQLite file never re-created, a restarted PostgreSQL reconnected to), and
    its writes share the app's outbox.
    """
    url = normalise_url(url) if url else database_url()
    # Its "elements will not be persisted" warning is not true of this layer (custom elements are).
    chainlit_logger = logging.getLogger("chainlit")
    quiet = _DropMessage("storage client is not initialized")
    chainlit_logger.addFilter(quiet)
    try:
        layer = AppDataLayer(conninfo=url, storage_provider=storage_provider)
    finally:
        chainlit_logger.removeFilter(quiet)
    # Its own engine (made from the bare URL) is replaced before it ever connects.
    layer.engine = create_engine(url)
    layer.async_session = sessionmaker(bind=layer.engine, expire_on_commit=False, class_=AsyncSession)
    layer.outbox = outbox_for(url)
    layer.writes = HistoryWrites(layer)
    layer.known_threads = set()
    return layer
