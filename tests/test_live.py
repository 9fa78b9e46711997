"""Rendering a reply: coalesced text, throttled figures, stop and errors (fake backend).

The paced fake streams on a virtual clock (tests/virtual_time.py), and the reply is timed on that
clock: every interval, count and rate below is known by construction and asserted exactly, however
busy the machine is. How fast a real browser draws is measured by experiments/browser_render_latency.py.
"""

import asyncio

import pytest

from backends.base import StreamChunk
from backends.errors import BackendOverloaded
from ui.live import LiveReply
from core.timing import TimedStream
from tests.virtual_time import run_in_virtual_time


def timed(stream) -> TimedStream:
    """A reply timed on the running loop's clock (virtual in these tests)."""
    return TimedStream(stream, backend="Fake", model="m", clock=asyncio.get_running_loop().time)


class FakeMessage:
    def __init__(self):
        self.emits: list[tuple[float, str]] = []
        self.carried: list[float] = []  # when a piece of text carried a refresh of the figures

    async def stream_token(self, token: str, figures=None) -> None:
        self.emits.append((asyncio.get_running_loop().time(), token))
        if figures is not None:  # as a page that takes them apart: the figures' own update
            self.carried.append(asyncio.get_running_loop().time())
            await figures.update()


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


def test_fast_stream_is_coalesced_and_complete():
    async def main():
        message, metrics = FakeMessage(), FakeMetrics()
        outcome = await LiveReply(timed(paced(300, 500)), message, metrics).run()
        return message, metrics, outcome

    message, metrics, outcome = run_in_virtual_time(main())
    expected = "".join(f"{i} " for i in range(300))
    assert outcome.text == expected and "".join(t for _, t in message.emits) == expected
    # 0.6 s of streaming: the first text at once, the next 40 ms later (19 chunks in 40 ms: 475/s,
    # over 400/s), then one every 100 ms, and the rest when the stream ended: 8 drawings, not 300.
    assert len(message.emits) == 8
    assert message.emits[0] == (pytest.approx(0.002), "0 ") and message.emits[-1][0] == pytest.approx(0.6)
    assert outcome.record.output_tokens == 300 and outcome.record.status == "completed"
    assert metrics.props["state"] == "completed" and metrics.props["tokens"] == 300


def test_the_last_text_is_drawn_the_moment_the_stream_ends_not_an_interval_later():
    async def main():
        message, metrics = FakeMessage(), FakeMetrics()
        loop = asyncio.get_running_loop()
        arrived = {}

        async def stream():
            async for chunk in paced(30, 300):  # under 400/s: drawn every 40 ms
                arrived["last"] = loop.time()
                yield chunk

        await LiveReply(timed(stream()), message, metrics).run()
        return message, arrived

    message, arrived = run_in_virtual_time(main())
    # The drawing before the last one was under an interval earlier: the text loop was still
    # waiting out its interval when the stream ended, and the end drew at once anyway.
    assert message.emits[-1][0] - message.emits[-2][0] < 0.04
    assert message.emits[-1][0] == arrived["last"]


def test_the_last_text_goes_when_the_engine_says_finished_not_when_the_stream_has_closed():
    """The finish chunk says no more text follows: the pending text is drawn then, though the text
    loop is inside its interval and the stream takes 0.2 s more to close (as closing a connection
    on a busy loop can). Control: a stream that never says it finished has its last text drawn
    at the text loop's next interval, later than it came."""
    CLOSE_S = 0.2

    async def reply(say_finished: bool):
        message, metrics = FakeMessage(), FakeMetrics()
        loop = asyncio.get_running_loop()
        seen = {}

        async def stream():
            yield StreamChunk("", 0)
            for i in range(30):  # 30 tokens at 300/s (drawn every 40 ms): the loop is always inside an interval
                await asyncio.sleep(1 / 300)
                seen["last_text"] = loop.time()
                yield StreamChunk(f"{i} ", 1)
            if say_finished:
                yield StreamChunk(finish_reason="stop", token_count=0)
            await asyncio.sleep(CLOSE_S)

        await LiveReply(timed(stream()), message, metrics).run()
        return message, seen

    message, seen = run_in_virtual_time(reply(True))
    assert message.emits[-1][0] == pytest.approx(seen["last_text"]) and message.emits[-1][1].endswith("29 ")
    message, seen = run_in_virtual_time(reply(False))
    assert seen["last_text"] + 0.01 < message.emits[-1][0] <= seen["last_text"] + 0.04


def refreshes(tokens: int, rate: float):
    """A reply at `rate` tokens/s: its message, and its live refreshes (loop time, props)."""
    async def main():
        message, metrics = FakeMessage(), TimedMetrics()
        await LiveReply(timed(paced(tokens, rate)), message, metrics).run()
        return message, metrics.live

    return run_in_virtual_time(main())


class TimedMetrics(FakeMetrics):
    def __init__(self):
        super().__init__()
        self.live: list[tuple[float, dict]] = []

    async def update(self) -> None:
        await super().update()
        if self.props.get("state") == "streaming":
            self.live.append((asyncio.get_running_loop().time(), dict(self.props)))


