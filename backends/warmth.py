"""A pooled connection that sat idle is reopened before a request, not inside its measured time.

Servers close idle keep-alive connections (uvicorn, so vLLM and TGI's router: after 5 s). A
request sent on a connection the server has just closed pays a reconnect inside its TTFT, so a
backend idle longer than `after_s` warms a connection first (a cheap request, in `prepare`).
When a class sends at once, every reply finds the backend idle: one warm-up serves them all
(each waits for the same one), instead of one request more per reply before it may leave.
"""

from __future__ import annotations

import asyncio
import time
from typing import Awaitable, Callable


class IdleWarmth:
    """When a backend's connection was last used, and its one warm-up in flight."""

    def __init__(self, warm: Callable[[], Awaitable[None]], after_s: float,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._warm = warm
        self.after_s = after_s
        self._clock = clock
        self.last_used_s = float("-inf")
        self._warming: asyncio.Future | None = None

    def used(self) -> None:
        """The connection was just used (a request sent or answered)."""
        self.last_used_s = self._clock()

    @property
    def idle(self) -> bool:
        return self._clock() - self.last_used_s > self.after_s

    async def ensure(self) -> None:
        """Warm the connection if it idled, sharing a warm-up already in flight; raises what it raised."""
        if not self.idle:
            return
        if self._warming is None or self._warming.done():
            self._warming = asyncio.ensure_future(self._warm())
        await asyncio.shield(self._warming)
