"""What a failed write means, decided once at the store's edge, and values cleaned before they go.

A write that failed is one of two things, and they must never be confused:

- **transient**: the database did not take it *now* (connection refused or lost,
  a timeout, the server shutting down or starting, too many connections, a
  deadlock, a failover's read-only standby, the tables not created yet). Waiting
  helps: the row waits in the outbox, in order, and is written when it answers.
- **refused**: the database will never take *this row* (a value it cannot hold,
  a broken constraint, a value of the wrong type). Waiting cannot help, and a
  row kept in the queue would hold every row behind it: it is set aside at once
  in the dead-letter file with its reason (store/outbox.py) and the rest go on.

The decision is made from what the drivers say, not from SQLAlchemy's wrapper
class (asyncpg's errors all arrive as `DBAPIError`, and a client-side "expected
str, got int" is an `InterfaceError` in asyncpg): PostgreSQL's SQLSTATE, SQLite's
result code, else the exception's type. Everything not known to be transient is
refused, as the issue that introduced this asks: a row set aside is kept whole in
the dead-letter file and can be written again by hand; a row retried forever
stops everything.

`clean` removes what a database refuses for what it is rather than for what it
means: NUL (PostgreSQL text and JSONB cannot hold it), unpaired UTF-16
surrogates (UTF-8 cannot encode them; a JSON string from a browser can carry one)
and, inside JSON documents, NaN and the infinities (JSON has no such numbers;
PostgreSQL's JSONB refuses them). Both become U+FFFD (the replacement character, as
a UTF-8 decoder shows bytes it cannot read) or null, so a model's reply that holds a
NUL is stored, marked where the NUL was, instead of lost.
"""

from __future__ import annotations

import asyncio
import math
import re
from dataclasses import dataclass
from typing import Any

from sqlalchemy.exc import DBAPIError, DisconnectionError
from sqlalchemy.exc import TimeoutError as PoolTimeout

REPLACEMENT_CHARACTER = "\ufffd"
_REFUSED_BY_DATABASES = re.compile("[\x00\ud800-\udfff]")
_REASON_CHARS = 160

# PostgreSQL SQLSTATEs (Appendix A of its manual) that say the database is unavailable now,
# never that the row is wrong: whole classes by their first two characters, single codes whole.
_TRANSIENT_CLASSES = {
    "08": "connection exception",
    "40": "transaction rolled back (serialization failure or deadlock)",
    "53": "insufficient resources (disk, memory, connections)",
    "57": "operator intervention (statement timeout, server shutting down or starting)",
    "58": "system error (input/output)",
    "28": "login refused (the password or DATABASE_URL may have changed)",
}
_TRANSIENT_CODES = {
    "25006": "read-only transaction (a standby after a failover)",
    "3D000": "the database does not exist (yet)",
    "42P01": "a table does not exist (the database is not migrated yet)",
    "55P03": "a lock is not available",
    "55006": "an object is in use",
}
# SQLite result codes (their names as Python's sqlite3 gives them, extended codes included by prefix).
_TRANSIENT_SQLITE = ("SQLITE_BUSY", "SQLITE_LOCKED", "SQLITE_READONLY", "SQLITE_CANTOPEN", "SQLITE_IOERR",
                     "SQLITE_FULL", "SQLITE_PROTOCOL", "SQLITE_NOTADB", "SQLITE_CORRUPT", "SQLITE_NOLFS",
                     "SQLITE_AUTH", "SQLITE_PERM")


@dataclass(frozen=True)
class Fault:
    """What a failed write means: `transient` or not (refused), `reason` in words safe to show
    anyone (no SQL, no values), and `detail`, the driver's own first line, which can quote a
    value: only for the dead-letter file, next to the row it is about."""

    transient: bool
    reason: str
    detail: str


def classify(error: BaseException) -> Fault:
    """Transient or refused (see the module docstring), for any exception a write can raise."""
    sqlstate = _sqlstate(error)
    sqlite_code = _sqlite_code(error)
    detail = first_line(error)
    if sqlstate is not None:
        why = _TRANSIENT_CODES.get(sqlstate) or _TRANSIENT_CLASSES.get(sqlstate[:2])
        if why is not None:
            return Fault(True, f"{why}: {detail}" if _safe_to_show(sqlstate) else why, detail)
        return Fault(False, f"refused by the database ({_driver_name(error)}, SQLSTATE {sqlstate})", detail)
    if sqlite_code is not None:
        if sqlite_code.startswith(_TRANSIENT_SQLITE) or (sqlite_code == "SQLITE_ERROR"
                                                         and detail.startswith("no such table")):
            return Fault(True, detail, detail)
        return Fault(False, f"refused by the database ({_driver_name(error)}, {sqlite_code})", detail)
    if _connection_gone(error):
        return Fault(True, detail, detail)
    return Fault(False, f"refused ({_driver_name(error)})", detail)


