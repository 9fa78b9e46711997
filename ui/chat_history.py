"""Chainlit's chat history on the app's database.

    @cl.data_layer
    def data_layer():
        return chainlit_data_layer()

Registering it with `@cl.data_layer` matters: without it, Chainlit sees
`DATABASE_URL` and starts its own PostgreSQL-only data layer, which expects a
different schema. The tables come from `Store.migrate()` (or `python -m store init`).

History is as safe from database faults as the app's own rows: every write
Chainlit's layer makes goes through `execute_sql`, its values cleaned of what a
database refuses (NUL, unpaired surrogates: store/faults.py), and store.faults
decides what a failure means. One the database cannot take now waits in the
outbox (store/outbox.py), in order with the app's rows, until it answers again;
one it refuses for what it holds is set aside in the dead-letter file at once,
so nothing behind it waits for it. While rows wait (or a read just found the
database unavailable) reads are not tried: they could not see those rows, and a
hung database would hold every page load for its timeout. Threads are written as
changes that never overwrite (`update_thread`, store/history.py) and a person's
user row as one upsert that collapses while it waits (`create_user`). Errors are
logged by their driver's message only, never with the SQL or the row's values.

History is written behind the chat, in batches (`HistoryWrites`): Chainlit
writes a step per message, per run and per update, each through its own
transaction (on SQLite a connection and a thread each), on the event loop
every reply shares. Measured with 30 students sending at once, that cost
~130 ms of CPU per reply (3x a bare Chainlit app) and put +600 ms before
every student's first text (experiments/class_burst.py). So a write is queued
and returns at once, and one transaction writes everything queued within
`BATCH_WINDOW_S`, in order; a batch the database cannot take waits in the
outbox whole, in order, and one it refuses is written again a write at a time,
so only the refused write is set aside. A read first waits for the writes
queued before it (a chat reopened sees its last message); the session saved
as a chat is left, and what is queued when the app stops, are written at once.
Chainlit also writes its thread before every step: a thread this process has
written is known to exist, so a step with nothing to change writes no thread.
A reply's start and end do not wait out the window (`HURRY_S` instead): the
person's message and the reply's in-flight mark are written as its message
shows (`write_history_soon`), and its end before its task ends
(`history_written`), so what a crash (not a stop) can lose is the window's
other history: never a reply a person saw end, nor (beyond `HURRY_S`) a
message whose reply had shown. A reply's own row is written
by the app, not here.

The one module of this package that imports Chainlit.
"""

from __future__ import annotations

import asyncio
import json
import logging
import uuid
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, Awaitable, Callable

from chainlit.data.sql_alchemy import SQLAlchemyDataLayer
from chainlit.data.utils import queue_until_user_message
from chainlit.data.storage_clients.base import BaseStorageClient
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession
from sqlalchemy.orm import sessionmaker

from core.replica import process_key
from core.texts import text as ui_text
from store.db import WRITE_ERRORS, create_engine, write_or_classify
from store.errors import NotSaved, StoreError
from store.faults import classify, clean, clean_json_text
from store.history import apply_thread_change, names_a_change, thread_change
from store.locks import PROCESS_ALIVE_SPACE, LockKey, lock_holders
from store.outbox import Outbox, Refused, Unavailable, outbox_for
from store.urls import database_url, normalise_url

