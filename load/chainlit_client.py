"""A small client of Chainlit 2.12's socket.io protocol, speaking as the browser does.

What the browser does (read from chainlit 2.12's server code and its bundled
frontend), and what this client repeats:

1. Page load: `GET /auth/config`, `GET /user`, `GET /project/settings?language=L`,
   `GET /project/translations?language=L`, then `POST /set-session-cookie`
   `{"session_id": S}` (a sticky-session cookie `X-Chainlit-Session-id`).
2. socket.io on path `/ws/socket.io` with the auth object
   `{clientType: "webapp", sessionId: S (a new uuid4), threadId: "",
   userEnv: "{}" (a JSON string), chatProfile: ""}`; the server reads the UI
   language from the `Accept-Language` header. On `connect` the browser emits
   `connection_successful` (which starts `on_chat_start`) and `fetch_favorites`.
3. Chat ready: `connection_successful` first answers `task_end`, then the
   `on_chat_start` task runs between `task_start` and `task_end`, inside a
   `run` step named `on_chat_start` (run steps of Chainlit's own callbacks are
   sent even when the UI hides chain of thought). Ready = the first
   `task_end` after a `task_start`.
4. A user message: `client_message` `{"message": step, "fileReferences": []}`,
   step = `{threadId: "", id: uuid4, name: "User", type: "user_message",
   output: TEXT, createdAt: ISO time, metadata: {location: PAGE_URL}}`.
5. The reply: `task_start`; a `run` step `on_message` whose `parentId` is our
   message id; assistant messages (`new_message`, type `assistant_message`)
   whose `parentId` is that run step; the streamed one starts with
   `stream_start` (its `output` already holds the first text), continues with
   `stream_token` `{id, token, isSequence, isInput}` and ends with
   `update_message` holding the full text (a tab that took the app's live tap
   gets the text as `lab_text` instead of `stream_start` and `stream_token`,
   and the figures' refreshes as `lab_live`); elements (`element`, here the live
   figures whose `props.queuePosition` says how many requests are ahead);
   the run step's `update_message` with `end`; and `task_end`: reply complete.
   Errors are assistant messages with `isError` (Chainlit's own) or the app's
   "could not answer" message, and a run step updated with `isError` (the
   handler raised: Chainlit shows it only inside the step, sends no message).

`ChatTracker` turns that event stream into `ReplyRecord`s. It is pure (events
in, records out, times given by the caller), so it is unit-tested on events
recorded from the real app. `ChainlitClient` (sync: threads, or greenlets under
Locust) and `AsyncChainlitClient` (asyncio) only move events into it.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import threading
import time
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Callable

import requests
import socketio

SOCKET_PATH = "/ws/socket.io"
# Which app replica answered, behind a proxy in front of several (core/replica.py; this client runs
# in Locust's own venv and imports nothing of the app).
REPLICA_HEADER = "X-Lab-Replica"
# The app's error message title (core/texts.py "error_title"), in both UI languages.
ERROR_MARKERS = ("could not answer", "无法回答")
# A reply's figures element in one of these states holds the app's final measurement of it.
FINAL_STATES = ("completed", "stopped", "error")
# Chainlit's own callback names for the run steps that wrap them.
MESSAGE_STEP = "on_message"
# What a page says (a window message) to take a reply's text as `lab_text` events instead of Chainlit's
# stream, and its figures as `lab_live` events instead of element updates, and the app's answer
# (ui/live_tap.py; the page's side is public/serving-lab.js).
LIVE_TAP_OFFER = {"servingLab": "serving-lab-live-tap", "version": 3}
LIVE_TAP_ACK = "lab_live_ack"
LIVE_EVENT = "lab_live"
LIVE_TEXT = "lab_text"  # {"id": the figures element's id, "for": the message's id, "text": its next text,
#                         "props": the figures' live props, when a refresh rode with the text}
# How a recording marks the message the client sent (not a server event).
SENT_MESSAGE = "> client_message"

Clock = Callable[[], float]


# ---------------------------------------------------------------- what the browser sends


def browser_auth(session_id: str, user_env: dict[str, str] | None = None) -> dict[str, str]:
    """The socket.io auth object of Chainlit 2.12's webapp (no login, no thread to resume).
    `user_env` is what a page could claim as Chainlit's per-user environment (tests forge it)."""
    return {"clientType": "webapp", "sessionId": session_id, "threadId": "",
            "userEnv": json.dumps(user_env) if user_env else "{}", "chatProfile": ""}


