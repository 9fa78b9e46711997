"""run_together: a Stop (cancelling the caller) ends every coroutine, after its own clean-up."""
import asyncio

import pytest

from core.concurrency import run_together


async def test_results_come_back_in_order():
    async def value(number: int, delay_s: float) -> int:
        await asyncio.sleep(delay_s)
        return number

    assert await run_together([value(1, 0.02), value(2, 0.0), value(3, 0.01)]) == [1, 2, 3]
    assert await run_together([]) == []


async def test_cancelling_the_caller_waits_for_every_clean_up_before_it_goes_on():
    """The slow clean-up (a stream that takes a while to close) must be over too: with a plain
    gather the caller would go on once the quick one has ended (a compare column shown final
    while still 'streaming')."""
    started, cleaned_up = asyncio.Event(), []

    async def stream(name: str, close_s: float) -> None:
        try:
            started.set()
            await asyncio.sleep(60)
        finally:
            await asyncio.sleep(close_s)
            cleaned_up.append(name)

    caller = asyncio.create_task(run_together([stream("quick", 0.0), stream("slow", 0.2)]))
    await started.wait()
    await asyncio.sleep(0)
    caller.cancel()
    with pytest.raises(asyncio.CancelledError):
        await caller
    assert cleaned_up == ["quick", "slow"]


async def test_a_failure_is_raised_once_every_one_has_ended():
    ended = []

    async def fails() -> None:
        raise ValueError("broken column")

    async def slow() -> str:
        await asyncio.sleep(0.1)
        ended.append("slow")
        return "done"

    with pytest.raises(ValueError, match="broken column"):
        await run_together([fails(), slow()])
    assert ended == ["slow"]  # nothing left running behind the error
