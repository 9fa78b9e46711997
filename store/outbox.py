"""Rows that could not be written wait here, in order, until the database answers again.

When the database is unavailable (PostgreSQL stopped, hung or unreachable, the
SQLite file gone, locked or not writable: a *transient* fault, store/faults.py),
a write is not lost: it becomes an entry of the outbox, which is kept in memory
and appended to a local file (fsynced, so it survives a crash of the app or the
machine), and a background task writes the entries, oldest first, once the
database answers again. While anything waits, later writes queue behind it, so
the order of the writes (a chat's thread before its steps, a round before its
replies) is kept.

An entry is a list of table statements from `store.db` (the app's own rows:
replies, rounds, votes' rounds), one SQL statement of Chainlit's data layer, or
one change of a chat's thread row (`store.history`), with its parameters. All are JSON.

Bounds, and what happens past them:
- at most `max_rows` entries (`LAB_OUTBOX_MAX_ROWS`, default 10,000) and at most
  `max_bytes` of them (`LAB_OUTBOX_MAX_BYTES`, default 64 MiB, counted as the
  file holds them) wait: a write past either is not kept: `put` raises
  `NotSaved` and the error is logged;
- an entry with a `key` equal to one already waiting is not kept twice (the
  same person's user row, upserted by every request during an outage);
- an entry the database *refuses* (a value it cannot hold, a broken constraint)
  cannot succeed by waiting: it is set aside at once in the dead-letter file
  `<stem>.dead-letter.jsonl` (one line each: when, why, the entry), counted
  (`/lab/state`), logged without its values, and the rest go on. Rows refused when
  first written, with nothing waiting, go to the same file.

Files are named by a hash of the database's URL *without* its password, so a
changed password finds the rows that wait. One process owns one outbox file (an
exclusive lock on `<file>.lock`); a second process of the same app on the same
machine takes the next free file, and a file whose owner died is taken over and
written at the next start.
"""

from __future__ import annotations

import asyncio
import base64
import fcntl
import hashlib
import json
import logging
import os
import time
from collections import deque
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Awaitable, Callable, Iterable

from store.errors import NotSaved
from store.faults import Fault

log = logging.getLogger(__name__)

DEFAULT_MAX_ROWS = 10_000
DEFAULT_MAX_BYTES = 64 * 2**20
MAX_ROWS_VARIABLE = "LAB_OUTBOX_MAX_ROWS"
MAX_BYTES_VARIABLE = "LAB_OUTBOX_MAX_BYTES"
DIRECTORY_VARIABLE = "LAB_OUTBOX_DIR"
DEAD_LETTER_SUFFIX = ".dead-letter.jsonl"
_LEGACY_FAILED_SUFFIX = ".failed.jsonl"  # the dead-letter file's name before it had that name
RETRY_FIRST_S = 0.5
RETRY_MAX_S = 5.0


class Unavailable(Exception):
    """Raised by a writer when the database did not answer: keep the entry and try again later."""


class Refused(Exception):
    """Raised by a writer when the database refused the entry for what it holds: set it aside."""

    def __init__(self, fault: Fault) -> None:
        self.fault = fault
        super().__init__(fault.reason)


# ---------------------------------------------------------------- JSON with datetimes and bytes


