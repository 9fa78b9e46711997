"""A class burst, side by side with its floor: what the app costs when every student sends at once.

The situation the app exists for: a teacher says "now" and a class sends one message at the same
moment. In one run, against one paced OpenAI-protocol server whose truth is known (its first token
`--first-token-ms` after a request arrives, then `--tokens` tokens at `--rate` tokens/s, each send
time logged), this starts two Chainlit apps and bursts each with the same students:

- **floor**: `experiments/floor/app.py`, bare Chainlit in 30 lines (one pooled `AsyncOpenAI` client,
  `stream_token` per chunk, no figures, no storage, an empty chat start): the least Chainlit itself
  costs per reply. With `FLOOR_COLUMNS=3` it streams three replies at once into three messages, the
  floor of a three-column compare round.
- **app**: this app (`chainlit run app.py`) with the paced server as its backend (`--kind`, vllm by
  default: continuous usage, /metrics), its own SQLite database, its defaults otherwise (the
  system prompt preset included), in chat mode; and in compare mode with `--columns` backends that
  all point at the paced server.

Each phase: N simulated browser tabs (Chainlit's socket.io protocol, as `load.chainlit_client`
speaks it, timed with `time.time()` like the server's log) open their chats first; then all of
them send at once. Per reply (matched to the server's log by the unique marker word that ends it):

- first text: when the tab received the reply's first text, minus when the server sent its first
  token;
- reply end: when the tab received the marker (the last token), minus when the server sent it;
- TTFT shown: the app's own final figure for the reply, against the server's truth for that
  request (its first send minus its arrival);
- CPU per reply: user + system CPU seconds of the app's process tree from the burst to its last
  reply (+0.5 s), over the replies.

Phases alternate floor and app (floor, app at each size; `--rounds 2` adds app, floor), so drift on
a noisy machine falls on both. Goals, each with a verdict (exit 1 naming every miss), per size and
for the compare round: CPU per reply at most 1.5x the floor's; first text p99 at most the floor's
+50 ms; reply end p99 at most the floor's +100 ms; and the TTFT shown within +15 ms of the truth at
p99 (30 students; +25 ms at 60 and above). `--profile DIR` also records the app under each of its
bursts with py-spy (where installed), a flame graph per phase.

The ceiling (`--ceiling`): how many students at once a deployment holds within the objective the
classroom summary uses (CAPACITY_SLO / CAPACITY_PERCENTILE, else TTFT under 500 ms and 20 tokens/s
each for 90% of messages), as the students saw it (first text after sending, ms per token after it).
The capacity rule is the sweeps' (core/load/sweep.py): the largest level whose share meets the
percentile, bursting at each of `--levels` in turn until one misses; for the floor and the app, one
replica and, with `--replicas 1,2`, two behind nginx (deploy/nginx/serving-lab.conf; the app's on
one PostgreSQL), with a verdict that two hold about twice (at least 1.5x) what one holds.

Run: `.venv/bin/python -m experiments.class_burst [--students 30,60] [--compare-students 10]
      [--columns 3] [--first-token-ms 300] [--tokens 100] [--rate 50] [--rounds 1] [--out DIR]
      [--profile DIR] [--only app|floor]`
     `.venv/bin/python -m experiments.class_burst --ceiling [--levels 10,20,40,...] [--replicas 1,2]`
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import psutil
import socketio

from bench.verdict import Goal, at_least, at_most, exit_status
from config import REPO
from core.load.slo import DEFAULT_PERCENTILE, DEFAULT_SLO, Slo, parse_slo, within
from core.timing import percentile
from load.chainlit_client import (LIVE_EVENT, LIVE_TAP_OFFER, LIVE_TEXT, SOCKET_PATH, browser_auth,
                                  browser_headers, page_load_requests, user_message)
from servers.app import backend_env, chainlit_command, start_app
from servers.paced_openai import PacedServer, start_paced_server
from servers.postgres import PostgresCluster
from servers.process import ServerProcess, free_port
from servers.proxy import Proxy

FLOOR_APP = REPO / "experiments" / "floor" / "app.py"
MARKER = re.compile(r"pacedend\d+x[0-9a-f]{8}")
FINAL_STATES = ("completed", "stopped", "error")
OPEN_TIMEOUT_S = 120.0
REPLY_TIMEOUT_S = 300.0
SETTLE_S = 0.5
CPU_RATIO_GOAL = 1.5
JOIN_CPU_RATIO_GOAL = 1.3  # joining and sending: every chat start's work counts on both sides
JOIN_TTFT_GOAL_MS = 15.0  # joining and sending: the TTFT shown within +15 ms of the truth at 30 and 60
FIRST_TEXT_GOAL_MS = 50.0
REPLY_END_GOAL_MS = 100.0
MAX_STUDENTS = 250  # students at once, the bound of any load this script sends (loopback only)


def ttft_goal_ms(students: int) -> float:
    """The issue's bound on the TTFT shown, over the truth at p99: +15 ms at 30 students, +25 ms at 60."""
    return 15.0 if students <= 30 else 25.0


# ---------------------------------------------------------------- one browser tab