def transient_reason(error: BaseException) -> str | None:
    """Why the database did not answer (safe to show), or None when `error` is not transient."""
    fault = classify(error)
    return fault.reason if fault.transient else None


def first_line(error: BaseException) -> str:
    """The driver's own message, first line, bounded: SQLAlchemy's text would add the statement
    (and, without hide_parameters, the values)."""
    original = getattr(error, "orig", None) or error
    if isinstance(original, (asyncio.TimeoutError, TimeoutError)) and not str(original):
        return "timed out"
    if isinstance(original, OSError) and original.strerror:
        return f"{type(original).__name__}: {original.strerror}"[:_REASON_CHARS]
    first = (str(original).strip().splitlines() or [type(original).__name__])[0]
    return first[:_REASON_CHARS]


def _chain(error: BaseException):
    """`error`, the driver's error it wraps (`orig`) and their causes, each once."""
    seen: set[int] = set()
    pending = [error]
    while pending:
        current = pending.pop(0)
        if current is None or id(current) in seen:
            continue
        seen.add(id(current))
        yield current
        pending += [getattr(current, "orig", None), current.__cause__, current.__context__]


def _sqlstate(error: BaseException) -> str | None:
    for link in _chain(error):
        code = getattr(link, "sqlstate", None) or getattr(link, "pgcode", None)
        if isinstance(code, str) and len(code) == 5:
            return code
    for link in _chain(error):  # asyncpg's client-side checks (a value of the wrong type) carry none
        if _is_asyncpg(link, "DataError"):
            return "22000"
    return None


def _sqlite_code(error: BaseException) -> str | None:
    for link in _chain(error):
        name = getattr(link, "sqlite_errorname", None)
        if isinstance(name, str):
            return name
    return None


def _connection_gone(error: BaseException) -> bool:
    """A fault of the connection itself, whatever the driver: refused, reset, timed out, invalidated."""
    for link in _chain(error):
        if isinstance(link, DBAPIError) and link.connection_invalidated:
            return True
        if isinstance(link, (DisconnectionError, PoolTimeout, OSError, asyncio.TimeoutError, TimeoutError)):
            return True
        if _is_asyncpg(link, "ConnectionDoesNotExistError", "InternalClientError", "ProtocolError"):
            return True
        message = str(link).lower()
        if _is_asyncpg(link, "InterfaceError") and ("connection" in message and "closed" in message):
            return True
    return False


def _is_asyncpg(error: BaseException, *names: str) -> bool:
    return any(cls.__module__.startswith("asyncpg") and cls.__name__ in names for cls in type(error).__mro__)


def _driver_name(error: BaseException) -> str:
    """The most specific driver exception's class name (CharacterNotInRepertoireError, IntegrityError)."""
    drivers = [link for link in _chain(error) if type(link).__module__.split(".")[0] in ("asyncpg", "sqlite3")]
    return type(drivers[-1] if drivers else error).__name__


def _safe_to_show(sqlstate: str) -> bool:
    """Messages of connection-level errors name no row value; those of others may."""
    return sqlstate[:2] in ("08", "53", "57", "58") or sqlstate in ("3D000", "25006")


# ---------------------------------------------------------------- values a database refuses


def clean_text(text: str) -> str:
    """`text` with NUL and unpaired surrogates replaced by U+FFFD (unchanged when it holds neither)."""
    return _REFUSED_BY_DATABASES.sub(REPLACEMENT_CHARACTER, text)


def clean(value: Any, *, in_json: bool = False) -> Any:
    """`value` with every string cleaned (`clean_text`), dictionary keys included, recursively;
    inside JSON documents (dicts and lists) non-finite floats become None."""
    if isinstance(value, str):
        return clean_text(value) if _REFUSED_BY_DATABASES.search(value) else value
    if isinstance(value, dict):
        return {clean(key): clean(item, in_json=True) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [clean(item, in_json=True) for item in value]
    if in_json and isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def clean_json_text(document: str) -> str:
    """A JSON document given as text (Chainlit dumps some itself), cleaned like `clean`; text
    that is not JSON is cleaned as text."""
    import json

    if "\\u0000" not in document and "\\ud" not in document.lower() and "NaN" not in document \
            and "Infinity" not in document and not _REFUSED_BY_DATABASES.search(document):
        return document
    try:
        parsed = json.loads(document)
    except ValueError:
        return clean_text(document)
    return json.dumps(clean(parsed, in_json=True), ensure_ascii=False)
