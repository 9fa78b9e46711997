"""Chainlit's chat history on the app's database.

    @cl.data_layer
    def data_layer():
        return chainlit_data_layer()

Registering it with `@cl.data_layer` matters: without it, Chainlit sees
`DATABASE_URL` and starts its own PostgreSQL-only data layer, which expects a
different schema. The tables come from `Store.migrate()` (or `python -m store init`).

The one module of this package that imports Chainlit.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from chainlit.data.sql_alchemy import SQLAlchemyDataLayer
from chainlit.data.utils import queue_until_user_message
from chainlit.data.storage_clients.base import BaseStorageClient

from store.db import configure_engine
from store.urls import database_url, normalise_url

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

    async def execute_sql(self, query: str, parameters: dict) -> list[dict[str, Any]] | int | None:
        on_sqlite = self.engine.dialect.name == "sqlite"
        parameters = {
            key: json.dumps(value) if isinstance(value, dict) or (on_sqlite and isinstance(value, list)) else value
            for key, value in parameters.items()
        }
        result = await super().execute_sql(query, parameters)
        if on_sqlite and isinstance(result, list):
            return [_decode_sqlite_row(row) for row in result]
        return result

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


class _DropMessage(logging.Filter):
    def __init__(self, fragment: str) -> None:
        super().__init__()
        self.fragment = fragment

    def filter(self, record: logging.LogRecord) -> bool:
        return self.fragment not in record.getMessage()


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
    feedback and custom elements (their props) are stored.
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
    configure_engine(layer.engine)
    return layer
