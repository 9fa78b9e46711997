"""A request on a kept-alive connection the server closed under it is sent once more (backends/keepalive.py).

The server here is a few lines of asyncio on loopback that answers the first request of a connection
and closes the connection, unanswered, when a second request comes on it: the race llama-server's
cpp-httplib lost once in CI. The control is httpx2's own transport, which fails there.
"""

from __future__ import annotations

import asyncio
import time

import httpx2
import pytest

from backends import offloop
from backends.keepalive import RetryClosedKeepAlive

BODY = b'{"ok": true}'


class ClosingServer:
    """Answers the first `answered` requests of each connection, then closes it on the next one."""

    def __init__(self, answered: int) -> None:
        self.answered = answered
        self.connections = 0
        self.requests = 0
        self.closed_at: list[float] = []
        self._server: asyncio.base_events.Server | None = None

    async def __aenter__(self) -> str:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return f"http://127.0.0.1:{self._server.sockets[0].getsockname()[1]}"

    async def __aexit__(self, *exc) -> None:
        self._server.close()
        await self._server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        seen = 0
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = next((int(line.split(b":", 1)[1]) for line in head.split(b"\r\n")
                               if line.lower().startswith(b"content-length:")), 0)
                await reader.readexactly(length)
                self.requests += 1
                seen += 1
                if seen > self.answered:
                    self.closed_at.append(time.perf_counter())
                    return
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
                             % (len(BODY), BODY))
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            return
        finally:
            writer.close()


async def two_posts(transport: httpx2.AsyncBaseTransport, url: str, **client: object) -> list[int]:
    async with httpx2.AsyncClient(transport=transport, **client) as http:
        return [(await http.post(url + "/v1/chat/completions", json={"n": n})).status_code for n in (1, 2)]


def test_a_request_on_a_kept_alive_connection_closed_under_it_is_sent_again():
    async def main():
        server = ClosingServer(answered=1)
        async with server as url:
            statuses = await two_posts(RetryClosedKeepAlive(), url)
        return statuses, server

    statuses, server = asyncio.run(main())
    assert statuses == [200, 200]
    # The second request went out twice: on the kept connection (closed unanswered), then on a new one.
    assert (server.connections, server.requests) == (2, 3)


def test_control_httpx_alone_fails_there():
    async def main():
        async with ClosingServer(answered=1) as url:
            await two_posts(httpx2.AsyncHTTPTransport(), url)

    with pytest.raises(httpx2.RemoteProtocolError, match="without sending a response"):
        asyncio.run(main())


def test_a_new_connection_closed_unanswered_is_not_sent_again():
    # Not the keep-alive race: the server took the request on a connection of its own and gave no
    # answer. Sending it again could run it twice.
    async def main():
        server = ClosingServer(answered=0)
        async with server as url:
            with pytest.raises(httpx2.RemoteProtocolError):
                await two_posts(RetryClosedKeepAlive(), url)
        return server

    server = asyncio.run(main())
    assert (server.connections, server.requests) == (1, 1)


def test_the_request_clock_starts_again_with_the_retry():
    async def main():
        server = ClosingServer(answered=1)
        sent: list[float] = []
        async with server as url:
            async with httpx2.AsyncClient(transport=RetryClosedKeepAlive(),
                                          event_hooks={"request": [offloop.trace_requests]}) as http:
                await http.post(url + "/v1/chat/completions", json={"n": 1})

                async def second() -> None:
                    offloop._request_sent.set(sent)  # as the pump of a stream sets it (backends/offloop.py)
                    await http.post(url + "/v1/chat/completions", json={"n": 2})

                await asyncio.create_task(second())
        return sent, server.closed_at

    sent, closed_at = asyncio.run(main())
    assert len(sent) == 1 and len(closed_at) == 1
    # The stamp is the retry's: taken after the server had closed the first try's connection.
    assert sent[0] > closed_at[0], (sent, closed_at)