@dataclass
class Reply:
    """One reply as the tab saw it (times: `time.time()`), keyed by its marker once it came."""

    key: str  # the message id (floor, chat) or "<element id>:<column>" (compare)
    text: str = ""
    first_text_at_s: float | None = None
    marker: str | None = None
    marker_at_s: float | None = None
    ttft_shown_ms: float | None = None
    state: str | None = None


@dataclass
class Tab:
    """A simulated browser tab: Chainlit's page load, socket.io, one chat, one message."""

    base_url: str
    session_id: str = field(default_factory=lambda: str(uuid.uuid4()))
    replies: dict[str, Reply] = field(default_factory=dict)
    sent_at_s: float | None = None
    done_at_s: float | None = None
    ready: asyncio.Event = field(default_factory=asyncio.Event)
    done: asyncio.Event = field(default_factory=asyncio.Event)
    errors: list[str] = field(default_factory=list)
    _tasks: int = 0
    _sio: Any = None
    _http: Any = None
    _message_id: str | None = None
    _message_of: dict[str, str] = field(default_factory=dict)  # element id -> its message's id

    async def open(self) -> None:
        import aiohttp

        # A browser's cookie jar: behind nginx the lab_route cookie keeps the tab on its replica
        # (aiohttp refuses cookies of IP addresses unless told).
        self._http = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=OPEN_TIMEOUT_S),
                                           cookie_jar=aiohttp.CookieJar(unsafe=True))
        for method, path, body in page_load_requests("en-US", self.session_id):
            async with self._http.request(method, self.base_url + path, json=body) as response:
                response.raise_for_status()
        sio = socketio.AsyncClient(http_session=self._http, reconnection=False, handle_sigint=False)

        async def on_connect() -> None:
            await sio.emit("connection_successful")

        sio.on("connect", on_connect)
        sio.on("*", self._event)
        self._sio = sio
        await sio.connect(self.base_url, socketio_path=SOCKET_PATH, transports=["websocket"],
                          headers=browser_headers(self.base_url, "en-US"), auth=browser_auth(self.session_id),
                          wait_timeout=OPEN_TIMEOUT_S)
        await asyncio.wait_for(self.ready.wait(), OPEN_TIMEOUT_S)
        # As the app's page does: take a reply's text and figures past Chainlit's messages and
        # elements (ui/live_tap.py; the floor has no such handler and ignores it). The burst
        # starts once every tab is open.
        await sio.emit("window_message", LIVE_TAP_OFFER)

    async def send(self, text: str) -> None:
        payload = user_message(text, self.base_url + "/")
        self._message_id = payload["message"]["id"]
        self.sent_at_s = time.time()
        await self._sio.emit("client_message", payload)

    async def close(self) -> None:
        if self._sio is not None:
            await self._sio.disconnect()
        if self._http is not None:
            await self._http.close()

    def _reply(self, key: str) -> Reply:
        return self.replies.setdefault(key, Reply(key))

    def _text(self, reply: Reply, text: str, at_s: float) -> None:
        if text and reply.first_text_at_s is None:
            reply.first_text_at_s = at_s
        if reply.marker is None:
            found = MARKER.search(text)
            if found:
                reply.marker, reply.marker_at_s = found.group(0), at_s

    async def _event(self, event: str, data: Any = None, *_: Any) -> None:
        at_s = time.time()
        if event == "element" and isinstance(data, dict) and data.get("forId"):
            # A tapped tab gets each reply's figures element ahead of the reply (before its first
            # message, then after each reply): which message it is for is known from then on.
            self._message_of[str(data.get("id"))] = str(data["forId"])
        if event == "task_start":
            self._tasks += 1
        elif event == "task_end":
            if not self.ready.is_set() and self._tasks:
                self.ready.set()
            elif self.sent_at_s is not None and not self.done.is_set():
                self.done_at_s = at_s
                self.done.set()
        elif self.sent_at_s is None:
            return
        elif event in ("stream_start", "new_message", "update_message") and isinstance(data, dict):
            if data.get("type") == "assistant_message":
                reply = self._reply(str(data.get("id")))
                reply.text = str(data.get("output") or "")
                self._text(reply, reply.text, at_s)
        elif event == "stream_token" and isinstance(data, dict):
            reply = self.replies.get(str(data.get("id")))
            if reply is not None and not data.get("isInput"):
                token = str(data.get("token") or "")
                reply.text = token if data.get("isSequence") else reply.text + token
                self._text(reply, reply.text, at_s)
        elif event == LIVE_TEXT and isinstance(data, dict):  # the reply's text past Chainlit's stream
            reply = self.replies.get(str(data.get("for")))
            if reply is not None:
                reply.text += str(data.get("text") or "")
                self._text(reply, reply.text, at_s)
            if isinstance(data.get("props"), dict):  # a refresh of the figures that rode with the text
                self._element({"id": data.get("id"), "props": data["props"]}, at_s)
        elif event in ("element", LIVE_EVENT) and isinstance(data, dict):
            self._element(data, at_s)  # a live refresh carries the element's id and props too

    def _element(self, element: dict, at_s: float) -> None:
        props = element.get("props")
        if not isinstance(props, dict):
            return
        if element.get("forId"):  # Chainlit's element event names its message; a live refresh does not
            self._message_of[str(element.get("id"))] = str(element["forId"])
        element = {**element, "forId": self._message_of.get(str(element.get("id")))}
        if props.get("kind") == "compare":
            for index, column in enumerate(props.get("columns") or []):
                reply = self._reply(f"{element.get('id')}:{index}")
                self._text(reply, str(column.get("text") or ""), at_s)
                figures = column.get("figures") or {}
                if figures.get("state") in FINAL_STATES:
                    reply.ttft_shown_ms, reply.state = figures.get("ttftMs"), figures.get("state")
        elif props.get("kind") is None and props.get("state") in FINAL_STATES:
            reply = self._reply(str(element.get("forId")))
            reply.ttft_shown_ms, reply.state = props.get("ttftMs"), props.get("state")


