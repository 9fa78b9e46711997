"""A classroom on the app: each Locust user is a student with one browser tab.

A `ChainlitUser` opens a chat over Chainlit's real socket.io protocol
(`chainlit_client.py`), then keeps sending a short question from `prompts.txt`,
waits for the full reply and thinks a while before the next one. What Locust
records (request_type "chat"):

- "open": page load + socket + on_chat_start finished (the chat is usable);
- "reply": message sent -> the reply's task ended (the whole reply on screen);
- "first_token": message sent -> first reply text on screen;

failures are the app's error messages, empty replies, timeouts and lost
sockets. One probe per run (on the local or master runner only) GETs the
app's `/health` every LOAD_HEALTH_INTERVAL_S and reports it as "health"
(request_type "http"): its p99 shows whether the app's event loop stays
responsive while the room chats.

Run it alone (`scripts/classroom_load.sh` wraps it with the app and a summary):

    .venv-load/bin/locust -f load/locustfile.py --headless -u 30 -r 2 -t 3m \\
        --stop-timeout 60 --host http://127.0.0.1:8000

or distributed, unchanged (a master and any number of workers):

    .venv-load/bin/locust -f load/locustfile.py --master --master-bind-host 127.0.0.1 \\
        --headless -u 60 -r 2 -t 3m --expect-workers 2 --host http://127.0.0.1:8000
    .venv-load/bin/locust -f load/locustfile.py --worker --master-host 127.0.0.1   # twice

Environment (all optional): LOAD_THINK_MIN_S / LOAD_THINK_MAX_S (think time
between messages, default 5-15 s), LOAD_REPLY_TIMEOUT_S (180), LOAD_OPEN_TIMEOUT_S
(60), LOAD_BACKEND (switch every user's session to this backend in the settings
panel, as a student would), LOAD_HEALTH_INTERVAL_S (0.5), LOAD_LANGUAGE (en-US),
LOAD_RESULTS_DIR (write one JSON line per chat, per message and per health
probe there, read by `load/summary.py`), LOAD_BURST_EVERY_S (0: off; else no
think time: every student sends at each multiple of this many seconds of the
wall clock, all workers alike, as a class does when the teacher says "now").
Only loopback hosts are accepted.
"""

from __future__ import annotations

import ipaddress
import json
import logging
import os
import random
import time
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import gevent
import requests
from locust import User, between, events, task
from locust.exception import StopUser
from locust.runners import STATE_RUNNING, STATE_SPAWNING, WorkerRunner

# Locust puts this file's folder on the import path, so the client imports by its own name.
from chainlit_client import ChainlitClient, ChatFailed, ReplyRecord

PROMPTS_PATH = Path(__file__).with_name("prompts.txt")


@dataclass(frozen=True)
class LoadSettings:
    """How the simulated students behave (LOAD_* environment variables)."""

    think_min_s: float = 5.0
    think_max_s: float = 15.0
    reply_timeout_s: float = 180.0
    open_timeout_s: float = 60.0
    backend: str = ""
    health_interval_s: float = 0.5
    language: str = "en-US"
    results_dir: str = ""
    burst_every_s: float = 0.0  # > 0: every student sends at the same second, each multiple of this

    @classmethod
    def from_env(cls, env: dict[str, str] | os._Environ = os.environ) -> "LoadSettings":
        def number(name: str, default: float) -> float:
            return float(env.get(name) or default)

        settings = cls(
            think_min_s=number("LOAD_THINK_MIN_S", cls.think_min_s),
            think_max_s=number("LOAD_THINK_MAX_S", cls.think_max_s),
            reply_timeout_s=number("LOAD_REPLY_TIMEOUT_S", cls.reply_timeout_s),
            open_timeout_s=number("LOAD_OPEN_TIMEOUT_S", cls.open_timeout_s),
            backend=env.get("LOAD_BACKEND", ""),
            health_interval_s=number("LOAD_HEALTH_INTERVAL_S", cls.health_interval_s),
            language=env.get("LOAD_LANGUAGE") or cls.language,
            results_dir=env.get("LOAD_RESULTS_DIR", ""),
            burst_every_s=number("LOAD_BURST_EVERY_S", cls.burst_every_s),
        )
        if not 0 <= settings.think_min_s <= settings.think_max_s:
            raise ValueError("need 0 <= LOAD_THINK_MIN_S <= LOAD_THINK_MAX_S")
        if settings.burst_every_s < 0:
            raise ValueError("LOAD_BURST_EVERY_S must be 0 (off) or more seconds")
        return settings


