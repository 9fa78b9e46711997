"""Two limits on Chainlit's chat socket that Chainlit 2.12 leaves open or sets where the app cannot
answer: which web pages may open it, and how big one message on it may be.

Origins. Chainlit gives `.chainlit/config.toml` `[project] allow_origins` to
Starlette's CORSMiddleware only, which decides what other web pages may *read*
from the REST routes and blocks nothing else (a same-origin page needs no
entry, on any port). Its socket.io server is created with
`cors_allowed_origins=[]` (chainlit/server.py), which turns engine.io's origin
check off: any web page the person visits could open a chat socket to the app
in their browser and chat through it (with their login cookie where the
browser sends it, e.g. from another port of the same host). The guard gives
engine.io a check: a browser's socket must come from the page's own host (the
Host header, or X-Forwarded-Host behind a proxy), or from a listed origin;
`"*"` allows every origin (Chainlit's own behaviour). Clients that send no
Origin (scripts, load tests) are not browsers and are not affected.

Size. engine.io drops the connection on a message over 1,000,000 characters
(a pasted 1 MB text, a 1 MB custom system prompt): the browser reconnects and
the message shows in the chat with no answer at all. Uvicorn already reads
websocket messages of up to 16 MiB whole before engine.io looks at them, so
the guard lets engine.io pass up to `MAX_SOCKET_MESSAGE` to the app, whose own
limits (core.input, core.settings) then refuse with a message that says why.

Content. Chainlit stores a typed message's step as the page sent it, before the
app's handler sees it (and `edit_message` rewrites any message of the session,
editing off or not): the raw text, up to the size above, and any value a page
or a script puts in its fields. The guard checks the step where it arrives
(`core.input.check_client_step`): every field Chainlit reads typed and bounded,
the rest dropped, a text over the limit (or not text) never stored; the handler
then says why it was refused. `edit_message` is dropped while editing is off,
and checked the same way when it is on. A settings change keeps only the panel's
fields: Chainlit stores every key it gets in the session before the app sees it.

Patience. engine.io closes a socket whose page has not answered its ping within
20 s. A page answers from its main thread, and a browser drawing a big message
holds that thread: pasting and sending 1.1 MB kept chromium busy for 44 s on
a loaded 2-core machine. The server then closed the socket, the message the page
sent as it woke went nowhere, and the page reconnected showing it with no answer
(the flaky oversized-paste browser test). The guard waits `PING_TIMEOUT_S` for
the answer; the page learns the value at the handshake and waits as long for
the server's pings. A closed tab still ends its socket at once (its connection
closes); only a vanished network is noticed later, and Chainlit keeps a
dropped session for its session_timeout (600 s) anyway.
"""

from __future__ import annotations

import asyncio
import logging
import os
from typing import Any, Callable, Mapping, Sequence
from urllib.parse import urlsplit

import socketio

from core.fair_share import Share, ShareLimits
from core.input import check_client_step, check_message
from core.settings import DROPPED_FIELDS, MAX_DROPPED_NAMES
from core.texts import language_of, text
from ui.settings_panel import PANEL_FIELDS

log = logging.getLogger(__name__)

# Characters of one websocket message (bytes of one long-polling POST): room for a 1 MB paste
# even of Chinese text sent as 3-byte UTF-8 over polling, still under uvicorn's 16 MiB frame cap.
MAX_SOCKET_MESSAGE = 4_000_000
# Seconds a page may take to answer a ping (engine.io's default is 20): a browser busy drawing a
# message of up to MAX_SOCKET_MESSAGE characters keeps its socket. 1.1 MB took 44 s under load.
PING_TIMEOUT_S = 180
# Seconds a chat whose socket closed keeps its reply: a page that reconnects within this long (a
# network blip, a restarted Wi-Fi) keeps it; a closed tab's reply is cancelled, its queued work dropped.
CLOSED_CHAT_GRACE_S = 5.0