def browser_headers(base_url: str, language: str) -> dict[str, str]:
    """Headers the server reads: the UI language, and the page's origin."""
    return {"Accept-Language": f"{language},{language.split('-')[0]};q=0.9", "Origin": base_url}


def page_load_requests(language: str, session_id: str) -> list[tuple[str, str, dict | None]]:
    """(method, path, json body) of the HTTP calls the page makes before it opens the socket."""
    return [
        ("GET", "/auth/config", None),
        ("GET", "/user", None),
        ("GET", f"/project/settings?language={language}", None),
        ("GET", f"/project/translations?language={language}", None),
        ("POST", "/set-session-cookie", {"session_id": session_id}),
    ]


def user_message(text: str, page_url: str, *, message_id: str | None = None,
                 now: datetime | None = None) -> dict[str, Any]:
    """The `client_message` payload of a typed message, as the browser builds it."""
    created = (now or datetime.now(timezone.utc)).isoformat(timespec="milliseconds")
    step = {
        "threadId": "",
        "id": message_id or str(uuid.uuid4()),
        "name": "User",
        "type": "user_message",
        "output": text,
        "createdAt": created.replace("+00:00", "Z"),
        "metadata": {"location": page_url},
    }
    return {"message": step, "fileReferences": []}


def settings_form(widgets: list[dict], **overrides: object) -> dict[str, object]:
    """The values the settings panel sends on Confirm: every widget's current value, with overrides.

    Raises ValueError for an override naming no widget, or a Select value that
    is not one of its items (the message lists the valid ones).
    """
    form = {widget["id"]: widget.get("initial") for widget in widgets}
    for key, value in overrides.items():
        widget = next((w for w in widgets if w["id"] == key), None)
        if widget is None:
            raise ValueError(f"no setting {key!r}; the app has: {', '.join(form)}")
        items = [item["value"] for item in widget.get("items") or []]
        if widget.get("type") == "select" and value not in items:
            raise ValueError(f"{key}={value!r} is not offered; the app has: {', '.join(items)}")
        form[key] = value
    return form


# ---------------------------------------------------------------- what comes back


@dataclass
class ReplyRecord:
    """One message sent and what came back. Times (`*_at_s`) are the client's clock, in seconds.

    `outcome`: None while waiting, then "replied" (text, no error), "error"
    (the app showed an error), "empty" (the task ended without text),
    "timeout" or "disconnected" (the client gave up or lost the socket).
    """

    prompt: str
    message_id: str
    sent_at_s: float
    task_started_at_s: float | None = None
    first_token_at_s: float | None = None
    final_update_at_s: float | None = None
    completed_at_s: float | None = None
    text: str = ""
    error: str | None = None
    queue_positions: list[int] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    outcome: str | None = None
    # The reply's own figures element once final (the app's measurement): tokens and ms per token.
    output_tokens: int | None = None
    ms_per_token: float | None = None

    @property
    def done(self) -> bool:
        return self.outcome is not None

    @property
    def ok(self) -> bool:
        return self.outcome == "replied"

    @property
    def first_token_s(self) -> float | None:
        """Seconds from sending to the first text on screen."""
        return None if self.first_token_at_s is None else self.first_token_at_s - self.sent_at_s

    @property
    def reply_s(self) -> float | None:
        """Seconds from sending to the end of the reply's task."""
        return None if self.completed_at_s is None else self.completed_at_s - self.sent_at_s

    @property
    def queued(self) -> bool:
        return bool(self.queue_positions)

    @property
    def queue_moved(self) -> bool:
        """The place in the queue went down at least once (a queue that never moves is a hang)."""
        return any(later < earlier for earlier, later in zip(self.queue_positions, self.queue_positions[1:]))

    def as_dict(self) -> dict[str, Any]:
        """A flat record for JSON lines (latencies in seconds)."""
        return {
            "prompt": self.prompt, "outcome": self.outcome, "reply_s": self.reply_s,
            "first_token_s": self.first_token_s, "text_chars": len(self.text), "error": self.error,
            "queue_positions": self.queue_positions, "notes": self.notes, "sent_at_s": self.sent_at_s,
            "output_tokens": self.output_tokens, "ms_per_token": self.ms_per_token,
        }


