"""The measurement module on synthetic streams whose right answers are known."""

import asyncio

import pytest

from backends.base import ServerFigures, StreamChunk
from timing import StreamMeter, TimedStream, measure


def run(meter: StreamMeter, timeline: list[tuple[float, StreamChunk]], end: float, status="completed"):
    meter.start(at=0.0)
    for at, chunk in timeline:
        meter.observe(chunk, at=at)
    return meter.finish(status, backend="test", model="m", at=end)


def test_ttft_skips_the_empty_role_chunk_and_rate_excludes_ttft():
    timeline = [(0.05, StreamChunk(text="", token_count=0))]  # role delta
    timeline += [(0.5 + 0.1 * i, StreamChunk(text=f"t{i}", token_count=1)) for i in range(11)]
    record = run(StreamMeter(), timeline, end=1.6)
    assert record.first_token_s == pytest.approx(0.5)
    assert record.output_tokens == 11
    # 10 intervals of 0.1 s after the first token: exactly 10 tokens/s, TTFT not included.
    assert record.decode_tokens_per_s == pytest.approx(10.0)
    # TPOT = (e2e - TTFT) / (n - 1) = (1.6 - 0.5) / 10
    assert record.ms_per_output_token == pytest.approx(110.0)
    assert record.tokens_exact and record.count_disagreement is None


def test_chunks_holding_several_tokens_are_counted_exactly():
    timeline = [(1.0, StreamChunk("ab", token_count=2)), (2.0, StreamChunk("cde", token_count=3))]
    record = run(StreamMeter(), timeline, end=2.0)
    assert record.output_tokens == 5
    assert record.decode_tokens_per_s == pytest.approx(4.0)  # (5 - 1) / (2.0 - 1.0)


def test_unknown_counts_are_marked_estimated_until_the_server_says():
    timeline = [(1.0, StreamChunk("a", token_count=None)), (2.0, StreamChunk("bc", token_count=None))]
    estimated = run(StreamMeter(), timeline, end=2.0)
    assert not estimated.tokens_exact and estimated.output_tokens == 2
    assert "estimated" in estimated.token_source

    timeline.append((2.0, StreamChunk(server_figures=ServerFigures("vLLM usage", output_tokens=3))))
    corrected = run(StreamMeter(), timeline, end=2.0)
    assert corrected.tokens_exact and corrected.output_tokens == 3
    assert corrected.count_disagreement is None

    # The server agreeing with the estimate still makes the count exact (and says whose it is).
    timeline[-1] = (2.0, StreamChunk(server_figures=ServerFigures("vLLM usage", output_tokens=2)))
    confirmed = run(StreamMeter(), timeline, end=2.0)
    assert confirmed.tokens_exact and confirmed.output_tokens == 2 and "vLLM usage" in confirmed.token_source


def test_disagreement_with_the_server_is_flagged_not_hidden():
    timeline = [(1.0, StreamChunk("a", 1)), (2.0, StreamChunk("b", 1)),
                (2.0, StreamChunk(server_figures=ServerFigures("TGI details", output_tokens=3, input_tokens=7)))]
    record = run(StreamMeter(), timeline, end=2.0)
    assert record.output_tokens == 2
    assert record.server_output_tokens == 3 and record.server_input_tokens == 7
    assert "client counted 2" in record.count_disagreement and "TGI details reports 3" in record.count_disagreement


def test_no_tokens_means_no_rate_and_queue_position_clears_on_first_token():
    meter = StreamMeter()
    meter.start(at=0.0)
    meter.observe(StreamChunk(queue_position=2), at=0.1)
    assert meter.live(at=0.2).queue_position == 2
    assert meter.live(at=0.2).decode_tokens_per_s is None
    meter.observe(StreamChunk("x", 1), at=0.3)
    live = meter.live(at=0.4)
    assert live.queue_position is None and live.first_token_s == pytest.approx(0.3)
    record = meter.finish("stopped", backend="b", model="m", at=0.5)
    assert record.status == "stopped" and record.decode_tokens_per_s is None


async def test_timed_stream_starts_the_clock_at_the_first_request_and_closes_the_stream():
    ticks = iter([10.0, 10.2, 10.5, 10.6, 11.0])
    closed = []

    async def backend_stream():
        try:
            yield StreamChunk("", 0)
            yield StreamChunk("hi", 1)
            yield StreamChunk(" there", 1)
        finally:
            closed.append(True)

    timed = TimedStream(backend_stream(), backend="b", model="m", clock=lambda: next(ticks))
    texts = [chunk.text async for chunk in timed]
    await timed.aclose()
    record = timed.finish("completed")
    assert "".join(texts) == "hi there" and closed == [True]
    assert record.first_token_s == pytest.approx(0.5)  # 10.5 - 10.0, not from construction
    assert record.total_s == pytest.approx(1.0)


async def test_measure_returns_text_and_record():
    async def backend_stream():
        for piece in ["a", "b", "c"]:
            await asyncio.sleep(0)
            yield StreamChunk(piece, 1)

    text, record = await measure(backend_stream(), backend="b", model="m")
    assert text == "abc" and record.output_tokens == 3 and record.status == "completed"
