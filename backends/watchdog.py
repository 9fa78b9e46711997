"""One watchdog around every backend's stream: first-token and stall limits.

`watched(backend, request)` is the stream the chat (`core.replies.ReplyPlan`)
and the load engine (`core.load.runner`) both measure, so a reply that never
starts or stops in the middle ends the same way everywhere, with a
`BackendTimeout` that says which limit fired, its value and the variable
that sets it:

- first token: from the first iteration (the request leaves) to the first
  chunk that carries a token (text, or a counted token whose text the server
  holds back: `core.timing`'s TTFT). Empty server events (an OpenAI role
  chunk) do not stop this clock. The embedded model's own queue does not
  count: while a chunk says the request waits behind others
  (`queue_position` > 0) there is no limit (the reply ahead is watched by
  its own watchdog, so the queue moves), and its turn (`queue_position` 0)
  starts the count afresh.
- stall: once tokens flow, the longest wait for the next chunk of any kind.

Transport limits (connecting, the read timeout) stay with the transports;
this module only knows `StreamChunk`s and time. On a timeout the backend's
stream is cancelled where it waits and closed, so its HTTP request (or the
embedded worker) ends too.
"""

from __future__ import annotations

import asyncio
from typing import AsyncIterator

from backends.base import Backend, PreparedRequest, StreamChunk, StreamLimits
from backends.errors import BackendTimeout


def watched(backend: Backend, request: PreparedRequest) -> AsyncIterator[StreamChunk]:
    """`backend.stream(request)` under the backend's own limits."""
    return watch(backend.stream(request), backend.stream_limits, label=backend.label, url=backend.url)


async def watch(stream: AsyncIterator[StreamChunk], limits: StreamLimits, *,
                label: str, url: str) -> AsyncIterator[StreamChunk]:
    """Pass `stream`'s chunks on; raise BackendTimeout when a limit runs out.

    Closing this generator closes `stream`.
    """
    loop = asyncio.get_running_loop()
    deadline: float | None = loop.time() + limits.first_token_s
    text_seen = False
    tokens = 0
    try:
        while True:
            timer = asyncio.timeout_at(deadline)
            try:
                async with timer:
                    chunk = await stream.__anext__()
            except StopAsyncIteration:
                return
            except TimeoutError:
                if not timer.expired():
                    raise  # not ours: a bug below, let it surface
                raise _timeout(limits, label, url, text_seen, tokens) from None
            now = loop.time()
            if chunk.text or (chunk.token_count or 0) > 0:
                text_seen = True
            tokens += chunk.token_count if chunk.token_count is not None else (1 if chunk.text else 0)
            if text_seen:
                deadline = now + limits.stall_s
            elif chunk.queue_position is not None:
                deadline = None if chunk.queue_position > 0 else now + limits.first_token_s
            yield chunk
    finally:
        aclose = getattr(stream, "aclose", None)
        if aclose is not None:
            await aclose()


def _timeout(limits: StreamLimits, label: str, url: str, text_seen: bool, tokens: int) -> BackendTimeout:
    if not text_seen:
        return BackendTimeout(
            label, url, f"no first token within {limits.first_token_s:g} s ({limits.first_token_variable}).",
            limit="first_token",
            hint=f"The engine may be overloaded or the prompt very long; raise {limits.first_token_variable} "
                 f"in .env to wait longer.",
        )
    return BackendTimeout(
        label, url, f"stalled: no token for {limits.stall_s:g} s after token {tokens} ({limits.stall_variable}).",
        limit="stall",
        hint=f"The text so far is kept. The engine may be overloaded; raise {limits.stall_variable} in .env "
             f"to wait longer.",
    )