@dataclass
class _AssistantMessage:
    text: str = ""
    streamed: bool = False


class ChatTracker:
    """Follows one chat session's events: when the chat is ready, and the reply to the message in flight.

    Feed it every socket.io event with `handle(event, data, at_s)`. Pure: no
    I/O and no clock of its own, so recorded events replay exactly.
    """

    def __init__(self, error_markers: tuple[str, ...] = ERROR_MARKERS) -> None:
        self.error_markers = error_markers
        self.ready_at_s: float | None = None
        self.disconnected_at_s: float | None = None
        self.settings_widgets: list[dict] = []
        self.startup_messages: dict[str, str] = {}
        self.other_messages: list[str] = []
        self.reply: ReplyRecord | None = None
        self.live_tap_acked = False  # the app sends this tab text as LIVE_TEXT, figures as LIVE_EVENT
        self._chat_start_task = False
        self._run_steps: set[str] = set()
        self._messages: dict[str, _AssistantMessage] = {}

    @property
    def chat_ready(self) -> bool:
        return self.ready_at_s is not None

    def start_reply(self, prompt: str, message_id: str, at_s: float) -> ReplyRecord:
        """A message was just sent: follow its reply from now on."""
        if self.reply is not None and not self.reply.done:
            raise RuntimeError("a reply is still in flight; wait for it before sending the next message")
        self.reply = ReplyRecord(prompt=prompt, message_id=message_id, sent_at_s=at_s)
        self._run_steps.clear()
        self._messages.clear()
        return self.reply

    def give_up(self, outcome: str, at_s: float) -> None:
        """End the reply in flight from the client's side ("timeout", "disconnected")."""
        if self.reply is not None and not self.reply.done:
            self._finish(at_s, outcome)

    def handle(self, event: str, data: Any, at_s: float) -> None:
        """Take one server event (`data` is its first argument)."""
        if event == "disconnect":
            self.disconnected_at_s = at_s
            self.give_up("disconnected", at_s)
        elif event == "task_start":
            if self._reply_open():
                if self.reply.task_started_at_s is None:
                    self.reply.task_started_at_s = at_s
            elif not self.chat_ready:
                self._chat_start_task = True
        elif event == "task_end":
            if self._reply_open() and self._run_steps:
                self._finish(at_s, None)
            elif not self.chat_ready and self._chat_start_task:
                self.ready_at_s = at_s
        elif event == "chat_settings" and isinstance(data, list):
            self.settings_widgets = data
        elif event in ("new_message", "update_message", "stream_start") and isinstance(data, dict):
            self._step(event, data, at_s)
        elif event == "stream_token" and isinstance(data, dict):
            self._token(data, at_s)
        elif event == LIVE_TEXT and isinstance(data, dict):
            self._live_text(data, at_s)
        elif event in ("element", LIVE_EVENT) and isinstance(data, dict):
            self._element(data)  # both carry the element's props as "props"
        elif event == LIVE_TAP_ACK:
            self.live_tap_acked = True

    # ------------------------------------------------------------ internals

    def _reply_open(self) -> bool:
        return self.reply is not None and not self.reply.done

    def _step(self, event: str, step: dict, at_s: float) -> None:
        if step.get("type") == "run":
            if self._reply_open() and step.get("name") == MESSAGE_STEP \
                    and step.get("parentId") == self.reply.message_id:
                self._run_steps.add(step["id"])
                if step.get("isError"):
                    # on_message raised: Chainlit marks its run step, and sends no message about it.
                    self.reply.error = f"on_message failed: {step.get('output') or '(no detail)'}"
            return
        if step.get("type") != "assistant_message":
            return
        output = str(step.get("output") or "")
        if not self.chat_ready:
            self.startup_messages[step["id"]] = output
        elif self._reply_open() and step.get("parentId") in self._run_steps:
            self._reply_message(event, step, output, at_s)
        elif event == "new_message":
            self.other_messages.append(output)

    def _reply_message(self, event: str, step: dict, output: str, at_s: float) -> None:
        message = self._messages.setdefault(step["id"], _AssistantMessage())
        message.text = output
        if event == "stream_start":
            message.streamed = True
            if output:
                self._first_text(at_s)
        elif event == "update_message" and message.streamed:
            self.reply.final_update_at_s = at_s
        if step.get("isError") or any(marker in output for marker in self.error_markers):
            self.reply.error = output

    def _token(self, data: dict, at_s: float) -> None:
        if not self._reply_open() or data.get("isInput"):
            return
        message = self._messages.get(str(data.get("id")))
        if message is None:  # a token for a message that is not part of this reply
            return
        token = str(data.get("token") or "")
        message.text = token if data.get("isSequence") else message.text + token
        if token:
            self._first_text(at_s)

    def _live_text(self, data: dict, at_s: float) -> None:
        """A piece of a reply's text by the live tap: the message streams as by `stream_start` and
        `stream_token`, and its final `update_message` holds the whole text all the same."""
        if not self._reply_open():
            return
        message = self._messages.get(str(data.get("for")))
        if message is None:
            return
        message.streamed = True
        text = str(data.get("text") or "")
        message.text += text
        if text:
            self._first_text(at_s)
        if isinstance(data.get("props"), dict):  # a refresh of the figures that rode with the text
            self._element({"id": data.get("id"), "props": data["props"]})

    def _element(self, element: dict) -> None:
        props = element.get("props")
        if not self._reply_open() or not isinstance(props, dict):
            return
        if props.get("state") in FINAL_STATES:
            tokens, per_token = props.get("tokens"), props.get("msPerToken")
            self.reply.output_tokens = tokens if isinstance(tokens, int) else None
            self.reply.ms_per_token = float(per_token) if isinstance(per_token, (int, float)) else None
        position = props.get("queuePosition")
        if isinstance(position, int) and position > 0:
            positions = self.reply.queue_positions
            if not positions or positions[-1] != position:
                positions.append(position)

    def _first_text(self, at_s: float) -> None:
        if self.reply.first_token_at_s is None:
            self.reply.first_token_at_s = at_s

    def _finish(self, at_s: float, outcome: str | None) -> None:
        reply = self.reply
        reply.completed_at_s = at_s if outcome is None else None
        streamed = [m.text for m in self._messages.values() if m.streamed]
        reply.text = "".join(streamed)
        reply.notes = [m.text for m in self._messages.values() if not m.streamed and m.text != reply.error]
        if outcome is None:
            outcome = "error" if reply.error else "replied" if reply.text.strip() else "empty"
        reply.outcome = outcome


