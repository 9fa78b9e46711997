"""Rows that could not be written wait here, in order, until the database answers again.

When the database is unavailable (PostgreSQL stopped or unreachable, the
SQLite file gone, locked or not writable), a write is not lost: it becomes an
entry of the outbox, which is kept in memory and appended to a local file (so
it survives a restart of the app), and a background task writes the entries,
oldest first, once the database answers again. While anything waits, later
writes queue behind it, so the order of the writes (a chat's thread before its
steps, a round before its replies) is kept.

An entry is either a list of table statements from `store.db` (the app's own
rows: replies, rounds, votes' rounds) or one SQL statement of Chainlit's data
layer (the chat history), with its parameters. Both are JSON.

Bounds, and what happens past them:
- at most `max_rows` entries wait (`LAB_OUTBOX_MAX_ROWS`, default 10,000; at
  ~5 KB a reply that is ~50 MB of memory and file); a write past it is not
  kept: `put` raises `NotSaved` and the error is logged;
- an entry the database refuses for a reason other than being unavailable
  (a row that breaks a constraint, say) cannot succeed by waiting: it is moved
  to `<file>.failed.jsonl` with the error, logged, and the rest go on.

One process owns one outbox file (an exclusive lock on `<file>.lock`); a second
process of the same app on the same machine takes the next free file, and a
file whose owner died is taken over and written at the next start.
"""

from __future__ import annotations

import asyncio
import base64
import fcntl
import hashlib
import json
import logging
import os
from collections import deque
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, Awaitable, Callable, Iterable

from store.errors import NotSaved

log = logging.getLogger(__name__)

DEFAULT_MAX_ROWS = 10_000
MAX_ROWS_VARIABLE = "LAB_OUTBOX_MAX_ROWS"
DIRECTORY_VARIABLE = "LAB_OUTBOX_DIR"
RETRY_FIRST_S = 0.5
RETRY_MAX_S = 5.0


class Unavailable(Exception):
    """Raised by a writer when the database did not answer: keep the entry and try again later."""


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
    """What /lab/state shows: how many rows wait, the bound, why, and how many were given up."""

    waiting: int
    max_rows: int
    problem: str | None
    failed: int
    file: str | None


Writer = Callable[[dict], Awaitable[None]]