def origin_allowed(origin: str | None, hosts: Sequence[str], listed: Sequence[str]) -> bool:
    """May a browser page at `origin` open the socket of the app reached as one of `hosts`?

    A browser sends one Origin; a script's websocket library may add its own to one it was
    given, and the server sees them joined by commas: then every one must be allowed."""
    if not origin:
        return True
    if "*" in listed:
        return True
    return all(_one_origin_allowed(part.strip(), hosts, listed) for part in origin.split(","))


def _one_origin_allowed(origin: str, hosts: Sequence[str], listed: Sequence[str]) -> bool:
    if origin in listed:
        return True
    # The scheme is not compared: behind TLS without X-Forwarded-Proto the app cannot know it,
    # and a page on the same host and port is the app's own page.
    page_host = urlsplit(origin).netloc.lower()
    return bool(page_host) and any(page_host == host.strip().lower() for host in hosts if host)


def request_hosts(environ: Mapping[str, str]) -> list[str]:
    """The host the browser asked for: Host, and the first X-Forwarded-Host a proxy added."""
    hosts = [environ.get("HTTP_HOST", "")]
    forwarded = environ.get("HTTP_X_FORWARDED_HOST")
    if forwarded:
        hosts.append(forwarded.split(",")[0])
    return hosts


def guard_socket(max_message: int = MAX_SOCKET_MESSAGE, ping_timeout_s: float = PING_TIMEOUT_S, *,
                 is_teacher: Callable[[str], bool] = lambda _: False) -> None:
    """Make Chainlit's socket.io server check each browser connection's Origin, pass messages of up
    to `max_message` to the app and wait `ping_timeout_s` for a busy page (see the module docstring).
    Called before the first connection: each one takes the ping timeout at its handshake."""
    from chainlit.config import config
    from chainlit.server import sio

    listed = tuple(config.project.allow_origins)

    def allowed(origin: str | None, environ: Mapping[str, str]) -> bool:
        return origin_allowed(origin, request_hosts(environ), listed)

    sio.eio.cors_allowed_origins = allowed
    sio.eio.max_http_buffer_size = max_message
    sio.eio.ping_timeout = ping_timeout_s
    handlers = sio.handlers["/"]
    share = Share(ShareLimits.from_env(os.environ))

    def capped(session) -> str | None:
        """Whose caps a session counts against: a student's login. None with login off (nothing tells
        people apart that a script cannot change) and for a teacher (who runs the room's demos)."""
        identifier = getattr(getattr(session, "user", None), "identifier", None)
        return identifier if isinstance(identifier, str) and not is_teacher(identifier) else None

    handlers["connect"] = _shared_connect(handlers["connect"], share, capped)
    handlers["disconnect"] = _shared_disconnect(handlers["disconnect"], share)
    # Checked first: what is not a message never counts as a reply in flight.
    handlers["client_message"] = _checked_message(_one_reply_at_a_time(handlers["client_message"], share, capped))
    handlers["edit_message"] = _checked_edit(handlers["edit_message"], lambda: config.features.edit_message)
    for event in ("chat_settings_change", "chat_settings_edit"):
        handlers[event] = _panel_fields_only(handlers[event])


def checked_payload(payload: Any) -> dict | None:
    """A `client_message` payload as Chainlit may store and handle it, or None (not a message)."""
    if not isinstance(payload, dict):
        return None
    checked = check_client_step(payload.get("message"))
    if checked.step is None:
        return None
    references = payload.get("fileReferences")
    return {"message": checked.step, "fileReferences": references if isinstance(references, list) else None}


def _checked_message(handler):
    async def client_message(sid, payload):
        checked = checked_payload(payload)
        if checked is None:
            log.warning("a client_message that is not a message was dropped (session socket %s)", sid)
            return None
        return await handler(sid, checked)

    return client_message