def replay(events: list[dict], tracker: ChatTracker | None = None) -> tuple[ChatTracker, list[ReplyRecord]]:
    """Feed recorded `{"at_s", "event", "data"}` dicts (see `main --record`) to a tracker.

    Returns the tracker and one record per message the recording sent.
    """
    tracker = tracker or ChatTracker()
    records = []
    for entry in events:
        if entry["event"] == SENT_MESSAGE:
            step = entry["data"]["message"]
            records.append(tracker.start_reply(step["output"], step["id"], entry["at_s"]))
        else:
            tracker.handle(entry["event"], entry["data"], entry["at_s"])
    return tracker, records


# ---------------------------------------------------------------- the clients


class ChatFailed(Exception):
    """The chat could not be opened, or the socket failed, with what was seen so far."""


def _websocket_client_installed() -> bool:
    return importlib.util.find_spec("websocket") is not None


def _open_failure(what: str, tracker: ChatTracker, timeout_s: float) -> ChatFailed:
    seen = "; ".join(text.splitlines()[0] for text in tracker.startup_messages.values() if text) or "nothing"
    return ChatFailed(f"{what} within {timeout_s:.0f} s (the app showed: {seen})")


class ChainlitClient:
    """One simulated browser tab on a Chainlit app, with blocking calls.

    Works in threads and, under Locust, in gevent greenlets (Locust patches
    threading). The transport is what the browser uses: long-polling upgraded
    to a websocket, or long-polling alone where `websocket-client` is missing.
    """

    def __init__(self, base_url: str, *, language: str = "en-US", load_page: bool = True,
                 clock: Clock = time.perf_counter, record_events: bool = False,
                 user_env: dict[str, str] | None = None, http: requests.Session | None = None,
                 live_tap: bool = False) -> None:
        """`http`: the browser's cookie jar (a login's token, a proxy's route cookie) to open the chat
        with; by default a new, empty one. `live_tap`: once the chat is open, offer to take a reply's
        text and figures past Chainlit's messages and elements, as the app's page does
        (`LIVE_TAP_OFFER`), and wait for the app's answer; needs a websocket (the app sends them on
        no other transport)."""
        self.base_url = base_url.rstrip("/")
        self.http = http
        self.replica: str | None = None  # the replica the page load landed on (X-Lab-Replica), if any
        self.language = language
        self.user_env = user_env
        self.load_page = load_page
        self.live_tap = live_tap
        self.clock = clock
        self.session_id = str(uuid.uuid4())
        self.tracker = ChatTracker()
        # (at_s, event, data) of every server event and every message sent, when asked for
        # (recordings for the tests; see `replay`).
        self.events: list[tuple[float, str, Any]] | None = [] if record_events else None
        self._changed = threading.Condition()
        self._sio = None

    @property
    def transport(self) -> str | None:
        return self._sio.transport() if self._sio is not None else None

    def open_chat(self, timeout_s: float = 30.0) -> float:
        """Load the page, connect, and wait until on_chat_start has finished; return the seconds it took."""
        started = self.clock()
        http = self.http if self.http is not None else requests.Session()
        if self.load_page:
            for method, path, body in page_load_requests(self.language, self.session_id):
                response = http.request(method, self.base_url + path, json=body, timeout=timeout_s)
                response.raise_for_status()
                self.replica = response.headers.get(REPLICA_HEADER, self.replica)
        sio = socketio.Client(http_session=http, reconnection=False)
        sio.on("*", self._on_event)
        sio.on("connect", lambda: (sio.emit("connection_successful"), sio.emit("fetch_favorites")))
        sio.on("disconnect", lambda *reason: self._on_event("disconnect", *reason))
        self._sio = sio
        transports = None if _websocket_client_installed() else ["polling"]
        try:
            sio.connect(self.base_url, socketio_path=SOCKET_PATH, transports=transports,
                        headers=browser_headers(self.base_url, self.language),
                        auth=browser_auth(self.session_id, self.user_env), wait_timeout=timeout_s)
        except socketio.exceptions.ConnectionError as error:
            raise ChatFailed(f"socket.io connection to {self.base_url}{SOCKET_PATH} failed: {error}") from error
        remaining_s = timeout_s - (self.clock() - started)
        if not self._wait(lambda: self.tracker.chat_ready or self.tracker.disconnected_at_s is not None,
                          remaining_s) or not self.tracker.chat_ready:
            raise _open_failure("the chat did not start", self.tracker, timeout_s)
        if self.live_tap:
            sio.emit("window_message", LIVE_TAP_OFFER)
            if not self._wait(lambda: self.tracker.live_tap_acked, timeout_s - (self.clock() - started)):
                raise ChatFailed(f"the app did not take the live tap offer (transport {sio.transport()})")
        return self.tracker.ready_at_s - started

    def change_settings(self, timeout_s: float = 10.0, **values: object) -> str:
        """Confirm the settings panel with `values` changed; return the app's answer (its next message)."""
        return self.emit_for_message("chat_settings_change", settings_form(self.tracker.settings_widgets, **values),
                                     timeout_s)

    def emit_for_message(self, event: str, data: Any, timeout_s: float = 10.0) -> str:
        """Emit `event` with `data` as the page would (or a forger: nothing is checked here);
        return the app's next message outside a reply."""
        with self._changed:
            seen = len(self.tracker.other_messages)
        self._sio.emit(event, data)
        if not self._wait(lambda: len(self.tracker.other_messages) > seen, timeout_s):
            raise ChatFailed(f"the app did not answer {event} within {timeout_s:.0f} s")
        return self.tracker.other_messages[seen]

    def send(self, text: str, **forged: Any) -> ReplyRecord:
        """Send a message as the browser does (`forged`: step fields a script could set instead, for
        tests); the returned record fills in as the reply arrives."""
        payload = user_message(text, self.base_url + "/")
        payload["message"].update(forged)
        with self._changed:
            record = self.tracker.start_reply(text, payload["message"]["id"], self.clock())
            if self.events is not None:
                self.events.append((record.sent_at_s, SENT_MESSAGE, payload))
        try:
            self._sio.emit("client_message", payload)
        except socketio.exceptions.SocketIOError:  # the socket is gone: the message never left
            with self._changed:
                self.tracker.give_up("disconnected", self.clock())
        return record

    def wait_reply(self, timeout_s: float) -> ReplyRecord:
        """Block until the reply in flight is complete, failed, or `timeout_s` passed (outcome "timeout")."""
        record = self.tracker.reply
        if not self._wait(lambda: record.done, timeout_s - (self.clock() - record.sent_at_s)):
            with self._changed:
                self.tracker.give_up("timeout", self.clock())
        return record

    def ask(self, text: str, timeout_s: float, **forged: Any) -> ReplyRecord:
        """Send and wait for the full reply."""
        self.send(text, **forged)
        return self.wait_reply(timeout_s)

    def close(self) -> None:
        """Leave as a closed tab does (Chainlit keeps the session for `session_timeout`)."""
        if self._sio is None:
            return
        if self._sio.transport() == "polling":
            # python-engineio's polling client would wait for the server's pending long-poll
            # (up to its ping interval, ~25 s) before returning; the CLOSE packet is sent either way.
            self._sio.eio.disconnect(abort=True)
        else:
            self._sio.disconnect()

    def _on_event(self, event: str, *args: Any) -> None:
        with self._changed:
            at_s, data = self.clock(), args[0] if args else None
            if self.events is not None:
                self.events.append((at_s, event, data))
            self.tracker.handle(event, data, at_s)
            self._changed.notify_all()

    def _wait(self, condition: Callable[[], bool], timeout_s: float) -> bool:
        with self._changed:
            return self._changed.wait_for(condition, timeout=max(0.0, timeout_s))

    def __enter__(self) -> "ChainlitClient":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class AsyncChainlitClient:
    """The same tab for asyncio code (needs `aiohttp`; websocket transport, as the browser ends up on)."""

    def __init__(self, base_url: str, *, language: str = "en-US", load_page: bool = True,
                 clock: Clock = time.perf_counter) -> None:
        self.base_url = base_url.rstrip("/")
        self.language = language
        self.load_page = load_page
        self.clock = clock
        self.session_id = str(uuid.uuid4())
        self.tracker = ChatTracker()
        self._changed: asyncio.Condition | None = None
        self._sio = None
        self._http = None

    @property
    def transport(self) -> str | None:
        return self._sio.transport() if self._sio is not None else None

    async def open_chat(self, timeout_s: float = 30.0) -> float:
        import aiohttp  # only the asyncio client needs it (socketio's asyncio extra)

        started = self.clock()
        self._changed = asyncio.Condition()
        self._http = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout_s))
        if self.load_page:
            for method, path, body in page_load_requests(self.language, self.session_id):
                async with self._http.request(method, self.base_url + path, json=body) as response:
                    response.raise_for_status()
        # handle_sigint=False: else python-socketio takes over Ctrl-C for the whole program (it disconnects
        # every client, cancels every task and stops the loop); the program using this client decides.
        sio = socketio.AsyncClient(http_session=self._http, reconnection=False, handle_sigint=False)

        async def on_connect() -> None:
            await sio.emit("connection_successful")
            await sio.emit("fetch_favorites")

        async def on_disconnect(*reason: object) -> None:
            await self._on_event("disconnect", *reason)

        sio.on("*", self._on_event)
        sio.on("connect", on_connect)
        sio.on("disconnect", on_disconnect)
        self._sio = sio
        try:
            await sio.connect(self.base_url, socketio_path=SOCKET_PATH,
                              headers=browser_headers(self.base_url, self.language),
                              auth=browser_auth(self.session_id), wait_timeout=timeout_s)
        except socketio.exceptions.ConnectionError as error:
            raise ChatFailed(f"socket.io connection to {self.base_url}{SOCKET_PATH} failed: {error}") from error
        remaining_s = timeout_s - (self.clock() - started)
        if not await self._wait(lambda: self.tracker.chat_ready or self.tracker.disconnected_at_s is not None,
                                remaining_s) or not self.tracker.chat_ready:
            raise _open_failure("the chat did not start", self.tracker, timeout_s)
        return self.tracker.ready_at_s - started

    async def ask(self, text: str, timeout_s: float) -> ReplyRecord:
        """Send a message as the browser does and wait for the full reply (outcome "timeout" if it does not come)."""
        payload = user_message(text, self.base_url + "/")
        record = self.tracker.start_reply(text, payload["message"]["id"], self.clock())
        await self._sio.emit("client_message", payload)
        if not await self._wait(lambda: record.done, timeout_s):
            self.tracker.give_up("timeout", self.clock())
        return record

    async def close(self) -> None:
        if self._sio is not None:
            await self._sio.disconnect()
        if self._http is not None:
            await self._http.close()

    async def _on_event(self, event: str, *args: Any) -> None:
        async with self._changed:
            self.tracker.handle(event, args[0] if args else None, self.clock())
            self._changed.notify_all()

    async def _wait(self, condition: Callable[[], bool], timeout_s: float) -> bool:
        try:
            async with self._changed:
                await asyncio.wait_for(self._changed.wait_for(condition), timeout=max(0.0, timeout_s))
            return True
        except asyncio.TimeoutError:
            return False