class Outbox:
    """An ordered, bounded, durable queue of writes for one database (see the module docstring)."""

    def __init__(self, directory: Path | None, stem: str, *, max_rows: int = DEFAULT_MAX_ROWS) -> None:
        """`directory`/`stem`: where this database's outbox files live (None: memory only). Files
        left by an earlier run (or by a process of this app that died) are taken over at once."""
        self.directory = directory
        self.stem = stem
        self.max_rows = max_rows
        self.path: Path | None = None  # this process's file, claimed when first needed
        self._entries: deque[dict] = deque()
        self._done = 0  # entries of the file already written (the file is compacted when all are)
        self._writer: Writer | None = None
        self._owner: object = None
        self._wake = asyncio.Event()
        self._task: asyncio.Task | None = None
        self.problem: str | None = None
        self.failed = 0
        if directory is not None:
            self._adopt()

    # ------------------------------------------------------------ state

    @property
    def waiting(self) -> int:
        return len(self._entries)

    def state(self) -> OutboxState:
        return OutboxState(self.waiting, self.max_rows, self.problem if self._entries else None, self.failed,
                           str(self.path) if self.path else None)

    # ------------------------------------------------------------ putting and writing

    def put(self, entry: dict, problem: str) -> int:
        """Keep `entry` to write later (`problem`: why the database did not take it now); return how
        many wait. Past the bound the entry is not kept: raises NotSaved."""
        if len(self._entries) >= self.max_rows:
            log.error("outbox full (%d rows wait): a write is lost (%s)", len(self._entries), problem)
            raise NotSaved(
                f"the database has been unavailable too long: {len(self._entries)} rows already wait to be "
                f"written (the limit is {self.max_rows}, {MAX_ROWS_VARIABLE}), so this one is not kept"
            )
        self.problem = problem
        self._entries.append(entry)
        if self.path is None and self.directory is not None:
            self.path = _claim(self.directory, self.stem)
        if self.path is not None:
            with open(self.path, "a", encoding="utf-8") as handle:
                handle.write(dumps(entry) + "\n")
        self._wake.set()
        return len(self._entries)

    def start(self, writer: Writer, owner: object = None) -> None:
        """Write waiting entries with `writer` from now on, in the background (call on the event loop).
        `owner` (e.g. the writer's engine) lets `stop` tell whose flushing to end."""
        self._writer, self._owner = writer, owner
        if self._task is None or self._task.done():
            self._wake = asyncio.Event()  # bound to this loop (a migration may have run on another)
            self._task = asyncio.get_running_loop().create_task(self._flush_forever(), name="outbox-flush")
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
        again; return how many were written."""
        written = 0
        while self._entries and self._writer is not None:
            entry = self._entries[0]
            try:
                await self._writer(entry)
            except Unavailable as unavailable:
                self.problem = str(unavailable)
                break
            except Exception as error:  # noqa: BLE001 - refused for good: moved aside, logged, the rest go on
                self._give_up(entry, error)
            else:
                written += 1
            self._entries.popleft()
            self._mark_done()
        if written:
            log.warning("outbox: %d waiting rows written; %d still wait", written, len(self._entries))
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

    def _give_up(self, entry: dict, error: Exception) -> None:
        self.failed += 1
        description = f"{type(error).__name__}: {getattr(error, 'orig', None) or error}"[:500]
        log.error("outbox: a waiting write was refused by the database and is set aside: %s", description)
        if self.path is not None:
            with open(self.path.with_suffix(".failed.jsonl"), "a", encoding="utf-8") as handle:
                handle.write(json.dumps({"error": description, "entry": json.loads(dumps(entry))},
                                        ensure_ascii=False) + "\n")

    # ------------------------------------------------------------ the file

    def _done_path(self, path: Path | None = None) -> Path:
        return (path or self.path).with_suffix(".done")

    def _adopt(self) -> None:
        """Take over every outbox file of this database that no live process holds: its entries
        wait here, in the order they were kept; the first such file becomes this process's own."""
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            candidates = sorted(self.directory.glob(f"{self.stem}*.jsonl"))
        except OSError as error:
            log.error("outbox: cannot use %s (%s); rows that wait are kept in memory only", self.directory, error)
            self.directory = None
            return
        for path in candidates:
            if path.name.endswith(".failed.jsonl") or not _lock(path):
                continue
            entries = self._read(path)
            if self.path is None:
                self.path = path
                self._done = _read_done(self._done_path(path))
                self._entries.extend(entries)
                continue
            self._entries.extend(entries)  # another dead process's rows: moved into this file
            with open(self.path, "a", encoding="utf-8") as handle:
                handle.writelines(dumps(entry) + "\n" for entry in entries)
            for leftover in (path, self._done_path(path)):
                leftover.unlink(missing_ok=True)
        if self._entries:
            self.problem = "kept before the app restarted, not yet in the database"
            log.warning("outbox: %d rows kept before a restart wait to be written", len(self._entries))
        elif self.path is not None:
            self._compact()

    def _read(self, path: Path) -> list[dict]:
        """The entries of `path` not yet written (past its .done count)."""
        done = _read_done(self._done_path(path))
        entries = []
        with open(path, encoding="utf-8") as handle:
            for index, line in enumerate(handle):
                if index >= done and line.strip():
                    try:
                        entries.append(loads(line))
                    except ValueError:
                        log.error("outbox: line %d of %s is not JSON; skipped", index + 1, path)
        return entries

    def _mark_done(self) -> None:
        if self.path is None:
            return
        if not self._entries:
            self._compact()
            return
        self._done += 1
        self._done_path().write_text(str(self._done))

    def _compact(self) -> None:
        self._done = 0
        for path in (self.path, self._done_path()):
            try:
                path.unlink()
            except FileNotFoundError:
                pass


# ---------------------------------------------------------------- one outbox per database per process

_OUTBOXES: dict[str, Outbox] = {}
_LOCKS: dict[Path, object] = {}  # lock files held for the life of the process


def outbox_directory() -> Path:
    from store.urls import REPO

    return Path(os.environ.get(DIRECTORY_VARIABLE) or REPO / ".data" / "outbox")


def max_rows() -> int:
    raw = (os.environ.get(MAX_ROWS_VARIABLE) or "").strip()
    return int(raw) if raw.isdigit() and int(raw) > 0 else DEFAULT_MAX_ROWS


def outbox_for(url: str) -> Outbox:
    """The process's outbox for the database at `url` (made on first use)."""
    outbox = _OUTBOXES.get(url)
    if outbox is None:
        outbox = Outbox(outbox_directory(), hashlib.sha1(url.encode("utf-8")).hexdigest()[:16], max_rows=max_rows())
        _OUTBOXES[url] = outbox
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
