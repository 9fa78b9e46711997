"""asyncio helpers shared by the chat flow and the benchmark."""
from __future__ import annotations

import asyncio
from typing import Any, Coroutine, Iterable


async def run_together(coroutines: Iterable[Coroutine[Any, Any, Any]]) -> list[Any]:
    """Run the coroutines at once and return their results in order.

    If the caller is cancelled (the person's Stop, Ctrl-C in a benchmark), every one is cancelled
    and each has finished its own clean-up (closing its stream, recording its figures) before the
    cancellation goes on. A plain `gather` hands the cancellation on as soon as the first one has
    ended, while the others may still be closing their streams; cancelling them again then would
    interrupt that closing."""
    tasks = [asyncio.create_task(coroutine) for coroutine in coroutines]
    try:
        return await asyncio.gather(*tasks)
    except asyncio.CancelledError:
        for task in tasks:
            # The cancelled gather has already asked each one to stop: a second cancel would cut a
            # clean-up short (a stream half closed, its figures never recorded).
            if not task.done() and not task.cancelling():
                task.cancel()
        if tasks:
            await asyncio.wait(tasks)
        raise