log = logging.getLogger(__name__)
WRITE_VERBS = ("INSERT", "UPDATE", "DELETE")
# After a read found the database unavailable, reads are not tried for this long.
READ_PAUSE_S = 2.0
BATCH_WINDOW_S = 0.1  # history writes queued within this long go in one transaction
HURRY_S = 0.01  # a reply's start or end: its history is written within this long (HistoryWrites.hurry)
# Parameters Chainlit hands over as JSON text it dumped itself.
_JSON_TEXT_PARAMETERS = frozenset({"metadata", "generation", "props", "playerConfig", "modes"})

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
    writes: "HistoryWrites | None" = None  # None: every write at once (tests of the write path itself)
    known_threads: set[str] | None = None

    async def execute_sql(self, query: str, parameters: dict) -> list[dict[str, Any]] | int | None:
        on_sqlite = self.engine.dialect.name == "sqlite"
        parameters = self._bind(parameters)
        verb = query.lstrip().split(None, 1)[0].upper()
        if verb in WRITE_VERBS:
            async def work(connection: AsyncConnection) -> int:
                return (await connection.execute(text(query), parameters)).rowcount

            return await self._write({"sql": query, "parameters": parameters}, work, verb)
        if self.writes is not None:
            await self.writes.flush()  # a read sees every write queued before it
        if self.outbox is not None and self.outbox.unavailable_within(READ_PAUSE_S):
            return None  # as Chainlit's layer answers a failed read
        try:
            async with self.async_session() as session:
                async with session.begin():
                    result = await session.execute(text(query), parameters)
                    rows = [dict(row._mapping) for row in result.fetchall()] if result.returns_rows else None
        except WRITE_ERRORS as error:
            fault = classify(error)
            if fault.transient and self.outbox is not None:
                self.outbox.note_unavailable(fault.reason)
            # Chainlit's own layer logs and returns None too; here without the SQL or the values.
            log.warning("chat history: a %s failed: %s", verb, fault.reason)
            return None
        if rows is None:
            return result.rowcount
        cleaned = self.clean_result(rows)
        return [_decode_sqlite_row(row) for row in cleaned] if on_sqlite else cleaned

    def _bind(self, parameters: dict) -> dict:
        """Chainlit's parameters as the database takes them: dicts (and lists on SQLite, which has no
        arrays) as JSON, every text cleaned of what a database refuses (store.faults.clean)."""
        on_sqlite = self.engine.dialect.name == "sqlite"
        bound = {}
        for key, value in parameters.items():
            if isinstance(value, str):
                value = clean_json_text(value) if key in _JSON_TEXT_PARAMETERS else clean(value)
            elif isinstance(value, (dict, list, tuple)):
                value = clean(value)
                if isinstance(value, dict) or on_sqlite:
                    value = json.dumps(value)
            bound[key] = value
        return bound

    async def _write(self, entry: dict, work: Callable[[AsyncConnection], Awaitable[Any]], what: str,
                     key: str | None = None) -> Any:
        """Queue the write for the next batch (`HistoryWrites`), or, without batches, `write_now`.

        With batches every write is queued, even while rows wait in the outbox: a write sent to the
        outbox at once would go ahead of the writes still queued before it (a step ahead of its
        chat's thread, which the database then refuses)."""
        if self.writes is not None:
            self.writes.queue(PendingWrite(entry, work, what, key))
            return None  # Chainlit's writes use no result
        return await self.write_now(entry, work, what, key)

    async def write_now(self, entry: dict, work: Callable[[AsyncConnection], Awaitable[Any]], what: str,
                        key: str | None = None) -> Any:
        """Write now, or keep `entry` in the outbox (rows wait, or the database did not answer), or set
        it aside (the database refused it); `key`: see Outbox.put. Returns what `work` returned."""
        outbox = self.outbox
        if outbox is not None and outbox.waiting:
            return self._keep(entry, outbox.problem or "earlier rows still wait", key)
        try:
            return await write_or_classify(self.engine, work)
        except Unavailable as unavailable:
            if outbox is not None:
                return self._keep(entry, str(unavailable), key)
            log.warning("chat history: a %s failed: %s", what, unavailable)
        except Refused as refused:
            if outbox is not None:
                outbox.set_aside(entry, refused.fault)
            else:
                log.error("chat history: the database refused a %s: %s", what, refused.fault.reason)
        return None

    def _keep(self, entry: dict, problem: str, key: str | None = None) -> None:
        """A history write the database cannot take now: it waits in the outbox, in order."""
        try:
            waiting = self.outbox.put(entry, problem, key=key)
        except NotSaved as lost:
            log.error("chat history: a write is lost: %s", lost)
            return None
        log.warning("chat history: the database is unavailable (%s); %d row(s) wait to be written", problem, waiting)
        return None

    async def create_user(self, user):
        """Chainlit's, as one upsert by identifier: kept during an outage, it is written once however
        many requests of that person asked for it (they collapse in the outbox), and never fails
        on the identifier another request's upsert wrote first."""
        parameters = self._bind({"id": str(uuid.uuid4()), "identifier": str(user.identifier),
                                 "createdAt": await self.get_current_timestamp(),
                                 "metadata": json.dumps(user.metadata or {})})
        query = ('INSERT INTO users ("id", "identifier", "createdAt", "metadata") '
                 'VALUES (:id, :identifier, :createdAt, :metadata) '
                 'ON CONFLICT ("identifier") DO UPDATE SET "metadata" = EXCLUDED."metadata"')

        async def work(connection: AsyncConnection) -> None:
            await connection.execute(text(query), parameters)

        await self._write({"sql": query, "parameters": parameters}, work, "INSERT",
                          key=f"user:{parameters['identifier']}")
        return await self.get_user(user.identifier)

    async def update_thread(self, thread_id: str, name: str | None = None, user_id: str | None = None,
                            metadata: dict | None = None, tags: list[str] | None = None) -> None:
        """Chainlit's, as a change decided against the row when it is written (store/history.py):
        kept during an outage, it neither resets an existing thread's creation time and metadata
        nor loses the owner of a chat first created then (the session's login names them)."""
        nothing_to_change = name is None and user_id is None and metadata is None and tags is None
        known = self.known_threads
        if nothing_to_change and known is not None and thread_id in known:
            return None  # Chainlit asks before every step; this process has written the thread already
        change = thread_change(thread_id, created_at=await self.get_current_timestamp(), name=name, user_id=user_id,
                               user_identifier=None if user_id else _session_user_identifier(),
                               metadata=metadata, tags=tags, writer=writer_identifier())

        async def work(connection: AsyncConnection) -> None:
            await apply_thread_change(connection, change)

        await self._write({"thread": change}, work, "thread update" if names_a_change(change) else "thread insert")
        if known is not None:
            known.add(thread_id)  # its write is queued ahead of its steps
        if metadata is not None and self.writes is not None:
            # Chainlit saves the session (the settings panel's values) here as a chat is left, often as
            # the app stops: written now, not a batch window later.
            await self.writes.flush()

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
    async def create_step(self, step_dict: dict) -> None:
        """Chainlit's, with one change (see `owned`): a step whose id is already stored in another
        thread is not moved or changed. The id comes from the browser (a typed message's); the
        thread is the session's own, so a message keeps the thread it was first written in."""
        await self.update_thread(step_dict["threadId"])
        step_dict["showInput"] = str(step_dict.get("showInput", "")).lower() if "showInput" in step_dict else None
        parameters = {key: value for key, value in step_dict.items()
                      if value is not None and not (isinstance(value, dict) and not value)}
        parameters["metadata"] = json.dumps(step_dict.get("metadata", {}))
        parameters["generation"] = json.dumps(step_dict.get("generation", {}))
        columns = ", ".join(f'"{key}"' for key in parameters)
        values = ", ".join(f":{key}" for key in parameters)
        updates = ", ".join(f'"{key}" = :{key}' for key in parameters if key != "id")
        await self.execute_sql(f'INSERT INTO steps ({columns}) VALUES ({values}) ON CONFLICT (id) DO UPDATE '
                               f'SET {updates} WHERE steps."threadId" = EXCLUDED."threadId"', parameters)

    async def upsert_feedback(self, feedback) -> str:
        """Feedback on a message of the writer's own threads only (see `owned`): its thread is the
        message's, not what the browser said; an id already used for another message is not changed."""
        feedback.id = feedback.id or str(uuid.uuid4())
        writer = writer_identifier()
        if not await self._may_write_for(feedback.forId, writer):
            raise NotYours("feedback")
        parameters = {"id": feedback.id, "forId": feedback.forId, "value": int(feedback.value),
                      "comment": feedback.comment, "writer": writer}
        await self.execute_sql(
            'INSERT INTO feedbacks ("id", "forId", "threadId", "value", "comment") '
            'SELECT :id, :forId, s."threadId", CAST(:value AS INTEGER), :comment FROM steps s '
            f'JOIN threads t ON t."id" = s."threadId" WHERE s."id" = :forId AND {_OWNED_BY_WRITER} '
            'ON CONFLICT ("id") DO UPDATE SET "value" = EXCLUDED."value", "comment" = EXCLUDED."comment" '
            'WHERE feedbacks."forId" = EXCLUDED."forId"', parameters)
        return feedback.id

    async def delete_feedback(self, feedback_id: str) -> bool:
        """Deletes a feedback only where it is on a message of the writer's own threads."""
        await self.execute_sql(
            'DELETE FROM feedbacks WHERE "id" = :feedback_id AND "forId" IN (SELECT s."id" FROM steps s '
            f'JOIN threads t ON t."id" = s."threadId" WHERE {_OWNED_BY_WRITER})',
            {"feedback_id": feedback_id, "writer": writer_identifier()})
        return True

    async def _may_write_for(self, step_id: str, writer: str | None) -> bool:
        """Whether the message `step_id` is stored in one of `writer`'s threads. A read the database
        cannot answer now says yes: the write waits in the outbox, and its own condition decides."""
        rows = await self.execute_sql('SELECT t."userIdentifier" AS owner FROM steps s JOIN threads t '
                                      'ON t."id" = s."threadId" WHERE s."id" = :id', {"id": step_id})
        if not isinstance(rows, list) or not rows:
            return rows is None  # a read that could not be made: the write's own condition decides
        return all(row.get("owner") == writer for row in rows)

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
            f"INSERT INTO elements ({columns}) VALUES ({placeholders}) ON CONFLICT (id) DO UPDATE SET {updates} "
            'WHERE elements."threadId" = EXCLUDED."threadId"', row)


