"""A change of one chat's thread row, written so that a change kept for later never does harm.

Chainlit's data layer writes a thread by reading it first (does it exist? what metadata has
it?) and then upserting every column. During an outage the read fails and reads as "no such
thread", so the upsert kept for later carried `createdAt` = now and `metadata` = {} and, once
written, overwrote an existing thread's; and a chat first created during the outage was kept
without its owner (the login could not be read either), so it never showed in its owner's
sidebar. Here the change is data (`thread_change`), and `apply_thread_change` decides in the
transaction that writes it, against the row as it is then:

- a thread that does not exist is created with the change's creation time;
- an existing thread keeps its `createdAt`; only the fields the change names are written, and its
  metadata is merged key by key (Chainlit's rule: a key set to None is removed);
- the owner is taken from the change's user id, or, when only the person's identifier was known
  (a login during an outage), looked up by identifier when the change is written, and only set
  where the thread has none;
- a thread another person owns than the one whose session writes the change is left as it is.

Nothing here imports Chainlit (ui/chat_history.py makes the changes).
"""

from __future__ import annotations

import logging
from typing import Any

from sqlalchemy import select, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.ext.asyncio import AsyncConnection

from store import schema
from store.faults import clean

log = logging.getLogger(__name__)


def thread_change(thread_id: str, *, created_at: str, name: str | None = None, user_id: str | None = None,
                  user_identifier: str | None = None, metadata: dict[str, Any] | None = None,
                  tags: list[str] | None = None, writer: str | None = None) -> dict[str, Any]:
    """One change of a thread, as JSON data (what the outbox keeps). `metadata` follows Chainlit:
    keys with None are removed, the others set; `user_identifier` is used only without `user_id`.
    `writer`, the person whose session makes the change: a thread another person owns is left as it is."""
    metadata = metadata or {}
    return clean({
        "id": thread_id, "created_at": created_at, "name": name, "user_id": user_id, "writer": writer,
        "user_identifier": None if user_id else user_identifier,
        "metadata_set": {key: value for key, value in metadata.items() if value is not None},
        "metadata_delete": sorted(key for key, value in metadata.items() if value is None),
        "tags": list(tags) if tags is not None else None,
    })


def names_a_change(change: dict[str, Any]) -> bool:
    """Whether the change sets anything beyond making sure the thread exists."""
    return any(change.get(field) is not None for field in ("name", "user_id", "user_identifier", "tags")) or bool(
        change.get("metadata_set") or change.get("metadata_delete"))


async def apply_thread_change(connection: AsyncConnection, change: dict[str, Any]) -> None:
    """Write `change` (see `thread_change`) against the thread row as it is now (module docstring)."""
    for _ in range(2):  # a second time only if another writer created the thread in between
        if await _apply_once(connection, change):
            return
    raise RuntimeError(f"thread {change['id']} was neither found nor created")  # cannot happen: ON CONFLICT


async def _apply_once(connection: AsyncConnection, change: dict[str, Any]) -> bool:
    threads = schema.threads
    query = select(threads.c.userId, threads.c.userIdentifier, threads.c.metadata).where(threads.c.id == change["id"])
    if connection.dialect.name == "postgresql":
        query = query.with_for_update()
    row = (await connection.execute(query)).first()
    writer = change.get("writer")
    if row is not None and writer and row.userIdentifier not in (None, writer):
        log.warning("chat history: a change of thread %s by another person than its owner was not written",
                    change["id"])
        return True
    owner = await _owner(connection, change, has_owner=row is not None and row.userId is not None)
    base = dict(row.metadata or {}) if row is not None and isinstance(row.metadata, dict) else {}
    metadata_changed = bool(change.get("metadata_set") or change.get("metadata_delete"))
    metadata = {key: value for key, value in base.items() if key not in set(change.get("metadata_delete") or ())}
    metadata.update(change.get("metadata_set") or {})
    name = change.get("name")
    if name is None and metadata:
        name = metadata.get("name")  # Chainlit's rule
    values: dict[str, Any] = {}
    if name is not None:
        values["name"] = name
    if owner is not None:
        values["userId"], values["userIdentifier"] = owner
    if change.get("tags") is not None:
        values["tags"] = change["tags"]
    if row is None:
        insert = (postgresql.insert if connection.dialect.name == "postgresql" else sqlite.insert)(threads)
        statement = insert.values(id=change["id"], createdAt=change["created_at"], metadata=metadata,
                                  **values).on_conflict_do_nothing(index_elements=["id"])
        return (await connection.execute(statement)).rowcount == 1
    if metadata_changed:
        values["metadata"] = metadata
    if values:
        await connection.execute(update(threads).where(threads.c.id == change["id"]).values(**values))
    return True


async def _owner(connection: AsyncConnection, change: dict[str, Any], *, has_owner: bool) -> tuple[str, str] | None:
    """(userId, userIdentifier) to write, or None to leave the owner as it is. A user row that is
    not there (it was refused, say) leaves the thread without an owner rather than refusing the
    thread, and with it every step of the chat."""
    users = schema.users
    if change.get("user_id"):
        identifier = await connection.scalar(select(users.c.identifier).where(users.c.id == change["user_id"]))
        if identifier is None:
            log.warning("chat history: thread %s names a user that is not stored; kept without an owner",
                        change["id"])
            return None
        return change["user_id"], identifier
    if change.get("user_identifier") and not has_owner:
        user_id = await connection.scalar(select(users.c.id).where(users.c.identifier == change["user_identifier"]))
        if user_id is not None:
            return user_id, change["user_identifier"]
    return None