def test_metrics_refresh_about_ten_times_per_second_while_streaming_with_the_live_rate():
    message, live = refreshes(40, 50)  # 0.8 s, text drawn every 40 ms
    # A refresh falls due 60-100 ms after the one before and rides with the next text (every 40 ms):
    # one every 80 ms, never more than 100 ms apart.
    gaps = [later - earlier for (earlier, _), (later, _) in zip(live, live[1:])]
    assert len(live) == 10 and gaps == [pytest.approx(0.08)] * 9, gaps
    assert [props["tokensPerS"] for _, props in live] == [pytest.approx(50.0)] * 10  # the 50 tokens/s pace
    tokens = [props["tokens"] for _, props in live]
    assert tokens == sorted(tokens)
    assert all(abs(count - round(50 * at_s)) <= 1 for (at_s, _), count in zip(live, tokens)), tokens  # 5 per 100 ms


def test_while_text_streams_every_refresh_of_the_figures_rides_with_a_piece_of_text():
    message, live = refreshes(40, 50)
    assert message.carried == [at_s for at_s, _ in live]  # no refresh went alone: no event of its own
    assert len(message.emits) >= 2 * len(live)


def test_control_with_no_text_coming_the_figures_refresh_alone_every_100_ms():
    message, live = refreshes(4, 4)  # a token every 250 ms: no text is due when the figures are
    gaps = [later - earlier for (earlier, _), (later, _) in zip(live, live[1:])]
    assert len(live) >= 8 and all(gap == pytest.approx(0.1) for gap in gaps), gaps
    assert message.carried == []


async def test_backend_error_keeps_partial_text_and_is_returned():
    message, metrics = FakeMessage(), FakeMetrics()
    closed = []
    timed = TimedStream(paced(50, 200, fail_after=10, closed=closed), backend="Fake", model="m")
    outcome = await LiveReply(timed, message, metrics).run()
    assert isinstance(outcome.error, BackendOverloaded)
    assert outcome.text == "".join(f"{i} " for i in range(10))
    assert outcome.record.status == "error" and "overloaded" in outcome.record.error
    assert closed == [True]


def test_stop_closes_the_backend_stream_and_marks_the_figures_stopped():
    async def main():
        message, metrics = FakeMessage(), FakeMetrics()
        closed = []
        task = asyncio.create_task(LiveReply(timed(paced(1000, 100, closed=closed)), message, metrics).run())
        await asyncio.sleep(0.3)
        task.cancel()  # what Chainlit does when the user presses Stop
        return await task, metrics, closed

    outcome, metrics, closed = run_in_virtual_time(main())
    assert outcome.record.status == "stopped" and closed == [True]
    # 0.3 s at 100 tokens/s: the 30th token was due at the very moment of the Stop and never shown.
    assert outcome.record.output_tokens == 29
    assert outcome.text == "".join(f"{i} " for i in range(29)) and metrics.props["state"] == "stopped"


def test_timeline_starts_with_the_request_sent_then_first_byte_then_first_text():
    async def main():
        message, metrics = FakeMessage(), FakeMetrics()
        await LiveReply(timed(paced(5, 200)), message, metrics).run()
        return metrics.props["timeline"]

    timeline = run_in_virtual_time(main())
    marks = [timeline[name] for name in ("requestSentMs", "firstByteMs", "firstTokenMs", "lastChunkMs", "totalMs")]
    # The clock starts as the request leaves; the role chunk comes at once, each token 5 ms later.
    assert marks == [0.0, 0.0, pytest.approx(5.0), pytest.approx(25.0), pytest.approx(25.0)]
    assert timeline["chunkTimesMs"] == [pytest.approx(ms) for ms in (5.0, 10.0, 15.0, 20.0, 25.0)]


def test_the_first_text_is_shown_at_once_and_later_text_is_coalesced():
    """Text after a quiet spell goes to the browser as it arrives (a class's first text was held up
    to an interval); text arriving right after is held for the interval and sent together."""

    async def main():
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

        await LiveReply(timed(stream()), message, metrics, text_interval_s=0.5).run()
        return message, arrived

    message, arrived = run_in_virtual_time(main())
    assert message.emits[0] == (arrived["first"], "first ")
    # The rest came within the 0.5 s interval: held, then sent together when the stream ended (50 ms on).
    assert message.emits[1] == (pytest.approx(arrived["first"] + 0.05), "0 1 2 3 4 ")
    assert len(message.emits) == 2


def test_a_stream_faster_than_anyone_reads_is_drawn_less_often():
    """From 400 chunks/s the text goes at most every 100 ms, from 1200 every 200 ms (each drawing
    re-renders the whole message in the browser); a slow stream keeps the short interval."""
    from ui.live import TEXT_INTERVAL_S

    async def draws(tokens: int, rate: float) -> list[float]:
        message, metrics = FakeMessage(), FakeMetrics()
        await LiveReply(timed(paced(tokens, rate)), message, metrics).run()
        times = [at for at, _ in message.emits]
        return [b - a for a, b in zip(times[1:], times[2:-1])]  # between drawings, first and last aside

    fastest = run_in_virtual_time(draws(1200, 2000))  # 0.6 s
    fast = run_in_virtual_time(draws(600, 1000))  # 0.6 s
    slow = run_in_virtual_time(draws(20, 50))
    assert fastest == [pytest.approx(0.2)] * 2, fastest
    assert fast == [pytest.approx(0.1)] * 5, fast
    assert slow == [pytest.approx(TEXT_INTERVAL_S)] * 8, slow