@dataclass(frozen=True)
class PendingWrite:
    """A history write waiting for its batch: what the outbox would keep, and how to write it."""

    entry: dict
    work: Callable[[AsyncConnection], Awaitable[Any]]
    what: str
    key: str | None = None


class HistoryWrites:
    """Chainlit's history writes, queued and written in order, a batch per transaction (see the module).

    A batch the database cannot take now (unavailable) goes to the outbox whole, in order, as its
    writes would have one by one. A batch it refuses for what a write holds is written again one
    write per transaction (`AppDataLayer.write_now`), so the refused write is set aside and the
    others are kept.
    """

    def __init__(self, layer: AppDataLayer, window_s: float = BATCH_WINDOW_S) -> None:
        self.layer = layer
        self.window_s = window_s
        self._queued: list[PendingWrite] = []
        self._timer: asyncio.TimerHandle | None = None
        self._lock = asyncio.Lock()
        self._tasks: set[asyncio.Task] = set()
        self._numbered = 0  # writes queued so far
        self._through = 0  # of those, the ones whose batch has been handled (written, kept or set aside)
        self._handled = asyncio.Condition()
        self.batches = 0  # written so far (for tests and /lab/state)

    @property
    def waiting(self) -> int:
        return len(self._queued)

    def queue(self, write: PendingWrite) -> None:
        self._queued.append(write)
        self._numbered += 1
        if self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(self.window_s, self._flush_soon)

    def hurry(self) -> None:
        """Write what is queued within `HURRY_S` instead of at the window's end (with what else
        is queued meanwhile: a class's replies that start or end together share a transaction)."""
        loop = asyncio.get_running_loop()
        if self._timer is not None:
            if self._timer.when() <= loop.time() + HURRY_S:
                return
            self._timer.cancel()
        self._timer = loop.call_later(HURRY_S, self._flush_soon)

    async def written(self) -> None:
        """Return once every write queued so far is handled (`hurry`): in the database, or in the
        outbox when the database cannot take it now, or set aside when it refused it."""
        target = self._numbered
        if self._through >= target:
            return
        self.hurry()
        async with self._handled:
            await self._handled.wait_for(lambda: self._through >= target)

    def _flush_soon(self) -> None:
        self._timer = None
        task = asyncio.get_running_loop().create_task(self.flush())
        self._tasks.add(task)  # kept until done: the loop holds only a weak reference to a task
        task.add_done_callback(self._tasks.discard)

    async def flush(self) -> None:
        """Write everything queued so far (a read waits for this first)."""
        async with self._lock:
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None
            batch, self._queued = self._queued, []
            taken = self._numbered
            try:
                if batch:
                    await self._write(batch)
            finally:  # however it went (see `_write`): whoever waits for these goes on
                self._through = taken
                async with self._handled:
                    self._handled.notify_all()

    async def _write(self, batch: list[PendingWrite]) -> None:
        layer = self.layer
        outbox = layer.outbox
        if outbox is not None and outbox.waiting:  # earlier rows wait: these wait behind them, in order
            for write in batch:
                await layer.write_now(write.entry, write.work, write.what, write.key)
            return

        async def work(connection: AsyncConnection) -> None:
            for write in batch:
                await write.work(connection)

        try:
            await write_or_classify(layer.engine, work)
        except Unavailable as unavailable:
            if outbox is None:
                log.warning("chat history: %d writes failed: %s", len(batch), unavailable)
                return
            for write in batch:
                layer._keep(write.entry, str(unavailable), write.key)
        except Refused:
            for write in batch:  # which one was refused: the others are kept
                await layer.write_now(write.entry, write.work, write.what, write.key)
        else:
            self.batches += 1