def _encode(value: Any) -> Any:
    if isinstance(value, datetime):
        return {"__datetime__": value.isoformat()}
    if isinstance(value, (bytes, bytearray)):
        return {"__bytes__": base64.b64encode(bytes(value)).decode("ascii")}
    if isinstance(value, dict):
        return {key: _encode(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_encode(item) for item in value]
    return value


def _decode(value: Any) -> Any:
    if isinstance(value, dict):
        if set(value) == {"__datetime__"}:
            return datetime.fromisoformat(value["__datetime__"])
        if set(value) == {"__bytes__"}:
            return base64.b64decode(value["__bytes__"])
        return {key: _decode(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_decode(item) for item in value]
    return value


def dumps(entry: dict) -> str:
    return json.dumps(_encode(entry), ensure_ascii=False, separators=(",", ":"))


def loads(line: str) -> dict:
    return _decode(json.loads(line))


# ---------------------------------------------------------------- the outbox


@dataclass(frozen=True)
class OutboxState:
    """What /lab/state shows: how many rows wait (and their bytes), the bounds, why, and how many
    this process set aside in the dead-letter file."""

    waiting: int
    max_rows: int
    waiting_bytes: int
    max_bytes: int
    problem: str | None
    set_aside: int
    dead_letter_file: str | None
    file: str | None


@dataclass
class _Waiting:
    entry: dict
    size: int  # bytes of its line in the file
    key: str | None


Writer = Callable[[dict], Awaitable[None]]


class Outbox:
    """An ordered, bounded, durable queue of writes for one database (see the module docstring)."""

    def __init__(self, directory: Path | None, stem: str, *, max_rows: int = DEFAULT_MAX_ROWS,
                 max_bytes: int = DEFAULT_MAX_BYTES, legacy_stems: Iterable[str] = ()) -> None:
        """`directory`/`stem`: where this database's outbox files live (None: memory only). Files
        left by an earlier run (or by a process of this app that died), also under `legacy_stems`
        (names an older version gave them), are taken over at once."""
        self.directory = directory
        self.stem = stem
        self.legacy_stems = tuple(legacy_stems)
        self.max_rows = max_rows
        self.max_bytes = max_bytes
        self.path: Path | None = None  # this process's file, claimed when first needed
        self._entries: deque[_Waiting] = deque()
        self._bytes = 0
        self._keys: dict[str, int] = {}  # key -> entries waiting with it
        self._done = 0  # entries of the file already written (the file is compacted when all are)
        self._writer: Writer | None = None
        self._owner: object = None
        self._wake = asyncio.Event()
        self._task: asyncio.Task | None = None
        self.problem: str | None = None
        self.unavailable_at: float | None = None  # time.monotonic() of the last transient fault seen
        self.set_aside_count = 0
        if directory is not None:
            self._adopt()

    # ------------------------------------------------------------ state

    @property
    def waiting(self) -> int:
        return len(self._entries)

    @property
    def dead_letter_path(self) -> Path | None:
        return self.directory / f"{self.stem}{DEAD_LETTER_SUFFIX}" if self.directory is not None else None

    def state(self) -> OutboxState:
        dead_letter = self.dead_letter_path
        return OutboxState(self.waiting, self.max_rows, self._bytes, self.max_bytes,
                           self.problem if self._entries else None, self.set_aside_count,
                           str(dead_letter) if dead_letter is not None and dead_letter.exists() else None,
                           str(self.path) if self.path else None)

    def unavailable_within(self, seconds: float) -> bool:
        """Whether rows wait, or the database was found unavailable less than `seconds` ago."""
        return bool(self._entries) or (self.unavailable_at is not None
                                       and time.monotonic() - self.unavailable_at < seconds)

    def note_unavailable(self, problem: str) -> None:
        """A read found the database unavailable: `unavailable_within` says so for a while."""
        self.problem = problem
        self.unavailable_at = time.monotonic()

    # ------------------------------------------------------------ putting and writing

    def put(self, entry: dict, problem: str, *, key: str | None = None) -> int:
        """Keep `entry` to write later (`problem`: why the database did not take it now); return how
        many wait. An entry whose `key` is already waiting is not kept again. Past a bound the entry
        is not kept: raises NotSaved."""
        self.problem = problem
        self.unavailable_at = time.monotonic()
        if key is not None and self._keys.get(key):
            return len(self._entries)
        if key is not None:
            entry = {**entry, "key": key}
        line = (dumps(entry) + "\n").encode("utf-8")
        if len(self._entries) >= self.max_rows or self._bytes + len(line) > self.max_bytes:
            log.error("outbox full (%d rows, %d bytes wait): a write is lost (%s)",
                      len(self._entries), self._bytes, problem)
            raise NotSaved(
                f"the database has been unavailable too long: {len(self._entries)} rows already wait to be "
                f"written, {self._bytes / 2**20:.1f} MiB (the limits are {self.max_rows} rows, "
                f"{MAX_ROWS_VARIABLE}, and {self.max_bytes / 2**20:.0f} MiB, {MAX_BYTES_VARIABLE}), "
                "so this one is not kept"
            )
        self._append(_Waiting(entry, len(line), key))
        if self.path is None and self.directory is not None:
            self.path = _claim(self.directory, self.stem)
        if self.path is not None:
            _append_durably(self.path, line)
        self._wake.set()
        return len(self._entries)

    def set_aside(self, entry: dict, fault: Fault) -> None:
        """Keep `entry`, which the database refused for good, in the dead-letter file with its
        reason; count it and log it (without its values)."""
        self.set_aside_count += 1
        log.error("a write was refused by the database and is set aside (%s): %s", fault.reason,
                  self.dead_letter_path or "no outbox folder: not kept")
        path = self.dead_letter_path
        if path is None:
            return
        record = {"at": datetime.now(timezone.utc).isoformat(), "reason": fault.reason, "detail": fault.detail,
                  "entry": json.loads(dumps(entry))}
        try:
            _append_durably(path, (json.dumps(record, ensure_ascii=False) + "\n").encode("utf-8"))
        except OSError as error:
            log.error("outbox: cannot write the dead-letter file %s (%s); the refused row is lost", path, error)

    def start(self, writer: Writer, owner: object = None) -> None:
        """Write waiting entries with `writer` from now on, in the background (call on the event loop).
        `owner` (e.g. the writer's engine) lets `stop` tell whose flushing to end."""
        self._writer, self._owner = writer, owner
        if self._task is None or self._task.done():
            self._wake = asyncio.Event()  # bound to this loop (a migration may have run on another)
            self._task = asyncio.get_running_loop().create_task(self._flush_forever(), name="outbox-flush")
            self._task.add_done_callback(_report_end)
        if self._entries:
            self._wake.set()

    async def stop(self, owner: object = None) -> None:
        """Stop writing in the background (if `owner` started it); what waits stays for the next start."""
        if owner is not None and owner is not self._owner:
            return
        self._writer = self._owner = None
        await self.aclose()

    async def flush(self) -> int:
        """Write what waits, oldest first, until the queue is empty or the database is unavailable
        again; an entry the database refuses is set aside and the next one written. Returns how many
        were written."""
        written = 0
        while self._entries and self._writer is not None:
            waiting = self._entries[0]
            try:
                await self._writer(waiting.entry)
            except Unavailable as unavailable:
                self.problem = str(unavailable)
                self.unavailable_at = time.monotonic()
                break
            except Refused as refused:  # waiting cannot help: moved aside, logged, the rest go on
                self.set_aside(waiting.entry, refused.fault)
            else:
                written += 1
            self._pop()
            self._mark_done()
        if written:
            log.warning("outbox: %d waiting rows written; %d still wait", written, len(self._entries))
        if not self._entries:
            self.unavailable_at = None
        return written

    async def aclose(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None

    async def _flush_forever(self) -> None:
        delay = RETRY_FIRST_S
        while True:
            if not self._entries:
                self._wake.clear()
                await self._wake.wait()
                delay = RETRY_FIRST_S
            await self.flush()
            if self._entries:  # the database is still unavailable: try again a little later
                await asyncio.sleep(delay)
                delay = min(delay * 2, RETRY_MAX_S)

    def _append(self, waiting: _Waiting) -> None:
        self._entries.append(waiting)
        self._bytes += waiting.size
        if waiting.key is not None:
            self._keys[waiting.key] = self._keys.get(waiting.key, 0) + 1

    def _pop(self) -> None:
        waiting = self._entries.popleft()
        self._bytes -= waiting.size
        if waiting.key is not None:
            self._keys[waiting.key] -= 1
            if not self._keys[waiting.key]:
                del self._keys[waiting.key]

    # ------------------------------------------------------------ the file

    def _done_path(self, path: Path | None = None) -> Path:
        return (path or self.path).with_suffix(".done")

    def _adopt(self) -> None:
        """Take over every outbox file of this database that no live process holds: its entries
        wait here, in the order they were kept; the first such file becomes this process's own."""
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            candidates = [path for stem in (self.stem, *self.legacy_stems)
                          for path in sorted(self.directory.glob(f"{stem}*.jsonl"))]
        except OSError as error:
            log.error("outbox: cannot use %s (%s); rows that wait are kept in memory only", self.directory, error)
            self.directory = None
            return
        for path in candidates:
            if path.name.endswith((DEAD_LETTER_SUFFIX, _LEGACY_FAILED_SUFFIX)) or not _lock(path):
                continue
            entries = self._read(path)
            if self.path is None and path.name.startswith(self.stem):
                self.path = path
                self._done = _read_done(self._done_path(path))
                for waiting in entries:
                    self._append(waiting)
                continue
            if entries:  # another dead process's rows (or an older name's): moved into this file
                if self.path is None:
                    self.path = _claim(self.directory, self.stem)
                for waiting in entries:
                    self._append(waiting)
                if self.path is not None:
                    _append_durably(self.path, b"".join((dumps(w.entry) + "\n").encode("utf-8") for w in entries))
            for leftover in (path, self._done_path(path)):
                leftover.unlink(missing_ok=True)
        if self._entries:
            self.problem = "kept before the app restarted, not yet in the database"
            log.warning("outbox: %d rows kept before a restart wait to be written", len(self._entries))
        elif self.path is not None:
            self._compact()

    def _read(self, path: Path) -> list[_Waiting]:
        """The entries of `path` not yet written (past its .done count)."""
        done = _read_done(self._done_path(path))
        entries = []
        with open(path, encoding="utf-8") as handle:
            for index, line in enumerate(handle):
                if index >= done and line.strip():
                    try:
                        entry = loads(line)
                    except ValueError:
                        log.error("outbox: line %d of %s is not JSON; skipped", index + 1, path)
                        continue
                    entries.append(_Waiting(entry, len(line.encode("utf-8")), entry.get("key")))
        return entries

    def _mark_done(self) -> None:
        if self.path is None:
            return
        if not self._entries:
            self._compact()
            return
        self._done += 1
        _replace_durably(self._done_path(), str(self._done))

    def _compact(self) -> None:
        self._done = 0
        for path in (self.path, self._done_path()):
            try:
                path.unlink()
            except FileNotFoundError:
                pass


def _report_end(task: asyncio.Task) -> None:
    """The flush task only ends when cancelled; anything else is a bug that would stall the queue."""
    if not task.cancelled() and task.exception() is not None:
        log.error("outbox: writing waiting rows stopped on an unexpected error; they wait until the next start",
                  exc_info=task.exception())


def _append_durably(path: Path, data: bytes) -> None:
    """Append `data` in one write (O_APPEND: lines of processes sharing a file never interleave)
    and fsync it: a row the app said it kept survives a crash of the app or the machine."""
    descriptor = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(descriptor, data)
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def _replace_durably(path: Path, text: str) -> None:
    """Replace `path`'s content atomically (a crash leaves the old count or the new, never none)."""
    temporary = path.with_suffix(path.suffix + ".tmp")
    descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.write(descriptor, text.encode("ascii"))
        os.fsync(descriptor)
    finally:
        os.close(descriptor)
    os.replace(temporary, path)


# ---------------------------------------------------------------- one outbox per database per process

_OUTBOXES: dict[str, Outbox] = {}
_LOCKS: dict[Path, object] = {}  # lock files held for the life of the process


def outbox_directory() -> Path:
    from store.urls import REPO

    return Path(os.environ.get(DIRECTORY_VARIABLE) or REPO / ".data" / "outbox")


def _positive(variable: str, default: int) -> int:
    raw = (os.environ.get(variable) or "").strip()
    return int(raw) if raw.isdigit() and int(raw) > 0 else default


def max_rows() -> int:
    return _positive(MAX_ROWS_VARIABLE, DEFAULT_MAX_ROWS)


def max_bytes() -> int:
    return _positive(MAX_BYTES_VARIABLE, DEFAULT_MAX_BYTES)


def outbox_stem(url: str) -> str:
    """The outbox files' name for the database at `url`: a hash of the URL without its password
    (a file name must not depend on a secret, nor change when the password does)."""
    from sqlalchemy.engine import make_url

    identity = make_url(url).render_as_string(hide_password=True)  # the password as ***
    return hashlib.sha1(identity.encode("utf-8")).hexdigest()[:16]


def outbox_for(url: str) -> Outbox:
    """The process's outbox for the database at `url` (made on first use)."""
    stem = outbox_stem(url)
    outbox = _OUTBOXES.get(stem)
    if outbox is None:
        legacy = hashlib.sha1(url.encode("utf-8")).hexdigest()[:16]  # the name before: the whole URL hashed
        outbox = Outbox(outbox_directory(), stem, max_rows=max_rows(), max_bytes=max_bytes(),
                        legacy_stems=() if legacy == stem else (legacy,))
        _OUTBOXES[stem] = outbox
    return outbox


def all_outboxes() -> Iterable[Outbox]:
    return list(_OUTBOXES.values())


def _read_done(path: Path) -> int:
    try:
        return int(path.read_text().strip() or 0)
    except (OSError, ValueError):
        return 0


def _lock(path: Path) -> bool:
    """Hold `path`'s lock file for the life of this process; False when another process holds it."""
    if path in _LOCKS:
        return True
    handle = open(path.with_suffix(".lock"), "w")
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        handle.close()
        return False
    _LOCKS[path] = handle
    return True


def _claim(directory: Path, stem: str) -> Path | None:
    """The first outbox file name for this database that no other live process holds."""
    for number in range(64):
        path = directory / (f"{stem}.jsonl" if number == 0 else f"{stem}-{number}.jsonl")
        if _lock(path):
            return path
    log.error("outbox: 64 processes hold outbox files in %s; rows that wait are kept in memory only", directory)
    return None
