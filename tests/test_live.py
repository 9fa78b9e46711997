"""Rendering a reply: coalesced text, throttled figures, stop and errors (fake backend)."""

import asyncio

from backends.base import StreamChunk
from backends.errors import BackendOverloaded
from ui.live import LiveReply
from core.timing import TimedStream


class FakeMessage:
    def __init__(self):
        self.emits: list[tuple[float, str]] = []

    async def stream_token(self, token: str) -> None:
        self.emits.append((asyncio.get_running_loop().time(), token))


class FakeMetrics:
    def __init__(self):
        self.props: dict = {}
        self.updates: list[dict] = []

    async def update(self) -> None:
        self.updates.append(dict(self.props))


async def paced(tokens: int, rate_per_s: float, *, fail_after: int | None = None, closed: list | None = None):
    """A fake backend streaming one token per chunk at a fixed rate."""
    try:
        yield StreamChunk("", 0)
        for i in range(tokens):
            if fail_after is not None and i == fail_after:
                raise BackendOverloaded("Fake", "http://127.0.0.1:1", "Model is overloaded.")
            await asyncio.sleep(1 / rate_per_s)
            yield StreamChunk(f"{i} ", 1)
        yield StreamChunk(finish_reason="length", token_count=0)
    finally:
        if closed is not None:
            closed.append(True)


async def test_fast_stream_is_coalesced_and_complete():
    message, metrics = FakeMessage(), FakeMetrics()
    timed = TimedStream(paced(300, 500), backend="Fake", model="m")
    outcome = await LiveReply(timed, message, metrics).run()
    expected = "".join(f"{i} " for i in range(300))
    assert outcome.text == expected and "".join(t for _, t in message.emits) == expected
    # ~0.6 s of streaming at one UI update per 40 ms: a few dozen emits, not 300.
    assert len(message.emits) < 60
    assert outcome.record.output_tokens == 300 and outcome.record.status == "completed"
    assert metrics.props["state"] == "completed" and metrics.props["tokens"] == 300


async def test_last_token_is_shown_soon_after_it_arrives():
    message, metrics = FakeMessage(), FakeMetrics()
    loop = asyncio.get_running_loop()
    arrived = {}

    async def stream():
        async for chunk in paced(50, 500):
            arrived["last"] = loop.time()
            yield chunk

    await LiveReply(TimedStream(stream(), backend="Fake", model="m"), message, metrics).run()
    assert message.emits[-1][0] - arrived["last"] < 0.1


async def test_metrics_refresh_about_ten_times_per_second_while_streaming():
    message, metrics = FakeMessage(), FakeMetrics()
    timed = TimedStream(paced(40, 50), backend="Fake", model="m")  # ~0.8 s
    await LiveReply(timed, message, metrics).run()
    live = [u for u in metrics.updates if u["state"] == "streaming"]
    assert 4 <= len(live) <= 12
    rates = [u["tokensPerS"] for u in live if u["tokensPerS"] is not None]
    assert rates and all(20 < r < 80 for r in rates[1:])  # live figure tracks the 50 tok/s pace
    assert [u["tokens"] for u in live] == sorted(u["tokens"] for u in live)


async def test_backend_error_keeps_partial_text_and_is_returned():
    message, metrics = FakeMessage(), FakeMetrics()
    closed = []
    timed = TimedStream(paced(50, 200, fail_after=10, closed=closed), backend="Fake", model="m")
    outcome = await LiveReply(timed, message, metrics).run()
    assert isinstance(outcome.error, BackendOverloaded)
    assert outcome.text == "".join(f"{i} " for i in range(10))
    assert outcome.record.status == "error" and "overloaded" in outcome.record.error
    assert closed == [True]


async def test_stop_closes_the_backend_stream_and_marks_the_figures_stopped():
    message, metrics = FakeMessage(), FakeMetrics()
    closed = []
    timed = TimedStream(paced(1000, 100, closed=closed), backend="Fake", model="m")
    task = asyncio.create_task(LiveReply(timed, message, metrics).run())
    await asyncio.sleep(0.3)
    task.cancel()  # what Chainlit does when the user presses Stop
    outcome = await task
    assert outcome.record.status == "stopped" and closed == [True]
    assert 5 < outcome.record.output_tokens < 100
    assert outcome.text and metrics.props["state"] == "stopped"


async def test_timeline_starts_with_the_request_sent_then_first_byte_then_first_text():
    message, metrics = FakeMessage(), FakeMetrics()
    await LiveReply(TimedStream(paced(5, 200), backend="Fake", model="m"), message, metrics).run()
    timeline = metrics.props["timeline"]
    marks = [timeline[name] for name in ("requestSentMs", "firstByteMs", "firstTokenMs", "lastChunkMs", "totalMs")]
    assert marks[0] == 0.0  # the clock starts as the request leaves
    assert marks == sorted(marks) and marks[2] > marks[1]  # the first text came one token after the role chunk


async def test_the_first_text_is_shown_at_once_and_later_text_is_coalesced():
    """Text after a quiet spell goes to the browser as it arrives (a class's first text was held up
    to an interval); text arriving right after is held for the interval and sent together."""
    message, metrics = FakeMessage(), FakeMetrics()
    loop = asyncio.get_running_loop()
    arrived = {}

    async def stream():
        yield StreamChunk("", 0)
        await asyncio.sleep(0.05)
        arrived["first"] = loop.time()
        yield StreamChunk("first ", 1)
        for i in range(5):
            await asyncio.sleep(0.01)
            yield StreamChunk(f"{i} ", 1)
        yield StreamChunk(finish_reason="stop", token_count=0)

    await LiveReply(TimedStream(stream(), backend="Fake", model="m"), message, metrics,
                    text_interval_s=0.5).run()
    assert message.emits[0][1] == "first " and message.emits[0][0] - arrived["first"] < 0.02
    # The rest came within the 0.5 s interval: held, then sent together when the stream ended.
    assert [text for _, text in message.emits] == ["first ", "0 1 2 3 4 "]


async def test_a_stream_faster_than_anyone_reads_is_drawn_less_often():
    """Past FAST_CHUNKS chunks per interval the text goes at most every FAST_TEXT_INTERVAL_S (each
    drawing re-renders the whole message in the browser); a slow stream keeps the short interval."""
    from ui.live import FAST_TEXT_INTERVAL_S, TEXT_INTERVAL_S

    async def draws(tokens: int, rate: float) -> list[float]:
        message, metrics = FakeMessage(), FakeMetrics()
        await LiveReply(TimedStream(paced(tokens, rate), backend="Fake", model="m"), message, metrics).run()
        times = [at for at, _ in message.emits]
        return [b - a for a, b in zip(times[1:], times[2:-1])]  # between drawings, first and last aside

    fast = await draws(600, 2000)
    slow = await draws(20, 50)
    assert fast and min(fast) >= FAST_TEXT_INTERVAL_S * 0.9, fast
    assert slow and max(slow) < FAST_TEXT_INTERVAL_S * 0.9 and min(slow) >= TEXT_INTERVAL_S * 0.9, slow
