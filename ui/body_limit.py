"""Request bodies over LAB_MAX_BODY_MB (default 8, in MiB) get HTTP 413 before they are read.

`BodyLimit`, ASGI middleware outside every other of the app (app.py adds it last): a
Content-Length over the limit is answered 413 at once, the app never called and not a byte of
the body read; a body without one (chunked) is counted as it arrives, and once it is over the
limit the client gets 413 and the app is told the client left (`http.disconnect`), so nothing
holds more than the limit in memory. It covers every route: Chainlit's file upload, the login
form, and the chat socket's long-polling POSTs.

Not FastAPI's own `max_body_size`: that one raises inside the app when the count is over, and
engine.io catches every error of a POST and answers 200 "ok"; and it answers a declared length
only once the app reads.

The limit leaves room for the biggest message the socket takes (ui/socket_guard.py,
MAX_SOCKET_MESSAGE: 4,000,000 bytes, a 1 MB paste of Chinese text over long-polling), so it
cannot be set below 4 MiB.
"""

from __future__ import annotations

import json
import math
import os
from typing import Mapping

from config import ConfigurationError
from ui.socket_guard import MAX_SOCKET_MESSAGE

VARIABLE = "LAB_MAX_BODY_MB"
MIB = 1024 * 1024
DEFAULT_MAX_BODY_MB = 8
MIN_MAX_BODY_MB = math.ceil(MAX_SOCKET_MESSAGE / MIB)


def max_body_bytes(env: Mapping[str, str] = os.environ) -> int:
    """LAB_MAX_BODY_MB in bytes; a value that cannot work names the variable and the bound."""
    raw = (env.get(VARIABLE) or "").strip()
    if not raw:
        return DEFAULT_MAX_BODY_MB * MIB
    if not raw.isdigit() or int(raw) < MIN_MAX_BODY_MB:
        raise ConfigurationError(
            f"{VARIABLE}={raw!r}: give a whole number of MiB of at least {MIN_MAX_BODY_MB} (the chat socket takes "
            f"messages of up to {MAX_SOCKET_MESSAGE:,} bytes), or leave it empty for {DEFAULT_MAX_BODY_MB}.")
    return int(raw) * MIB


def declared_length(headers: list[tuple[bytes, bytes]]) -> int | None:
    """The Content-Length a request declares (None: none, or not a number)."""
    value = next((value for key, value in headers if key == b"content-length"), None)
    return int(value) if value is not None and value.strip().isdigit() else None


class BodyLimit:
    """ASGI middleware: 413 for a request body over `max_bytes`, declared or counted."""

    def __init__(self, app, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes
        detail = f"the request body is over {max_bytes // MIB} MiB ({VARIABLE})"
        self.body = json.dumps({"detail": detail}).encode()

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = declared_length(scope.get("headers") or [])
        if declared is not None and declared > self.max_bytes:
            await self.too_large(send)
            return
        await self.app(scope, *self._counting(receive, send))

    def _counting(self, receive, send):
        received, answered, started = 0, False, False

        async def counted_receive():
            nonlocal received, answered
            if answered:
                return {"type": "http.disconnect"}
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_bytes:
                    answered = True
                    if not started:
                        await self.too_large(send)
                    return {"type": "http.disconnect"}
            return message

        async def guarded_send(message) -> None:
            nonlocal started
            if answered:
                return  # the client has its 413; what the app says after is dropped
            started = started or message["type"] == "http.response.start"
            await send(message)

        return counted_receive, guarded_send

    async def too_large(self, send) -> None:
        await send({"type": "http.response.start", "status": 413,
                    "headers": [(b"content-type", b"application/json"), (b"connection", b"close"),
                                (b"content-length", str(len(self.body)).encode())]})
        await send({"type": "http.response.body", "body": self.body})
