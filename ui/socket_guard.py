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

from typing import Mapping, Sequence
from urllib.parse import urlsplit

# Characters of one websocket message (bytes of one long-polling POST): room for a 1 MB paste
# even of Chinese text sent as 3-byte UTF-8 over polling, still under uvicorn's 16 MiB frame cap.
MAX_SOCKET_MESSAGE = 4_000_000
# Seconds a page may take to answer a ping (engine.io's default is 20): a browser busy drawing a
# message of up to MAX_SOCKET_MESSAGE characters keeps its socket. 1.1 MB took 44 s under load.
PING_TIMEOUT_S = 180


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


def guard_socket(max_message: int = MAX_SOCKET_MESSAGE, ping_timeout_s: float = PING_TIMEOUT_S) -> None:
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
