"""Logging out and signing out that hold: a token that logged out, or whose person a teacher signed
out, works nowhere any more, on any replica (core/revocations.py keeps them).

- `SignedOutTokens`, ASGI middleware on Chainlit's app (app.py adds it with login on), looks at
  the token a request shows, as Chainlit reads it: the `access_token` cookie, else a bearer
  header. A revoked one is taken out of the request (cookie and bearer header both) and the
  answer deletes the cookie: every route that needs a login answers 401, as for no token at all,
  while the page and the login form still load, so the person can log in again (a 401 on the
  page itself would keep them off the login form until the cookie expires). The chat socket is
  refused outright: 401 on long-polling, a websocket closed before it opens.
- `install` makes `POST /logout` revoke the token it came with.
- `/sign_out NAME` and `/sign_out all` (`sign_out_command`, teachers only): every token of that
  person, or of every user but the teacher who asks, issued until now.
- Open chat sockets of a revoked token are closed: at once on this replica, within
  `REFRESH_S` seconds on the others.

Signing out changes no password: whoever knows it logs in again (change it in AUTH_USERS).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os

import chainlit as cl
from chainlit.auth import reuseable_oauth
from chainlit.auth.cookie import _auth_cookie_name as AUTH_COOKIE  # what Chainlit names it (CHAINLIT_AUTH_COOKIE_NAME)
from chainlit.auth.cookie import get_token_from_cookies
from starlette.requests import cookie_parser

from config import ConfigurationError
from core.auth import AuthConfig
from core.revocations import REFRESH_S, Revocations
from core.texts import text
from store.db import create_engine
from store.revocations import RevocationTable
from store.urls import database_url
from ui.session_view import app_state, current_user, lang, say

log = logging.getLogger(__name__)

_revocations: Revocations | None = None  # this process's, once `install` ran


def revocations_from_env() -> Revocations:
    """The revocations kept in the app's database (DATABASE_URL), or in this process when it is unusable."""
    secret = os.environ["CHAINLIT_AUTH_SECRET"]
    try:
        url = database_url()
    except ConfigurationError as error:  # the app logs it too, and runs without storage
        log.error("revoked login tokens kept in this process only (DATABASE_URL unusable: %s)", error)
        return Revocations(secret)
    return Revocations(secret, RevocationTable(create_engine(url)))


def install(auth: AuthConfig, revocations: Revocations | None = None) -> Revocations:
    """`POST /logout` revokes its token; open sockets of revoked tokens are closed. Returns the
    revocations, for `SignedOutTokens`."""
    global _revocations
    revocations = revocations or revocations_from_env()
    revocations.on_change = lambda: close_revoked_sockets(revocations)
    _revocations = revocations

    @cl.on_logout
    async def revoke_on_logout(request, response) -> dict:
        token = await reuseable_oauth(request)
        if token and await revocations.log_out(token) is not None:
            await close_revoked_sockets(revocations)
        return {"success": True}

    return revocations


# ---------------------------------------------------------------- the middleware


def token_of(headers: list[tuple[bytes, bytes]]) -> str | None:
    """The token Chainlit would read from these headers: the cookie, else a bearer header."""
    cookie = _header(headers, b"cookie")
    if cookie and AUTH_COOKIE.encode() in cookie:
        token = get_token_from_cookies(cookie_parser(cookie.decode("latin-1")))
        if token:
            return token
    authorization = _header(headers, b"authorization")
    if authorization:
        scheme, _, token = authorization.decode("latin-1").partition(" ")
        if scheme.lower() == "bearer" and token.strip():
            return token.strip()
    return None


def _header(headers: list[tuple[bytes, bytes]], name: bytes) -> bytes | None:
    return next((value for key, value in headers if key == name), None)