def until_next_burst(now_s: float, every_s: float) -> float:
    """Seconds from `now_s` (wall clock) to the next multiple of `every_s`: every student's next send,
    on every Locust worker of this machine alike (they share the clock)."""
    return every_s - (now_s % every_s)


def is_loopback_url(url: str) -> bool:
    """True for http(s) URLs on 127.0.0.0/8, ::1 or localhost: the only places this test may load."""
    parts = urlsplit(url or "")
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return False
    if parts.hostname == "localhost":
        return True
    try:
        return ipaddress.ip_address(parts.hostname).is_loopback
    except ValueError:
        return False


SETTINGS = LoadSettings.from_env()
PROMPTS = [line.strip() for line in PROMPTS_PATH.read_text(encoding="utf-8").splitlines()
           if line.strip() and not line.startswith("#")]


class ReplyFailed(Exception):
    """A message that got no complete reply; the text groups alike failures in Locust's table."""


def failure_of(record: ReplyRecord) -> ReplyFailed | None:
    """None for a complete reply, else why it failed (few distinct texts, so Locust can count them)."""
    if record.ok:
        return None
    queue = "" if not record.queued else " while queued (place moved)" if record.queue_moved \
        else " while queued (place never moved)"
    if record.outcome == "error":
        first_line = ((record.error or "").strip().splitlines() or [""])[0]
        return ReplyFailed(f"app error: {first_line[:120]}")
    if record.outcome == "timeout":
        return ReplyFailed(f"no complete reply within {SETTINGS.reply_timeout_s:.0f} s{queue}")
    if record.outcome == "disconnected":
        return ReplyFailed(f"socket lost during the reply{queue}")
    return ReplyFailed(f"{record.outcome or 'unfinished'} reply")


class ResultsFile:
    """One JSON line per chat opened, per message and per health probe, in LOAD_RESULTS_DIR (one file per process)."""

    def __init__(self, directory: str) -> None:
        self.path = Path(directory) / f"chat-records-{os.getpid()}.jsonl" if directory else None

    def write(self, kind: str, **fields: object) -> None:
        if self.path is None:
            return
        line = json.dumps({"kind": kind, "at": time.time(), **fields}, ensure_ascii=False)
        with open(self.path, "a", encoding="utf-8") as out:
            out.write(line + "\n")


RESULTS = ResultsFile(SETTINGS.results_dir)


