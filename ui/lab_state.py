"""What the running app holds, for operators and the classroom load test: GET /lab/state.

Counts only, nothing about anyone's chats: rows waiting for an unavailable
database (the outbox), sessions Chainlit keeps (connected,
and disconnected ones it keeps for `session_timeout` so a tab can reconnect),
threads, asyncio tasks, TCP connections (from clients, and to backends), open
files, memory, and each in-process engine's own counts (generating, waiting,
tokens generated so far), as its kind reports them (`Kind.process_state`).

Threads and tasks are counted by kind, because some grow on purpose and stay
bounded: the database pool's connection threads (aiosqlite runs one thread per
connection), asyncio's default executor, an in-process engine's thread per model,
the task that frees a disconnected session after `session_timeout`, and
engine.io's ping task, which ends within one ping interval after its socket
closed. What is left, "other", has no such bound: the load test reads the state
before and after a run, and "other" that grew and did not come back is a leak.

Who may read it: a teacher's login (with login on), from anywhere; or a request
made on the app's own machine, which is a loopback client with no forwarding
header at all (`from_this_machine`). The counts name no one, but they are live
per-engine load, and the operator's, not the class's.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import Counter
from typing import Mapping

import jwt
import psutil
from chainlit.auth import decode_jwt
from chainlit.auth import reuseable_oauth as _chainlit_token
from starlette.requests import Request
from starlette.responses import JSONResponse

from backends.registry import KINDS
from core.auth import AuthConfig, current_config
from core.replica import REPLICA_HEADER, replica_id
from store.outbox import all_outboxes
from vocabulary import LOOPBACK_HOSTS

STARTED_AT = time.monotonic()

# Thread names -> kind. The names are the libraries' own (threading.Thread targets and prefixes).
THREAD_KINDS = (
    ("_connection_worker_thread", "database"),  # aiosqlite: one per pooled connection
    ("asyncio_", "executor"),  # asyncio's default ThreadPoolExecutor (bounded by max_workers)
    # An in-process engine's threads, as its kind names them (the embedded llama.cpp: one per model).
    *((kind.worker_threads, "model") for kind in KINDS if kind.worker_threads),
)
# Task coroutine names -> kind.
TASK_KINDS = (
    ("clear_on_timeout", "kept_sessions"),  # chainlit.socket: frees a session after session_timeout
    ("_send_ping", "socket_pings"),  # engine.io: one per socket, ends after the socket closed
    # A reply being generated (Chainlit's message handler) and its parts (ui/live.py, core/rounds.py):
    # they end when the reply does, also for a student who has left (the queue still serves them).
    ("process_message", "replies"),
    ("LiveReply.", "reply_parts"),
    ("RoundRun.", "reply_parts"),
)


def _kind(name: str, kinds: tuple[tuple[str, str], ...]) -> str:
    return next((kind for marker, kind in kinds if marker in name), "other")


def _count(names: list[str], kinds: tuple[tuple[str, str], ...]) -> dict[str, int]:
    counts = {kind: 0 for _, kind in kinds} | {"other": 0}
    for name in names:
        counts[_kind(name, kinds)] += 1
    return counts


def _task_name(task: asyncio.Task) -> str:
    coro = task.get_coro()
    return getattr(coro, "__qualname__", None) or repr(coro)


def _connected_sessions(session_ids) -> int:
    from chainlit.server import sio

    return sum(1 for sid in session_ids if sio.manager.is_connected(sid, "/"))


def embedded_models_state() -> dict[str, dict[str, object]]:
    """Every in-process engine's own counts, by model, from each kind that runs in this process.
    Read by tests to see that Stop really ends the embedded generation."""
    state: dict[str, dict[str, object]] = {}
    for kind in KINDS:
        if kind.process_state is not None:
            state.update({name: dict(counts) for name, counts in kind.process_state().items()})
    return state


DATABASE_FILE_ENDINGS = (".db", ".db-wal", ".db-shm", ".db-journal", ".sqlite", ".sqlite3")


def process_state() -> dict:
    """The app process's resources now."""
    from chainlit.chat_context import chat_contexts
    from chainlit.config import config
    from chainlit.session import ws_sessions_id, ws_sessions_sid

    process = psutil.Process()
    connections = process.net_connections(kind="tcp")
    listening = {c.laddr.port for c in connections if c.status == psutil.CONN_LISTEN}
    established = [c for c in connections if c.status == psutil.CONN_ESTABLISHED]
    from_clients = sum(1 for c in established if c.laddr.port in listening)
    threads = [t.name for t in threading.enumerate()]
    tasks = [_task_name(t) for t in asyncio.all_tasks()]
    files = [f.path for f in process.open_files()]
    database_files = sum(1 for path in files if path.endswith(DATABASE_FILE_ENDINGS))
    return {
        # Which replica answered (LAB_REPLICA_ID, else a random name per process), when several serve one class.
        "replica": replica_id(),
        "pid": process.pid,
        "uptime_s": round(time.monotonic() - STARTED_AT, 1),
        "sessions": len(ws_sessions_id),
        "connected_sessions": _connected_sessions(list(ws_sessions_sid)),
        # Chainlit's per-session message lists (bounded per session by ui/session_memory.py).
        "chat_contexts": len(chat_contexts),
        "chat_context_messages": sum(len(messages) for messages in list(chat_contexts.values())),
        "threads": len(threads),
        "threads_by_kind": _count(threads, THREAD_KINDS),
        "tasks": len(tasks),
        "tasks_by_kind": _count(tasks, TASK_KINDS),
        # What the unbounded tasks are, by coroutine (names only), to see a leak's source at once.
        "other_tasks": dict(Counter(n for n in tasks if _kind(n, TASK_KINDS) == "other").most_common(10)),
        "client_connections": from_clients,
        "backend_connections": len(established) - from_clients,
        "open_files": len(files),
        "open_files_by_kind": {"database": database_files, "other": len(files) - database_files},
        "rss_mb": round(process.memory_info().rss / 2**20, 1),
        "session_timeout_s": config.project.session_timeout,
        "embedded_models": embedded_models_state(),
        # Rows waiting for an unavailable database (store/outbox.py): how many, the bounds, why; and
        # rows the database refused, set aside in its dead-letter file.
        "outbox": outbox_state(),
    }


