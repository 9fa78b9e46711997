"""An event loop on a virtual clock: time moves only when every task waits on a timer.

`asyncio.sleep(0.5)` returns at once in real time, with `loop.time()` 0.5 s later, so a test of
pacing, throttling or refresh intervals runs in no time and its counts are exact, whatever else
the machine is doing. Only for code that waits on timers and in-process events: a loop that
waits on a socket or a thread would see the clock jump past its timeouts.
"""

from __future__ import annotations

import asyncio
from typing import Awaitable, TypeVar

T = TypeVar("T")


class VirtualTimeLoop(asyncio.SelectorEventLoop):
    """`time()` starts at 0 and jumps to the next timer whenever nothing is ready to run."""

    def __init__(self) -> None:
        super().__init__()
        self._now_s = 0.0

    def time(self) -> float:
        return self._now_s

    def _run_once(self) -> None:
        if not self._ready and self._scheduled:
            self._now_s = max(self._now_s, self._scheduled[0].when())
        super()._run_once()


def run_in_virtual_time(main: Awaitable[T]) -> T:
    """Run `main` to its end on a fresh virtual-time loop."""
    loop = VirtualTimeLoop()
    try:
        return loop.run_until_complete(main)
    finally:
        loop.close()
