"""One more try for a request sent on a kept-alive connection the server had just closed.

A pooled connection can be closed by the server at the moment it is reused: the request goes out on
a socket the server is shutting, and the answer is no answer at all ("Server disconnected without
sending a response"). The pool's expiry (openai_compat.POOL_LIMITS: 3 s, under uvicorn's and
cpp-httplib's 5 s) makes that rare, not impossible: llama-server closed one between two requests of
`python -m bench` (one failed request in a clean-clone CI run). Browsers send such a request again
on a new connection; so does this transport, once, and only when the connection was a reused one
and nothing at all came back (the server never read the request as one it would answer).

The retry starts the request's clock again (backends/offloop.py stamps when a request left): the
failed try, a millisecond or so, is not the engine's time to first token.
"""

from __future__ import annotations

from typing import Any

import httpx2

from backends.offloop import restart_request_clock

NO_RESPONSE = "without sending a response"


class RetryClosedKeepAlive(httpx2.AsyncHTTPTransport):
    """httpx2's transport (same pool and limits), with the one retry described above."""

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        new_connection = _watch_connects(request)
        try:
            return await super().handle_async_request(request)
        except httpx2.RemoteProtocolError as error:
            if new_connection() or NO_RESPONSE not in str(error):
                raise
        restart_request_clock()
        return await super().handle_async_request(request)


def _watch_connects(request: httpx2.Request):
    """Note, through the request's trace (kept: offloop's stamps use it too), whether it opened a new
    connection; returns the question."""
    opened: list[bool] = []
    traced = request.extensions.get("trace")

    async def trace(event: str, info: dict[str, Any]) -> None:
        if event.startswith("connection.connect_tcp") or event.startswith("connection.connect_unix_socket"):
            opened.append(True)
        if traced is not None:
            await traced(event, info)

    request.extensions["trace"] = trace
    return lambda: bool(opened)