class ChainlitUser(User):
    """A student: one chat, a question, the whole reply, think, repeat. With LOAD_BURST_EVERY_S the
    class sends together instead, as when a teacher says "now": every student at the same second."""

    wait_time = between(0, 0) if SETTINGS.burst_every_s else between(SETTINGS.think_min_s, SETTINGS.think_max_s)

    def on_start(self) -> None:
        if not is_loopback_url(self.host):
            raise StopUser(f"refusing to load {self.host!r}: only loopback hosts (127.0.0.1, localhost, ::1)")
        self.chat: ChainlitClient | None = None

    def on_stop(self) -> None:
        self._close_chat()

    @task
    def ask_a_question(self) -> None:
        if self.chat is None and not self._open_chat():
            return
        prompt = random.choice(PROMPTS)
        burst_at = None
        if SETTINGS.burst_every_s:
            wait_s = until_next_burst(time.time(), SETTINGS.burst_every_s)
            gevent.sleep(wait_s)
            if self.environment.runner is not None and self.environment.runner.state not in (STATE_RUNNING,
                                                                                             STATE_SPAWNING):
                # The run ended while this student waited for the burst: Locust's graceful stop lets a
                # task finish, and sending now would start a reply after the run (a benchmark counting
                # rows at its end then missed that whole burst's).
                return
            burst_at = round(time.time())
        record = None
        try:
            sent_at = time.time()
            record = self.chat.send(prompt)
            self.chat.wait_reply(SETTINGS.reply_timeout_s)
        finally:
            # Also when Locust stops this user mid-reply (the message was sent, its reply unfinished).
            if record is not None:
                self._report(record, burst_at, sent_at)
        if not record.ok and record.outcome in ("timeout", "disconnected"):
            # The tab is in an unknown state: the next question starts a new chat, as a reload would.
            self._close_chat()

    def _open_chat(self) -> bool:
        chat = ChainlitClient(self.host, language=SETTINGS.language)
        started = time.perf_counter()
        failure = None
        try:
            chat.open_chat(SETTINGS.open_timeout_s)
            if SETTINGS.backend:
                chat.change_settings(backend=SETTINGS.backend)
        except (ChatFailed, ValueError, requests.RequestException) as error:
            failure = error
        elapsed_s = time.perf_counter() - started
        self._fire("open", elapsed_s, 0, failure)
        RESULTS.write("open", ok=failure is None, open_s=elapsed_s, error=str(failure) if failure else None,
                      transport=chat.transport, replica=chat.replica)
        if failure is not None:
            chat.close()
            if isinstance(failure, ValueError):  # LOAD_BACKEND is not offered: no retry will help
                logging.error("stopping the run: %s", failure)
                gevent.spawn(self.environment.runner.quit)  # not from this user's own greenlet, which quit() kills
            return False
        self.chat = chat
        return True

    def _close_chat(self) -> None:
        if self.chat is not None:
            self.chat.close()
            self.chat = None

    def _report(self, record: ReplyRecord, burst_at: float | None = None, sent_at: float | None = None) -> None:
        failure = failure_of(record)
        if record.first_token_s is not None:
            self._fire("first_token", record.first_token_s, 0, None)
        if record.done:
            elapsed_s = record.reply_s if record.reply_s is not None \
                else time.perf_counter() - record.sent_at_s
            self._fire("reply", elapsed_s, len(record.text), failure)
        RESULTS.write("message", **{**record.as_dict(), "outcome": record.outcome or "unfinished",
                                    "replica": self.chat.replica if self.chat is not None else None,
                                    "burst_at": burst_at, "sent_wall_s": sent_at})

    def _fire(self, name: str, elapsed_s: float, length: int, failure: Exception | None) -> None:
        self.environment.events.request.fire(
            request_type="chat", name=name, response_time=elapsed_s * 1000, response_length=length,
            exception=failure, context={},
        )


# ---------------------------------------------------------------- the health probe

_probe: gevent.Greenlet | None = None


def probe_health(environment, url: str, interval_s: float) -> None:
    """GET `url` every `interval_s` and report each as request "health"."""
    session = requests.Session()
    while True:
        started = time.perf_counter()
        failure, length = None, 0
        try:
            response = session.get(url, timeout=10)
            response.raise_for_status()
            length = len(response.content)
        except requests.RequestException as error:
            failure = error
        elapsed_s = time.perf_counter() - started
        environment.events.request.fire(request_type="http", name="health", response_time=elapsed_s * 1000,
                                        response_length=length, exception=failure, context={})
        RESULTS.write("health", ok=failure is None, health_s=elapsed_s)
        gevent.sleep(max(0.0, interval_s - elapsed_s))


@events.init.add_listener
def refuse_remote_hosts(environment, **_kwargs) -> None:
    """Stop before any traffic unless --host is on loopback (workers get the host from the master)."""
    if isinstance(environment.runner, WorkerRunner):
        return
    if not is_loopback_url(environment.host or ""):
        # SystemExit is not caught by Locust's event hooks: the run ends here.
        raise SystemExit(f"refusing to load {environment.host!r}: give --host a loopback URL "
                         "(http://127.0.0.1:PORT, localhost or [::1])")


@events.test_start.add_listener
def start_health_probe(environment, **_kwargs) -> None:
    global _probe
    if isinstance(environment.runner, WorkerRunner) or _probe is not None:
        return
    url = environment.host.rstrip("/") + "/health"
    _probe = gevent.spawn(probe_health, environment, url, SETTINGS.health_interval_s)


@events.test_stopping.add_listener
def note_the_end(environment, **_kwargs) -> None:
    """When the run ended (its time was up, or Ctrl-C): nothing a student sends may start later."""
    RESULTS.write("stopping")


@events.test_stop.add_listener
def stop_health_probe(environment, **_kwargs) -> None:
    global _probe
    if _probe is not None:
        _probe.kill()
        _probe = None