def _writes() -> HistoryWrites | None:
    """The batches of Chainlit's data layer, if it is this one and writes in batches."""
    from chainlit.data import get_data_layer

    layer = get_data_layer()
    return layer.writes if isinstance(layer, AppDataLayer) else None


async def flush_history() -> None:
    """Write the history still queued (the app is stopping)."""
    if (writes := _writes()) is not None:
        await writes.flush()


def write_history_soon() -> None:
    """A reply's message has just shown: the person's message and the reply's in-flight mark are
    written within `HURRY_S`, not a batch window later, so a replica that dies mid-reply leaves
    both behind (its reply then reads as interrupted, `_mark_interrupted`). Chainlit's write of the
    message is a task it has just created: it queues its write before then."""
    if (writes := _writes()) is not None:
        writes.hurry()


async def history_written() -> None:
    """Return once the history queued so far is handled (`HistoryWrites.written`), Chainlit's writes
    just under way included (tasks it created, `Message.update`'s: they queue theirs first): called
    before a message's task ends, so a reply the person saw end survives the replica dying the
    moment after."""
    await asyncio.sleep(0)
    if (writes := _writes()) is not None:
        await writes.written()


class _DropMessage(logging.Filter):
    def __init__(self, fragment: str) -> None:
        super().__init__()
        self.fragment = fragment

    def filter(self, record: logging.LogRecord) -> bool:
        return self.fragment not in record.getMessage()