def first_drawings(tokens: int, rate: float) -> list[float]:
    """When text was drawn for a reply whose message takes 10 ms to go on screen while its engine
    answers at once: `tokens` chunks at `rate`, each stamped where it arrived (as backends/offloop.py does)."""

    async def main():
        message, metrics = FakeMessage(), FakeMetrics()
        loop = asyncio.get_running_loop()

        async def stream():
            yield StreamChunk("", 0)
            for i in range(tokens):
                await asyncio.sleep(1 / rate)
                yield StreamChunk(f"{i} ", 1, arrived_at_s=loop.time())
            yield StreamChunk(finish_reason="stop", token_count=0, arrived_at_s=loop.time())

        await LiveReply(timed(stream()), message, metrics).run(asyncio.sleep(0.01))
        return [at for at, _ in message.emits]

    return run_in_virtual_time(main())


def test_the_first_drawing_paces_a_stream_by_when_its_held_chunks_arrived():
    """The first drawing holds what came while the message went on screen: at 2000 chunks/s (20 of
    them in those 10 ms) the next drawing waits 200 ms, so the reply's end (100 ms on) is the next;
    control: at 300 chunks/s (3 held) the text loop keeps its 40 ms."""
    fast = first_drawings(200, 2000)
    assert fast == [pytest.approx(0.01), pytest.approx(0.1)], fast  # the first, then the end
    slow = first_drawings(30, 300)
    assert slow[:2] == [pytest.approx(0.01), pytest.approx(0.05)], slow


class RecordingMetrics(FakeMetrics):
    """Figures that note when their final update came (the reply's end work)."""

    def __init__(self):
        super().__init__()
        self.final_at: float | None = None

    async def update(self) -> None:
        await super().update()
        if self.props.get("state") in ("completed", "stopped", "error"):
            self.final_at = asyncio.get_running_loop().time()


def two_replies(first_tokens: int, second_tokens: int, rate: float = 100):
    """Two replies on one loop, started together: (message, metrics) of each."""
    async def main():
        replies = [(FakeMessage(), RecordingMetrics()) for _ in range(2)]
        await asyncio.gather(*(LiveReply(timed(paced(tokens, rate)), message, metrics).run()
                               for tokens, (message, metrics) in zip((first_tokens, second_tokens), replies)))
        return replies

    return run_in_virtual_time(main())


def test_a_replys_end_waits_for_the_last_text_of_a_reply_ending_just_after_it():
    (first, first_metrics), (second, _) = two_replies(10, 13)  # the second's text ends 30 ms later
    # The first reply's last text went when its stream ended; its final figures only after the
    # second reply's last text had gone out.
    assert first.emits[-1][0] == pytest.approx(0.1)
    assert second.emits[-1][0] == pytest.approx(0.13)
    assert first_metrics.final_at == pytest.approx(0.13)


def test_control_a_reply_alone_ends_at_once():
    async def main():
        message, metrics = FakeMessage(), RecordingMetrics()
        await LiveReply(timed(paced(10, 100)), message, metrics).run()
        return message, metrics

    message, metrics = run_in_virtual_time(main())
    assert message.emits[-1][0] == pytest.approx(0.1) and metrics.final_at == pytest.approx(0.1)


def test_a_replys_end_waits_for_the_others_at_most_end_wait_s():
    from ui.live import END_WAIT_S

    (first, first_metrics), (second, second_metrics) = two_replies(10, 100)  # the second ends 0.9 s later
    assert first_metrics.final_at == pytest.approx(0.1 + END_WAIT_S)
    assert second_metrics.final_at == pytest.approx(1.0)  # the last one waits for nobody


def test_a_stop_while_the_end_waits_keeps_the_complete_reply():
    async def main():
        message, metrics = FakeMessage(), RecordingMetrics()
        other = asyncio.create_task(LiveReply(timed(paced(100, 100)), FakeMessage(), RecordingMetrics()).run())
        reply = asyncio.create_task(LiveReply(timed(paced(10, 100)), message, metrics).run())
        await asyncio.sleep(0.15)  # its text is complete (0.1 s); its end waits for the other reply
        assert metrics.final_at is None
        reply.cancel()  # the person's Stop, just after the last token
        outcome = await reply
        other.cancel()
        await other  # a Stop ends that one too, kept: nothing is left running
        return outcome, metrics

    outcome, metrics = run_in_virtual_time(main())
    assert outcome.status == "completed" and outcome.record.output_tokens == 10
    assert metrics.props["state"] == "completed" and metrics.final_at == pytest.approx(0.15)
