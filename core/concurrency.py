"""asyncio helpers shared by the chat flow and the benchmark."""
from __future__ import annotations

import asyncio
from typing import Any, Coroutine, Iterable


async def run_together(coroutines: Iterable[Coroutine[Any, Any, Any]]) -> list[Any]:
    """Run the coroutines at once; once every one has ended, return their results in order
    (or raise the first one's exception, in order).

    If the caller is cancelled (the person's Stop, Ctrl-C in a benchmark), each one is cancelled
    once and has finished its own clean-up (closing its stream, recording its figures) before the
    cancellation goes on. `asyncio.gather` does neither: cancelled, it hands the cancellation on
    as soon as the first one has ended, and cancelling the others again then cuts their clean-up
    short."""
    tasks = [asyncio.create_task(coroutine) for coroutine in coroutines]
    if not tasks:
        return []
    try:
        await asyncio.wait(tasks)  # waiting is cancelled, the tasks are not
    except asyncio.CancelledError:
        for task in tasks:
            task.cancel()
        await asyncio.wait(tasks)
        raise
    return [task.result() for task in tasks]