# ---------------------------------------------------------------- the apps


@dataclass
class App:
    """A running Chainlit app of one flavour ("floor" or "app") and its process."""

    flavour: str
    url: str
    process: ServerProcess
    workdir: Path | None = None
    database_url: str | None = None  # the app's own database (its stored replies), where it has one

    @property
    def pid(self) -> int:
        return self.process.process.pid

    def cpu_s(self) -> float:
        """User + system CPU seconds of the app and its children so far."""
        try:
            root = psutil.Process(self.pid)
            processes = [root, *root.children(recursive=True)]
        except psutil.NoSuchProcess:
            return 0.0
        total = 0.0
        for process in processes:
            try:
                times = process.cpu_times()
            except psutil.NoSuchProcess:
                continue
            total += times.user + times.system
        return total

    def thread_cpu_s(self) -> dict[str, float]:
        """CPU seconds so far of the app's event loop (its main thread) and of its other threads (the
        backend loop, database and file threads; Python does not name them to the OS). Threads that
        ended count only in `cpu_s`."""
        try:
            threads = psutil.Process(self.pid).threads()
        except psutil.NoSuchProcess:
            return {}
        totals = {"event loop": 0.0, "other threads": 0.0}
        for thread in threads:
            totals["event loop" if thread.id == self.pid else "other threads"] += thread.user_time + thread.system_time
        return totals

    def stop(self) -> None:
        self.process.stop()
        if self.workdir is not None:
            shutil.rmtree(self.workdir, ignore_errors=True)


@dataclass
class Deployment:
    """Several replicas of one flavour behind nginx (deploy/nginx/serving-lab.conf), as an `App`."""

    flavour: str
    replicas: list[App]
    proxy: Proxy
    cluster: PostgresCluster | None = None

    @property
    def url(self) -> str:
        return self.proxy.url

    @property
    def database_url(self) -> str | None:
        return self.replicas[0].database_url

    @property
    def pid(self) -> int:
        return self.replicas[0].pid

    def cpu_s(self) -> float:
        return sum(replica.cpu_s() for replica in self.replicas)

    def thread_cpu_s(self) -> dict[str, float]:
        totals: dict[str, float] = {}
        for replica in self.replicas:
            for kind, seconds in replica.thread_cpu_s().items():
                totals[kind] = totals.get(kind, 0.0) + seconds
        return totals

    def stop(self) -> None:
        self.proxy.stop()
        for replica in self.replicas:
            replica.stop()
        if self.cluster is not None:
            self.cluster.remove()


def start_deployment(flavour: str, server: PacedServer, kind: str, replicas: int, work: Path) -> App | Deployment:
    """One app of `flavour`, or `replicas` of them behind nginx (this app's on one PostgreSQL)."""
    if replicas == 1:
        return start_floor(server, 1) if flavour == "floor" else start_lab(server, kind, 1, work)
    cluster = None
    started: list[App] = []
    try:
        if flavour == "app":
            cluster = PostgresCluster(max_connections=300)
            database = cluster.start().url
        for index in range(replicas):
            if flavour == "floor":
                started.append(start_floor(server, 1))
            else:
                started.append(start_lab(server, kind, 1, work, database_url=database,
                                         replica=f"app-{index + 1}"))
        proxy = Proxy([app.url.removeprefix("http://") for app in started], name=f"class-burst-nginx-{flavour}").start()
    except BaseException:
        for app in started:
            app.stop()
        if cluster is not None:
            cluster.remove()
        raise
    return Deployment(flavour, started, proxy, cluster)


def start_floor(server: PacedServer, columns: int) -> App:
    """The bare Chainlit app in a folder of its own (Chainlit writes .chainlit/ and .files/ there)."""
    workdir = Path(tempfile.mkdtemp(prefix="floor-app-"))
    shutil.copy(FLOOR_APP, workdir / "app.py")
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = {"FLOOR_BASE_URL": server.base_url, "FLOOR_COLUMNS": str(columns), "CHAINLIT_APP_ROOT": str(workdir)}
    process = ServerProcess(f"class-burst-floor-{columns}", chainlit_command(port), env=env, cwd=workdir)
    process.start_serving(url + "/", OPEN_TIMEOUT_S)
    return App("floor", url, process, workdir)


