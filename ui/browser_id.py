"""A browser's own id, for the blind rule without login (core/disclosure.py: whose rule a session follows).

With login a person is their user name, on every tab, chat and replica. Without login there is no
person to name, and Chainlit 2.12 has no identity of its own wider than a tab (its `sessionId`
lives in the tab). So every answer of the app to a browser without one sets a cookie
`lab_browser`: 18 random bytes from `secrets`, HttpOnly (no script of the page reads it),
SameSite=Lax, a year long, Secure on https. The socket.io connection of each tab sends it (its
handshake is an HTTP request to the same origin), and Chainlit keeps that request's headers with
the session (`session.environ`), where `browser_id` finds it.

It is not signed, on purpose: the server draws it and nothing is granted by it. Signing would only
stop a client from choosing its own id, and a chosen id gains nothing - a fresh id is what a
private window gets anyway, and another browser's id (which is never shown) would only make its
views wait as well. The database keeps a digest of it, never the id itself
(`core.disclosure.person_key`). What it cannot do: tell two browsers of one student apart from two
students; a script that drops its cookies is a new browser every time (docs/deploying/classroom.md, "Blind is per
person": with login off, per browser is all that is promised).
"""

from __future__ import annotations

import re
import secrets
from http.cookies import CookieError, SimpleCookie

COOKIE = "lab_browser"
MAX_AGE_S = 365 * 24 * 3600
_VALID = re.compile(r"^[A-Za-z0-9_-]{16,64}$")


def browser_id(cookie_header: str | None) -> str | None:
    """The browser's id from a Cookie header, or None when it carries none (or a malformed one)."""
    if not cookie_header:
        return None
    try:
        cookies = SimpleCookie(cookie_header)
    except CookieError:  # a header no browser of ours sent: no id
        return None
    morsel = cookies.get(COOKIE)
    value = morsel.value if morsel is not None else None
    return value if value and _VALID.match(value) else None


class BrowserId:
    """ASGI middleware: every HTTP answer to a request without a valid `lab_browser` cookie sets one."""

    def __init__(self, app, root_path: str = "/") -> None:
        self.app = app
        self.path = root_path or "/"

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers") or [])
        cookie = headers.get(b"cookie", b"").decode("latin-1")
        if browser_id(cookie) is not None:
            await self.app(scope, receive, send)
            return
        secure = "; Secure" if scope.get("scheme") == "https" else ""
        value = (f"{COOKIE}={secrets.token_urlsafe(18)}; Path={self.path}; Max-Age={MAX_AGE_S}; "
                 f"HttpOnly; SameSite=Lax{secure}").encode("latin-1")

        async def send_with_cookie(message) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", []), (b"set-cookie", value)]}
            await send(message)

        await self.app(scope, receive, send_with_cookie)