def main(argv: list[str] | None = None) -> None:
    """`python -m load.chainlit_client URL -m TEXT [-m TEXT ...] [--record FILE]`: one chat, printed."""
    import argparse

    parser = argparse.ArgumentParser(description="Open one chat on a Chainlit app and send messages.")
    parser.add_argument("url", help="the app, e.g. http://127.0.0.1:8000 (loopback)")
    parser.add_argument("-m", "--message", action="append", required=True, help="a message to send (repeatable)")
    parser.add_argument("--timeout-s", type=float, default=120.0, help="per reply")
    parser.add_argument("--language", default="en-US")
    parser.add_argument("--record", help="write every server event as JSON to this file (test recordings)")
    args = parser.parse_args(argv)
    with ChainlitClient(args.url, language=args.language, record_events=bool(args.record)) as client:
        print(f"chat ready in {client.open_chat():.2f} s over {client.transport}")
        for text in args.message:
            record = client.ask(text, args.timeout_s)
            first = "-" if record.first_token_s is None else f"{record.first_token_s:.2f} s"
            total = "-" if record.reply_s is None else f"{record.reply_s:.2f} s"
            print(f"{record.outcome}: first text {first}, complete {total}, queue {record.queue_positions}")
            print(f"  {(record.error or record.text)[:300]!r}")
    if args.record:
        start = client.events[0][0] if client.events else 0.0
        with open(args.record, "w", encoding="utf-8") as out:
            json.dump([{"at_s": round(at - start, 4), "event": event, "data": data}
                       for at, event, data in client.events], out, ensure_ascii=False, indent=1)
        print(f"{len(client.events)} events written to {args.record}")


if __name__ == "__main__":
    main()