def start_lab(server: PacedServer, kind: str, columns: int, database_dir: Path, *,
              database_url: str | None = None, replica: str | None = None) -> App:
    """This app with the paced server as its backend (`columns` > 1: that many backends, compare mode),
    on its own SQLite file unless `database_url` is given (replicas share one PostgreSQL)."""
    names = [f"paced{index + 1}" for index in range(columns)]
    env: dict[str, str] = {"BACKENDS": ",".join(names), "DEFAULT_BACKEND": names[0], "AUTH_USERS": "",
                           "DATABASE_URL": database_url or f"sqlite:///{database_dir / f'lab-{columns}.db'}"}
    if replica:
        env["LAB_REPLICA_ID"] = replica
    for name in names:
        env.update(backend_env(name, kind=kind, base_url=server.base_url, label=f"Paced {name}"))
    if columns > 1:
        env.update({"DEFAULT_MODE": "compare", "DEFAULT_COMPARE_BACKENDS": ",".join(names),
                    "DEFAULT_RUN_ORDER": "concurrent"})
    app = start_app(env, name=f"class-burst-app-{columns}" + (f"-{replica}" if replica else ""))
    return App("app", app.url, app.process, database_url=env["DATABASE_URL"])


async def stored_replies(database_url: str, limit: int) -> list:
    """The app's newest stored replies (their records say when each request left), once all are written."""
    from store import Store

    store = await Store.open(database_url)
    try:
        for _ in range(50):
            replies = await store.replies(limit)
            if len(replies) >= limit - 10:
                break
            await asyncio.sleep(0.2)
        return replies
    finally:
        await store.aclose()


# ---------------------------------------------------------------- one burst


@dataclass
class Phase:
    """One burst: N tabs of one app sending at once, and what came back."""

    flavour: str
    students: int
    columns: int
    scenario: str = "connected"  # "connected": every tab open, then all send; "join": open and send at once
    replies: int = 0
    expected: int = 0
    cpu_s: float = 0.0
    wall_s: float = 0.0
    first_text_ms: list[float] = field(default_factory=list)  # tab's first text - server's first send
    reply_end_ms: list[float] = field(default_factory=list)  # tab's marker - server's last send
    ttft_shown_ms: list[float] = field(default_factory=list)
    ttft_bias_ms: list[float] = field(default_factory=list)  # shown - server's truth for the request
    # Where a bias comes from (the app's stored record of each reply against the server's log):
    # request transit = the server's arrival - the app's send; reply transit = the app's stamp of the
    # first token - the server's send of it.
    request_transit_ms: list[float] = field(default_factory=list)
    reply_transit_ms: list[float] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    thread_cpu_s: dict[str, float] = field(default_factory=dict)  # the burst's CPU by kind of thread
    # As each student saw their reply: first text after sending, and ms per token after it (None: no reply).
    seen: list[tuple[float | None, float | None]] = field(default_factory=list)
    # From a student's message leaving the tab to its request reaching the server: the app's (and
    # Chainlit's) work before the request leaves, with the tabs' own sending.
    message_to_request_ms: list[float] = field(default_factory=list)

    def slo_share(self, slo: Slo) -> float | None:
        """The share of messages sent whose reply met `slo` as the student saw it (a failed one never does)."""
        if not self.expected:
            return None
        met = sum(1 for first_ms, tpot_ms in self.seen
                  if first_ms is not None and within(slo, ttft_ms=first_ms, tpot_ms=tpot_ms, e2el_ms=None))
        return met / self.expected

    @property
    def name(self) -> str:
        mode = "chat" if self.columns == 1 else f"compare x{self.columns}"
        joining = ", join+send" if self.scenario == "join" else ""
        return f"{self.students} students{joining}, {mode}, {self.flavour}"

    @property
    def cpu_ms_per_reply(self) -> float | None:
        return self.cpu_s * 1000 / self.replies if self.replies else None

    def p(self, values: list[float], q: float) -> float | None:
        return percentile(values, q) if values else None

    def as_dict(self) -> dict:
        data = asdict(self)
        data["cpu_ms_per_reply"] = self.cpu_ms_per_reply
        return data