def _checked_edit(handler, editing_on):
    async def edit_message(sid, payload):
        message = payload.get("message") if isinstance(payload, dict) else None
        if not editing_on() or not isinstance(message, dict) or not isinstance(message.get("id"), str) \
                or check_message(message.get("output")).refused:
            log.warning("an edit_message was dropped (editing is off, or not a valid edit)")
            return None
        return await handler(sid, {"message": {"id": message["id"], "output": message["output"]}})

    return edit_message


def panel_values(settings: Any) -> dict:
    """What a settings change may keep in the session: the panel's own fields, and the names (only,
    a few, shortened) of any others, for the app to say they were refused."""
    if not isinstance(settings, dict):
        return {}
    kept = {key: value for key, value in settings.items() if key in PANEL_FIELDS}
    others = [str(key)[:40] for key in settings if key not in PANEL_FIELDS]
    if others:
        kept[DROPPED_FIELDS] = sorted(others)[:MAX_DROPPED_NAMES]
    return kept


def _panel_fields_only(handler):
    async def settings_change(sid, settings):
        kept = panel_values(settings)
        if DROPPED_FIELDS in kept:
            log.warning("a settings change named field(s) the panel does not have; their values were dropped")
        return await handler(sid, kept)

    return settings_change


# A fair share (core.fair_share) ------------------------------------------------------------------

def _language(session) -> str:
    return language_of(getattr(session, "language", None))


def _shared_connect(handler, share: Share, capped):
    async def connect(sid, environ, auth):
        from chainlit.session import WebsocketSession

        accepted = await handler(sid, environ, auth)
        session = WebsocketSession.get(sid)
        person = capped(session)
        if session is None or person is None:
            return accepted
        if not share.may_open(person):
            log.warning("a chat socket over the cap of %d per person was refused", share.limits.chats_per_person)
            if not session.restored:
                await session.delete()
            # socket.io's own error: its message reaches the page (the built-in one arrives as "refused").
            raise socketio.exceptions.ConnectionRefusedError(text("share_chats_per_person", _language(session),
                                                                  count=share.limits.chats_per_person))
        share.opened(person, sid)
        return accepted

    return connect


def _shared_disconnect(handler, share: Share):
    async def disconnect(sid, reason=None):
        from chainlit.session import WebsocketSession

        share.closed(sid)
        session = WebsocketSession.get(sid)
        result = await handler(sid)
        if session is not None:
            asyncio.get_running_loop().call_later(CLOSED_CHAT_GRACE_S, _cancel_if_closed, session, sid)
        return result

    return disconnect


def _cancel_if_closed(session, sid: str) -> None:
    """The chat's socket closed and did not come back: its reply (or command) in flight ends."""
    task = _replying.get(session.id)
    if session.socket_id == sid and task is not None and not task.done():
        log.info("a reply whose chat was closed was cancelled")
        task.cancel()


_replying: dict[str, asyncio.Task] = {}  # chat (session id) -> its reply's task, while in flight


def _one_reply_at_a_time(handler, share: Share, capped):
    async def client_message(sid, payload):
        from chainlit.session import WebsocketSession

        session = WebsocketSession.get(sid)
        if session is None:
            return await handler(sid, payload)
        chat, person = session.id, capped(session)
        running = _replying.get(chat)
        refusal = "share_one_reply_per_chat" if running is not None and not running.done() else None
        if refusal is None and person is not None:
            refusal = share.refusal(person, chat)
        if refusal is not None:
            await _tell(session, text(refusal, _language(session), count=share.limits.replies_per_person))
            return None
        result = await handler(sid, payload)
        task = session.current_task
        if task is not None and not task.done():
            _replying[chat] = task
            if person is not None:
                share.started(person, chat)

            def ended(_: asyncio.Task) -> None:
                if _replying.get(chat) is task:
                    del _replying[chat]
                if person is not None:
                    share.ended(person, chat)

            task.add_done_callback(ended)
        return result

    return client_message


async def _tell(session, content: str) -> None:
    """A message from the app in the session's chat (outside any reply)."""
    from chainlit.context import init_ws_context

    from ui.session_view import say

    init_ws_context(session)
    await say(content)