def outbox_state() -> dict:
    """The database outbox of this process: rows waiting to be written (0 while the database answers),
    their bytes, the bounds, why they wait, and the rows the database refused that this process set
    aside in the dead-letter file (store/outbox.py) since it started."""
    states = [outbox.state() for outbox in all_outboxes()]
    return {
        "waiting": sum(state.waiting for state in states),
        "waiting_bytes": sum(state.waiting_bytes for state in states),
        "max_rows": max((state.max_rows for state in states), default=None),
        "max_bytes": max((state.max_bytes for state in states), default=None),
        "set_aside": sum(state.set_aside for state in states),
        "dead_letter_files": [state.dead_letter_file for state in states if state.dead_letter_file],
        "problem": next((state.problem for state in states if state.problem), None),
    }


# Headers a proxy or tunnel adds to say for whom it forwards. Any of them means the request did
# not start on this machine, whatever address it comes from (a proxy on the same machine connects
# from loopback); a header a client sent itself is refused just the same.
FORWARDING_HEADERS = frozenset({
    "forwarded", "x-forwarded-for", "x-forwarded-host", "x-forwarded-proto", "x-forwarded-port",
    "x-forwarded-server", "x-real-ip", "x-client-ip", "x-cluster-client-ip", "x-original-forwarded-for",
    "true-client-ip", "cf-connecting-ip", "fastly-client-ip", "via",
})
REFUSED = ("GET /lab/state answers a teacher's login, or a request made on the app's own machine "
           "(loopback, not through a proxy or tunnel that forwards it).")


def forwarded(headers: Mapping[str, str]) -> bool:
    """Whether a proxy (or a client posing as one) says the request came from elsewhere."""
    return any(name.lower() in FORWARDING_HEADERS or name.lower().startswith("x-forwarded-") for name in headers)


def from_this_machine(request: Request) -> bool:
    """A loopback client with no forwarding header at all. A tunnel that forwards without adding
    one looks exactly like this: only a teacher's login tells such a request apart (docs/deploying/classroom.md)."""
    client = request.client.host if request.client else ""
    return client in LOOPBACK_HOSTS and not forwarded(request.headers)


async def teacher_login(request: Request, auth: AuthConfig) -> bool:
    """Whether the request carries a valid login (Chainlit's cookie or bearer token) of a teacher
    (TEACHERS, as the app reads it now). With login off there is no login to carry: False."""
    if not auth.enabled:
        return False
    token = await _chainlit_token(request)
    if not token:
        return False
    try:
        user = decode_jwt(token)
    except jwt.PyJWTError:  # forged, expired, or signed with another secret
        return False
    return auth.is_teacher(user.identifier)


async def state_endpoint(request: Request) -> JSONResponse:
    """For a teacher's login (with login on) from anywhere, or for the app's own machine (loopback
    with no forwarding header: the operator's scripts, the load test). Everyone else gets 403."""
    if not (from_this_machine(request) or await teacher_login(request, current_config())):
        return JSONResponse({"error": REFUSED}, status_code=403)
    return JSONResponse(process_state())


class ReplicaHeader:
    """ASGI middleware: every HTTP answer says which replica gave it (`X-Lab-Replica`), so an operator
    (or a test) behind the proxy sees where a person landed. Websocket traffic passes untouched."""

    def __init__(self, app) -> None:
        self.app = app
        self.header = (REPLICA_HEADER.lower().encode(), replica_id().encode())

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_with_header(message) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", []), self.header]}
            await send(message)

        await self.app(scope, receive, send_with_header)