async def burst(app: App | Deployment, server: PacedServer, students: int, columns: int,
                profile_dir: Path | None, scenario: str = "connected") -> Phase:
    """Open `students` chats, then send one message from each at the same moment ("connected");
    or, as a class arrives ("join"), every tab opens its page at the same moment and sends its
    message as soon as its own chat has started, while the others' first replies stream. Measure."""
    phase = Phase(app.flavour, students, columns, scenario=scenario, expected=students * columns)
    tabs = [Tab(app.url) for _ in range(students)]

    async def join_and_send(index: int, tab: Tab) -> None:
        await tab.open()
        await tab.send(f"Student {index}: explain time to first token.")

    try:
        if scenario == "connected":
            for start in range(0, students, 10):  # a class opening its pages, ten at a time
                await asyncio.gather(*(tab.open() for tab in tabs[start:start + 10]))
            await asyncio.sleep(1.0)  # every chat start has settled
        seen = len(server.requests())
        profiler = start_profiler(app, profile_dir, phase)
        cpu_before = app.cpu_s()
        threads_before = app.thread_cpu_s()
        started = time.time()
        if scenario == "join":  # the CPU of every chat start counts, as the floor's does
            await asyncio.gather(*(join_and_send(index, tab) for index, tab in enumerate(tabs)))
        else:
            await asyncio.gather(*(tab.send(f"Student {index}: explain time to first token.")
                                   for index, tab in enumerate(tabs)))
        await asyncio.wait_for(asyncio.gather(*(tab.done.wait() for tab in tabs)), REPLY_TIMEOUT_S)
        await asyncio.sleep(SETTLE_S)
        phase.cpu_s = app.cpu_s() - cpu_before
        threads_after = app.thread_cpu_s()
        phase.thread_cpu_s = {kind: threads_after[kind] - threads_before.get(kind, 0.0) for kind in threads_after}
        phase.wall_s = time.time() - started
        stop_profiler(profiler)
    finally:
        await asyncio.gather(*(tab.close() for tab in tabs), return_exceptions=True)
    log = {entry["marker"]: entry for entry in server.requests()[seen:]}
    if app.database_url:
        stored = await stored_replies(app.database_url, students * columns + 10)
        for marker, entry in log.items():
            reply = next((r for r in stored if marker in (r.reply_text or "")), None)
            if reply is None or entry.get("first_token_sent_at_s") is None:
                continue
            sent_at_s = reply.record.get("started_at_unix_s")
            first_token_s = reply.record.get("first_token_s")
            if sent_at_s and first_token_s is not None:
                phase.request_transit_ms.append((entry["received_at_s"] - sent_at_s) * 1000)
                phase.reply_transit_ms.append((sent_at_s + first_token_s - entry["first_token_sent_at_s"]) * 1000)
    for index, tab in enumerate(tabs):
        markers = [reply for reply in tab.replies.values() if reply.marker]
        if len(markers) != columns:
            seen = "; ".join(f"{r.key[:8]}: {r.text[:300]!r}" for r in tab.replies.values()) or "no reply"
            phase.failures.append(f"tab {index}: {len(markers)} of {columns} replies ended with their marker "
                                  f"({'done' if tab.done.is_set() else 'not done'}; {seen})")
        for reply in markers:
            truth = log.get(reply.marker)
            if truth is None or truth.get("first_token_sent_at_s") is None:
                phase.failures.append(f"tab {index}: {reply.marker} is not in the server's log")
                continue
            phase.replies += 1
            phase.message_to_request_ms.append((truth["received_at_s"] - tab.sent_at_s) * 1000)
            tokens = truth.get("tokens_sent") or 0
            phase.seen.append(((reply.first_text_at_s - tab.sent_at_s) * 1000,
                               (reply.marker_at_s - reply.first_text_at_s) * 1000 / (tokens - 1) if tokens > 1 else 0.0))
            phase.first_text_ms.append((reply.first_text_at_s - truth["first_token_sent_at_s"]) * 1000)
            phase.reply_end_ms.append((reply.marker_at_s - truth["last_token_sent_at_s"]) * 1000)
            if app.flavour == "app":
                if reply.ttft_shown_ms is None:
                    phase.failures.append(f"tab {index}: the app showed no final TTFT for {reply.marker}")
                    continue
                phase.ttft_shown_ms.append(reply.ttft_shown_ms)
                truth_ms = (truth["first_token_sent_at_s"] - truth["received_at_s"]) * 1000
                phase.ttft_bias_ms.append(reply.ttft_shown_ms - truth_ms)
    return phase