class NotYours(PermissionError):
    """A write that names another person's message (its id came from the browser)."""

    SAID = "that message is not in one of your chats"  # how a route tells it apart once Chainlit wrapped it

    def __init__(self, what: str) -> None:
        super().__init__(f"{self.SAID}: the {what} was not saved")


# Who writes through a REST route (`owned_routes`); a socket's writes are its session's person's.
_route_writer: ContextVar[str | None] = ContextVar("serving_lab_route_writer", default=None)
# A row owned by the writer: their thread, or with login off (no writer) a thread with no owner.
_OWNED_BY_WRITER = ('(t."userIdentifier" = CAST(:writer AS TEXT) '
                    'OR (CAST(:writer AS TEXT) IS NULL AND t."userIdentifier" IS NULL))')


def writer_identifier() -> str | None:
    """The person a write is made for: the REST route's login, else the socket session's (None: login off)."""
    return _route_writer.get() or _session_user_identifier()


def owned_routes() -> None:
    """Put Chainlit's feedback routes behind the writer's login: `PUT /feedback` and `DELETE /feedback`
    then write only for messages of the person's own threads (403 otherwise), on every database."""
    from chainlit.auth import get_current_user
    from chainlit.config import config
    from chainlit.server import app, delete_feedback, update_feedback
    from chainlit.types import DeleteFeedbackRequest, UpdateFeedbackRequest
    from fastapi import Depends, HTTPException, Request
    from fastapi.routing import APIRoute

    def as_writer(user) -> object:
        return _route_writer.set(getattr(user, "identifier", None))

    async def put(request: Request, update: UpdateFeedbackRequest, current_user=Depends(get_current_user)):
        token = as_writer(current_user)
        try:
            return await update_feedback(request, update, current_user)
        except HTTPException as error:
            if NotYours.SAID in str(error.detail):  # Chainlit answers every failure as a 500
                raise HTTPException(status_code=403, detail=error.detail) from None
            raise
        finally:
            _route_writer.reset(token)

    async def delete(request: Request, payload: DeleteFeedbackRequest, current_user=Depends(get_current_user)):
        token = as_writer(current_user)
        try:
            return await delete_feedback(request, payload, current_user)
        finally:
            _route_writer.reset(token)

    # This module's annotations are strings (`from __future__ import annotations`): FastAPI reads these.
    put.__annotations__ = {"request": Request, "update": UpdateFeedbackRequest}
    delete.__annotations__ = {"request": Request, "payload": DeleteFeedbackRequest}
    path = f"{config.run.root_path}/feedback"
    routes = app.router.routes
    routes[:] = [route for route in routes if not getattr(route, "serving_lab_owned", False)]
    for endpoint, method in ((put, "PUT"), (delete, "DELETE")):
        route = APIRoute(path, endpoint, methods=[method])
        route.serving_lab_owned = True
        routes.insert(0, route)


def _session_user_identifier() -> str | None:
    """The identifier of the person whose session writes (None with login off, or outside a session)."""
    from chainlit.context import ChainlitContextException, context

    try:
        user = context.session.user
    except ChainlitContextException:
        return None
    identifier = getattr(user, "identifier", None)
    return identifier if isinstance(identifier, str) else None


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