def one_cookie_header(headers: list[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
    """The headers with every Cookie header joined into one, so every reader sees the same cookies
    (Starlette reads them all, engine.io joins them with commas)."""
    cookies = [value for key, value in headers if key == b"cookie"]
    if len(cookies) <= 1:
        return headers
    return [(b"cookie", b"; ".join(cookies)), *((key, value) for key, value in headers if key != b"cookie")]


def without_token(headers: list[tuple[bytes, bytes]]) -> tuple[list[tuple[bytes, bytes]], list[str]]:
    """The headers without the login cookie (and its chunks) and the Authorization header, and
    the names of the cookies taken out."""
    kept, removed = [], []
    for key, value in headers:
        if key == b"authorization":
            continue
        if key == b"cookie":
            pairs = [pair.strip() for pair in value.decode("latin-1").split(";") if pair.strip()]
            removed += [pair.partition("=")[0].strip() for pair in pairs
                        if pair.partition("=")[0].strip().startswith(AUTH_COOKIE)]
            pairs = [pair for pair in pairs if not pair.partition("=")[0].strip().startswith(AUTH_COOKIE)]
            if not pairs:
                continue
            value = "; ".join(pairs).encode("latin-1")
        kept.append((key, value))
    return kept, removed


class SignedOutTokens:
    """ASGI middleware: a revoked login token is served as no token, and refused on the chat socket."""

    def __init__(self, app, revocations: Revocations, root_path: str = "") -> None:
        self.app = app
        self.revocations = revocations
        self.socket_path = f"{root_path.rstrip('/')}/ws/socket.io"

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        headers = scope.get("headers") or []
        joined = one_cookie_header(headers)
        if joined is not headers:
            scope = {**scope, "headers": joined}
        token = token_of(joined)
        if token is None:
            await self.app(scope, receive, send)
            return
        await self.revocations.ready()
        if not self.revocations.revoked(token):
            await self.app(scope, receive, send)
            return
        kept, removed = without_token(joined)
        if scope["path"].startswith(self.socket_path):
            await refuse(scope, _deleting(removed, send))
            return
        await self.app({**scope, "headers": kept}, receive, _deleting(removed, send))


async def refuse(scope, send) -> None:
    """The chat socket of a revoked token: 401 (long-polling), or the websocket closed before it opens."""
    if scope["type"] == "websocket":
        await send({"type": "websocket.close", "code": 1008, "reason": "signed out"})
        return
    body = json.dumps({"detail": "signed out: log in again"}).encode()
    await send({"type": "http.response.start", "status": 401,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})


def _deleting(names: list[str], send):
    """`send`, with the answer deleting these cookies (the browser forgets the revoked token)."""
    deletions = [(b"set-cookie", f"{name}=; Max-Age=0; Path=/; HttpOnly; SameSite=lax".encode("latin-1"))
                 for name in names]

    async def send_deleting(message) -> None:
        if message["type"] == "http.response.start" and deletions:
            message = {**message, "headers": [*message.get("headers", []), *deletions]}
        await send(message)

    return send_deleting


# ---------------------------------------------------------------- open sockets


def _session_token(session) -> str | None:
    """The token of a chat session's current connection (its cookie then), else the one it started with."""
    cookie = (getattr(session, "environ", None) or {}).get("HTTP_COOKIE")
    token = get_token_from_cookies(cookie_parser(cookie)) if cookie else None
    return token or session.token


async def close_revoked_sockets(revocations: Revocations) -> int:
    """Disconnect (and forget, so no tab can take it over) every chat session of this process whose
    token is revoked; how many."""
    from chainlit.server import sio
    from chainlit.session import ws_sessions_sid

    closed = 0
    for session in list(ws_sessions_sid.values()):
        token = _session_token(session)
        if token and revocations.revoked(token):
            session.to_clear = True
            # In a task of its own: Chainlit's disconnect handler points the context at the closed
            # session, and a teacher's /sign_out must still answer in the teacher's chat.
            await asyncio.create_task(sio.disconnect(session.socket_id))
            closed += 1
    return closed


# ---------------------------------------------------------------- the teacher's command


def _who(argument: str, auth: AuthConfig, asker: str | None) -> list[str] | None:
    """The names `/sign_out ARGUMENT` means: one user, or every user but the asker ("all"); None: no such user."""
    if argument == "all":
        return [name for name in auth.users if name != asker]
    return [argument] if auth.knows(argument) else None


async def sign_out_command(arguments: str) -> None:
    """/sign_out NAME or /sign_out all: a teacher ends those people's logins everywhere."""
    auth, asker, lang_code = app_state().auth, current_user(), lang()
    if not auth.is_teacher(asker):  # before anything else is said, even whether a name exists
        await say(text("sign_out_teachers_only", lang_code))
        return
    if not auth.enabled or _revocations is None:
        await say(text("sign_out_no_login", lang_code))
        return
    argument = arguments.strip()
    names = _who(argument, auth, asker) if argument else None
    if names is None:
        key = "sign_out_unknown" if argument else "sign_out_usage"
        await say(text(key, lang_code, name=argument[:60]))
        return
    saved = await _revocations.sign_out(names)
    closed = await close_revoked_sockets(_revocations)
    who = text("sign_out_everyone", lang_code, people=len(names)) if argument == "all" else f"**{argument}**"
    answer = text("sign_out_done", lang_code, who=who, closed=closed, seconds=f"{REFRESH_S:g}")
    if not saved:
        answer += "\n\n" + text("sign_out_not_shared", lang_code, problem=_revocations.problem or "no database")
    await say(answer)