def start_profiler(app: App, profile_dir: Path | None, phase: Phase) -> subprocess.Popen | None:
    """py-spy on the app for the burst (a flame graph per phase), where asked for and installed."""
    if profile_dir is None or app.flavour != "app":
        return None
    py_spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    if not Path(py_spy).exists():
        print("  (py-spy is not installed: no profile)")
        return None
    profile_dir.mkdir(parents=True, exist_ok=True)
    name = f"{phase.students}-students-{phase.columns}-columns"
    return subprocess.Popen([py_spy, "record", "--pid", str(app.pid), "--nonblocking", "--rate", "500", "--format", "speedscope",
                             "-o", str(profile_dir / f"{name}.speedscope.json"), "--subprocesses"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def stop_profiler(profiler: subprocess.Popen | None) -> None:
    if profiler is not None:
        profiler.send_signal(signal.SIGINT)
        try:
            profiler.wait(timeout=60)
        except subprocess.TimeoutExpired:
            profiler.kill()


# ---------------------------------------------------------------- the run


def ms(value: float | None) -> str:
    return "-" if value is None else f"{value:+.0f}"


def print_table(phases: list[Phase]) -> None:
    print(f"\n{'phase':<34} {'replies':>8} {'CPU/reply':>10} {'first text p50/p99':>19} "
          f"{'reply end p50/p99':>18} {'TTFT shown p50/p99':>19} {'bias p99':>9}")
    for phase in phases:
        cpu = "-" if phase.cpu_ms_per_reply is None else f"{phase.cpu_ms_per_reply:.0f} ms"
        shown = ("-" if not phase.ttft_shown_ms else
                 f"{phase.p(phase.ttft_shown_ms, 50):.0f} / {phase.p(phase.ttft_shown_ms, 99):.0f}")
        print(f"{phase.name:<34} {phase.replies:>3}/{phase.expected:<4} {cpu:>10} "
              f"{ms(phase.p(phase.first_text_ms, 50)):>9} / {ms(phase.p(phase.first_text_ms, 99)):<7} "
              f"{ms(phase.p(phase.reply_end_ms, 50)):>8} / {ms(phase.p(phase.reply_end_ms, 99)):<7} "
              f"{shown:>19} {ms(phase.p(phase.ttft_bias_ms, 99)):>9}")
        if phase.thread_cpu_s and phase.replies:
            print(f"{'':<34} CPU per reply by thread: " + ", ".join(
                f"{kind} {seconds * 1000 / phase.replies:.1f} ms"
                for kind, seconds in sorted(phase.thread_cpu_s.items(), key=lambda item: -item[1]) if seconds > 0))
        if phase.message_to_request_ms:
            print(f"{'':<34} message sent -> request at the server p50/p99 "
                  f"{ms(phase.p(phase.message_to_request_ms, 50))} / {ms(phase.p(phase.message_to_request_ms, 99))} ms")
        if phase.request_transit_ms:
            print(f"{'':<34} where the bias is: request transit p50/p99 "
                  f"{ms(phase.p(phase.request_transit_ms, 50))} / {ms(phase.p(phase.request_transit_ms, 99))} ms "
                  f"(app sent -> server received), first token transit "
                  f"{ms(phase.p(phase.reply_transit_ms, 50))} / {ms(phase.p(phase.reply_transit_ms, 99))} ms "
                  f"(server sent -> app stamped)")


def pooled(phases: list[Phase], flavour: str, students: int, columns: int,
           scenario: str = "connected") -> Phase | None:
    """All bursts of one flavour, size and scenario together (several rounds: their replies pooled)."""
    chosen = [p for p in phases if p.flavour == flavour and p.students == students and p.columns == columns
              and p.scenario == scenario]
    if not chosen:
        return None
    total = Phase(flavour, students, columns, scenario=scenario)
    for phase in chosen:
        total.replies += phase.replies
        total.expected += phase.expected
        total.cpu_s += phase.cpu_s
        total.first_text_ms += phase.first_text_ms
        total.reply_end_ms += phase.reply_end_ms
        total.ttft_shown_ms += phase.ttft_shown_ms
        total.ttft_bias_ms += phase.ttft_bias_ms
        total.request_transit_ms += phase.request_transit_ms
        total.reply_transit_ms += phase.reply_transit_ms
        total.message_to_request_ms += phase.message_to_request_ms
        total.failures += phase.failures
    return total


def goals_for(phases: list[Phase], sizes: list[tuple[int, int]], scenarios: tuple[str, ...] = ("connected",)
              ) -> list[Goal]:
    goals: list[Goal] = []
    for scenario in scenarios:
        goals += _goals_of(phases, sizes, scenario)
    return goals


def _goals_of(phases: list[Phase], sizes: list[tuple[int, int]], scenario: str) -> list[Goal]:
    goals: list[Goal] = []
    for students, columns in sizes:
        floor = pooled(phases, "floor", students, columns, scenario)
        app = pooled(phases, "app", students, columns, scenario)
        if floor is None or app is None:
            continue
        what = (f"{students} students" + (" joining and sending" if scenario == "join" else "")
                + ("" if columns == 1 else f", {columns}-column compare"))
        ratio = (app.cpu_ms_per_reply / floor.cpu_ms_per_reply
                 if app.cpu_ms_per_reply and floor.cpu_ms_per_reply else None)
        cpu_goal = JOIN_CPU_RATIO_GOAL if scenario == "join" else CPU_RATIO_GOAL
        goals.append(at_most(f"{what}: CPU per reply, app / floor", ratio, cpu_goal, digits=2))
        for label, values, bound in (("first text", "first_text_ms", FIRST_TEXT_GOAL_MS),
                                     ("reply end", "reply_end_ms", REPLY_END_GOAL_MS)):
            app_p99, floor_p99 = app.p(getattr(app, values), 99), floor.p(getattr(floor, values), 99)
            over = None if app_p99 is None or floor_p99 is None else app_p99 - floor_p99
            goals.append(at_most(f"{what}: {label} p99, app over floor", over, bound, unit="ms", digits=0))
        goals.append(at_most(f"{what}: TTFT shown over the truth, p99", app.p(app.ttft_bias_ms, 99),
                             JOIN_TTFT_GOAL_MS if scenario == "join" else ttft_goal_ms(students), unit="ms"))
        goals.append(Goal(f"{what}: replies measured (app and floor)",
                          float(app.replies + floor.replies if not (app.failures or floor.failures) else -1),
                          low=app.expected + floor.expected, high=app.expected + floor.expected, digits=0,
                          stated=f"all {app.expected + floor.expected}"))
    return goals


async def run(args: argparse.Namespace) -> int:
    sizes = [(students, 1) for students in args.students]
    if args.compare_students:
        sizes.append((args.compare_students, args.columns))
    order = ["floor", "app"] + (["app", "floor"] if args.rounds > 1 else [])
    flavours = [f for f in order if args.only in (None, f)]
    server = start_paced_server(args.rate, args.tokens, name="class-burst-paced")
    server.set_pace(args.rate, args.tokens, first_token_s=args.first_token_ms / 1000)
    phases: list[Phase] = []
    database_dir = Path(tempfile.mkdtemp(prefix="class-burst-db-"))
    print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    try:
        for columns in sorted({c for _, c in sizes}):
            for flavour in flavours:
                app = start_floor(server, columns) if flavour == "floor" else start_lab(server, args.kind, columns,
                                                                                         database_dir)
                try:
                    warm = Tab(app.url)  # one reply first: the class meets an app that has answered before
                    await warm.open()
                    await warm.send("Warm up.")
                    await asyncio.wait_for(warm.done.wait(), REPLY_TIMEOUT_S)
                    await warm.close()
                    for students, scenario in [(s, scenario) for s, c in sizes if c == columns
                                               for scenario in args.scenarios
                                               if c == 1 or scenario == "connected"]:
                        phase = await burst(app, server, students, columns, args.profile, scenario)
                        phases.append(phase)
                        print(f"  {phase.name}: {phase.replies}/{phase.expected} replies, "
                              f"CPU/reply {phase.cpu_ms_per_reply or 0:.0f} ms, first text p99 "
                              f"{ms(phase.p(phase.first_text_ms, 99))} ms"
                              + (f", failures: {phase.failures[:3]}" if phase.failures else ""), flush=True)
                        await asyncio.sleep(2.0)
                finally:
                    app.stop()
    finally:
        server.stop()
        shutil.rmtree(database_dir, ignore_errors=True)
    print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print(f"\nServer truth: first token {args.first_token_ms:g} ms after arrival, {args.tokens} tokens at "
          f"{args.rate:g}/s. Times in ms: over the server's send times (first text, reply end), "
          f"the app's own TTFT figure (shown), and shown minus the server's truth per request (bias).")
    print_table(phases)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "class_burst.json").write_text(json.dumps(
            {"args": {k: str(v) for k, v in vars(args).items()}, "phases": [p.as_dict() for p in phases]}, indent=1))
        print(f"\nwritten: {args.out / 'class_burst.json'}")
    return exit_status(goals_for(phases, sizes, tuple(args.scenarios)))


@dataclass
class Ceiling:
    """The most students at once one deployment held within the objective, and each level tried."""

    flavour: str
    replicas: int
    levels: list[tuple[int, float | None, Phase]] = field(default_factory=list)  # (students, share met, phase)
    holds: int | None = None  # the largest level met before the first one missed
    missed_at: int | None = None

    @property
    def name(self) -> str:
        return f"{self.flavour}, {self.replicas} replica{'s' if self.replicas > 1 else ''}"


async def find_ceiling(flavour: str, replicas: int, server: PacedServer, args: argparse.Namespace,
                       slo: Slo, work: Path) -> Ceiling:
    """Burst the deployment at each level in turn (the project's capacity rule: the largest level whose
    share of replies meeting the objective reaches the percentile), stopping at the first miss."""
    ceiling = Ceiling(flavour, replicas)
    deployment = start_deployment(flavour, server, args.kind, replicas, work)
    try:
        warm = Tab(deployment.url)
        await warm.open()
        await warm.send("Warm up.")
        await asyncio.wait_for(warm.done.wait(), REPLY_TIMEOUT_S)
        await warm.close()
        for students in args.levels:
            phase = await burst(deployment, server, students, 1, None)
            share = phase.slo_share(slo)
            ceiling.levels.append((students, share, phase))
            firsts = [first for first, _ in phase.seen if first is not None]
            to_request = phase.message_to_request_ms
            print(f"  {ceiling.name}: {students} at once, {share or 0:.0%} met the objective, first text from "
                  f"sending p50/p99 {ms(percentile(firsts, 50)) if firsts else '-'} / "
                  f"{ms(percentile(firsts, 99)) if firsts else '-'} ms (message to request p50/p99 "
                  f"{ms(phase.p(to_request, 50))} / {ms(phase.p(to_request, 99))} ms)", flush=True)
            if share is not None and share * 100 >= slo.percentile:
                ceiling.holds = students
            else:
                ceiling.missed_at = students
                break
            await asyncio.sleep(2.0)
    finally:
        deployment.stop()
    return ceiling


async def run_ceiling(args: argparse.Namespace) -> int:
    slo = parse_slo(args.slo, args.percentile)
    server = start_paced_server(args.rate, args.tokens, name="class-burst-paced")
    server.set_pace(args.rate, args.tokens, first_token_s=args.first_token_ms / 1000)
    work = Path(tempfile.mkdtemp(prefix="class-burst-ceiling-"))
    ceilings: list[Ceiling] = []
    print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    try:
        for replicas in args.replicas:
            for flavour in [f for f in ("floor", "app") if args.only in (None, f)]:
                ceilings.append(await find_ceiling(flavour, replicas, server, args, slo, work))
    finally:
        server.stop()
        shutil.rmtree(work, ignore_errors=True)
    print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print(f"\nObjective as the students saw it: first text within {slo.ttft_ms:g} ms of sending and "
          f"{slo.tpot_ms:g} ms per token after it, for {slo.percentile:g}% of the messages; the server's own "
          f"first token {args.first_token_ms:g} ms, {args.tokens} tokens at {args.rate:g}/s; the load "
          "generator, the server and every replica share this machine.")
    print(f"{'deployment':<22} {'holds (students at once)':>25} {'first miss':>11}  levels (share met)")
    for ceiling in ceilings:
        levels = ", ".join(f"{students}: {share or 0:.0%}" for students, share, _ in ceiling.levels)
        print(f"{ceiling.name:<22} {ceiling.holds if ceiling.holds is not None else '-':>25} "
              f"{ceiling.missed_at if ceiling.missed_at is not None else 'none':>11}  {levels}")
    goals: list[Goal] = []
    by = {(c.flavour, c.replicas): c for c in ceilings}
    for ceiling in ceilings:
        goals.append(Goal(f"{ceiling.name}: a ceiling was found (a level met, then one missed)",
                          float(ceiling.holds) if ceiling.holds is not None and ceiling.missed_at is not None else None,
                          low=1, why_unmeasured="no level met" if ceiling.holds is None else
                          f"no level up to {args.levels[-1]} missed: raise --levels", digits=0))
    if len(args.replicas) > 1:
        one, more = min(args.replicas), max(args.replicas)
        for flavour in ("floor", "app"):
            base, scaled = by.get((flavour, one)), by.get((flavour, more))
            if base is None or scaled is None:
                continue
            ratio = (scaled.holds / base.holds) if base.holds and scaled.holds else None
            goals.append(at_least(f"{flavour}: {more} replicas hold, over {one}", ratio, 0.75 * more / one, digits=2))
    return exit_status(goals)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--students", type=lambda s: [int(x) for x in s.split(",") if x], default=[30, 60],
                        help="students sending at once in chat mode, comma-separated (30,60)")
    parser.add_argument("--compare-students", type=int, default=10, help="students in a compare round (10; 0: none)")
    parser.add_argument("--columns", type=int, default=3, help="columns of the compare round (3)")
    parser.add_argument("--first-token-ms", type=float, default=300.0, help="the server's true TTFT (300)")
    parser.add_argument("--tokens", type=int, default=100, help="tokens per reply (100)")
    parser.add_argument("--rate", type=float, default=50.0, help="tokens/s per reply (50: a token every 20 ms)")
    parser.add_argument("--kind", default="vllm", choices=("vllm", "openai"), help="the app's backend kind (vllm)")
    parser.add_argument("--rounds", type=int, default=1, help="1: floor, app; 2: floor, app, app, floor")
    parser.add_argument("--scenarios", type=lambda s: [x for x in s.split(",") if x], default=["connected", "join"],
                        help="connected: every tab open, then all send; join: every tab opens and sends at once, "
                             "as a class arrives (both; compare rounds: connected only)")
    parser.add_argument("--only", choices=("app", "floor"), help="burst one flavour only (no verdict on ratios)")
    parser.add_argument("--profile", type=Path, help="record the app under each burst with py-spy into this folder")
    parser.add_argument("--out", type=Path, help="write every figure as JSON into this folder")
    parser.add_argument("--ceiling", action="store_true",
                        help="find how many students at once each deployment holds within --slo instead")
    parser.add_argument("--levels", type=lambda s: [int(x) for x in s.split(",") if x],
                        default=[10, 20, 40, 60, 80, 100, 120, 160], help="--ceiling: students at once, ascending")
    parser.add_argument("--replicas", type=lambda s: [int(x) for x in s.split(",") if x], default=[1],
                        help="--ceiling: replicas behind nginx to try, e.g. 1,2 (more than 1: PostgreSQL, nginx)")
    parser.add_argument("--slo", default=os.environ.get("CAPACITY_SLO") or DEFAULT_SLO,
                        help="--ceiling: the objective as students see it (CAPACITY_SLO, else ttft_ms=500,tpot_ms=50)")
    parser.add_argument("--percentile", type=float,
                        default=float(os.environ.get("CAPACITY_PERCENTILE") or DEFAULT_PERCENTILE),
                        help="--ceiling: the share of messages that must meet it (CAPACITY_PERCENTILE, else 90)")
    args = parser.parse_args(argv)
    if args.ceiling:
        if any(level > MAX_STUDENTS for level in args.levels) or not all(1 <= r <= 4 for r in args.replicas):
            parser.error(f"--levels at most {MAX_STUDENTS} students, --replicas 1..4")
        return asyncio.run(run_ceiling(args))
    return asyncio.run(run(args))


if __name__ == "__main__":
    sys.exit(main())
