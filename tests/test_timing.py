"""The measurement module on synthetic streams whose right answers are known."""

import asyncio
import random

import numpy
import pytest

from backends.base import ChatMessage, GenerationParams, PreparedRequest, ServerFigures, StreamChunk
from core.timing import InterTokenLatency, StreamMeter, TimedStream, percentile
from core.streaming import measure


def run(meter: StreamMeter, timeline: list[tuple[float, StreamChunk]], end: float, status="completed"):
    meter.start(at=0.0)
    for at, chunk in timeline:
        meter.observe(chunk, at=at)
    return meter.finish(status, backend="test", model="m", at=end)


def test_ttft_skips_the_empty_role_chunk_and_rate_excludes_ttft():
    timeline = [(0.05, StreamChunk(text="", token_count=0))]  # role delta: the first byte
    timeline += [(0.5 + 0.1 * i, StreamChunk(text=f"t{i}", token_count=1)) for i in range(11)]
    timeline.append((1.55, StreamChunk(finish_reason="stop", token_count=0)))  # the finish chunk ends generation
    timeline.append((1.58, StreamChunk(server_figures=ServerFigures("vLLM usage", output_tokens=11))))
    record = run(StreamMeter(), timeline, end=1.6)
    assert record.first_byte_s == pytest.approx(0.05)
    assert record.first_token_s == pytest.approx(0.5)
    assert record.output_tokens == 11
    # 10 intervals of 0.1 s after the first token: exactly 10 tokens/s, TTFT not included.
    # 10 tokens after the first until the finish chunk ended generation: TTFT not included, and
    # tokens/s is TPOT's inverse (one span for both).
    assert record.decode_tokens_per_s == pytest.approx(10 / 1.05)
    # TPOT (vLLM): (end of generation - TTFT) / (n - 1); the finish chunk ends generation,
    # the trailing usage chunk and the closing of the stream do not.
    assert record.last_chunk_s == pytest.approx(1.55)
    assert record.ms_per_output_token == pytest.approx((1.55 - 0.5) / 10 * 1000)
    assert record.total_s == pytest.approx(1.6)
    assert record.tokens_exact and record.count_disagreement is None


def test_ttft_is_the_first_token_even_when_its_text_is_held_back():
    """vLLM sends a reply that opens with a Chinese character as the role chunk and the first token
    together, that token with empty text and its count (the character needs more bytes), the next
    token one step later, still empty, and the character with the third (recorded on CPU vLLM).
    TTFT is the first token, as vLLM's own; the first text would put it two steps late."""
    timeline = [(0.310, StreamChunk(text="", token_count=0)),  # role chunk
                (0.310, StreamChunk(text="", token_count=1)),
                (1.250, StreamChunk(text="", token_count=1)),
                (1.361, StreamChunk(text="欧", token_count=1))]
    timeline += [(1.361 + 0.1 * i, StreamChunk(text="x", token_count=1)) for i in range(1, 4)]
    timeline.append((1.7, StreamChunk(finish_reason="length", token_count=0)))
    record = run(StreamMeter(), timeline, end=1.75)
    assert record.first_byte_s == pytest.approx(0.310)
    assert record.first_token_s == pytest.approx(0.310)
    assert record.output_tokens == 6 and record.tokens_exact
    assert record.ms_per_output_token == pytest.approx((1.7 - 0.310) / 5 * 1000)  # vLLM's TPOT
    assert record.decode_tokens_per_s == pytest.approx(5 / (1.7 - 0.310))  # TPOT's inverse


def test_a_held_back_token_starts_the_watchdogs_stall_clock_not_its_first_token_limit():
    """The first-token limit ends with the first token, text or not, like TTFT."""
    from backends.base import StreamLimits
    from backends.watchdog import watch

    async def stream():
        yield StreamChunk(text="", token_count=0)
        yield StreamChunk(text="", token_count=1)
        await asyncio.sleep(0.15)  # longer than the first-token limit, shorter than the stall limit
        yield StreamChunk(text="欧", token_count=1, finish_reason="stop")

    async def consume():
        limits = StreamLimits(first_token_s=0.1, stall_s=1.0)
        return [chunk async for chunk in watch(stream(), limits, label="t", url="u")]

    assert len(asyncio.run(consume())) == 3


def test_chunks_holding_several_tokens_are_counted_exactly():
    timeline = [(1.0, StreamChunk("ab", token_count=2)), (2.0, StreamChunk("cde", token_count=3))]
    record = run(StreamMeter(), timeline, end=2.0)
    assert record.output_tokens == 5
    assert record.decode_tokens_per_s == pytest.approx(4.0)  # (5 - 1) / (2.0 - 1.0)
    assert record.chunk_tokens == (2, 3) and record.chunk_times_s == (1.0, 2.0)


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


def test_role_and_finish_chunks_without_counts_are_not_counted_as_tokens():
    """A Messages-API stream: a role-only first chunk, text chunks, a separate finish chunk, usage last.
    The closing usage is final; the empty chunks never add tokens (no disagreement warning)."""
    timeline = [(0.1, StreamChunk(text="", token_count=0)),
                *[(0.2 + 0.1 * i, StreamChunk(text=f"w{i}", token_count=None)) for i in range(5)],
                (0.8, StreamChunk(text="", token_count=0, finish_reason="stop")),
                (0.81, StreamChunk(token_count=0, server_figures=ServerFigures("TGI usage", output_tokens=6)))]
    record = run(StreamMeter(), timeline, end=0.82)
    assert record.output_tokens == 6 and record.tokens_exact
    assert record.count_disagreement is None and "TGI usage" in record.token_source


def test_disagreement_with_the_server_is_flagged_not_hidden():
    timeline = [(1.0, StreamChunk("a", 1)), (2.0, StreamChunk("b", 1)),
                (2.0, StreamChunk(server_figures=ServerFigures("TGI details", output_tokens=3, input_tokens=7)))]
    record = run(StreamMeter(), timeline, end=2.0)
    assert record.output_tokens == 2
    assert record.server_output_tokens == 3 and record.server_input_tokens == 7
    assert "client counted 2" in record.count_disagreement and "TGI details reports 3" in record.count_disagreement


def test_server_figures_reported_in_pieces_are_merged():
    timeline = [(1.0, StreamChunk("a", 1)), (1.5, StreamChunk("b", 1)),
                (1.6, StreamChunk(server_figures=ServerFigures("vLLM usage", output_tokens=2, input_tokens=9))),
                (1.6, StreamChunk(server_figures=ServerFigures("vLLM per-request metrics", queue_s=0.01,
                                                               first_token_s=0.2)))]
    record = run(StreamMeter(), timeline, end=1.7)
    assert record.server.output_tokens == 2 and record.server.input_tokens == 9
    assert record.server.queue_s == 0.01 and record.server.first_token_s == 0.2
    assert "vLLM usage" in record.server.source and "per-request metrics" in record.server.source


def test_inter_token_latency_percentiles_and_the_longest_stall():
    # 1 + 20 chunks: gaps of 10 ms, one stall of 300 ms after the 8th token, one chunk of 3 tokens.
    times, tokens = [0.2], [1]
    for index in range(1, 21):
        times.append(times[-1] + (0.3 if index == 8 else 0.01))
        tokens.append(3 if index == 15 else 1)
    timeline = [(t, StreamChunk("x" * n, n)) for t, n in zip(times, tokens)]
    record = run(StreamMeter(), timeline, end=times[-1] + 0.01)
    gaps_ms = numpy.diff(times) * 1000
    itl = record.itl
    assert itl.count == 20
    assert itl.median_ms == pytest.approx(numpy.percentile(gaps_ms, 50))
    assert itl.p90_ms == pytest.approx(numpy.percentile(gaps_ms, 90))
    assert itl.p99_ms == pytest.approx(numpy.percentile(gaps_ms, 99))
    assert itl.max_ms == pytest.approx(300.0)
    assert itl.longest_stall_after_tokens == 8 and itl.longest_stall_ended_s == pytest.approx(times[8])
    assert record.output_tokens == 23
    assert record.chunk_gaps_s == pytest.approx(tuple(numpy.diff(times)))


def test_percentile_matches_numpy_linear_interpolation():
    rng = random.Random(5)
    for size in (1, 2, 3, 10, 101):
        values = [rng.uniform(0, 100) for _ in range(size)]
        for q in (0, 50, 90, 99, 100):
            assert percentile(values, q) == pytest.approx(numpy.percentile(values, q))
    with pytest.raises(ValueError):
        percentile([], 50)
    assert InterTokenLatency.of((0.5,), (1,)) is None


def test_queue_status_is_not_a_first_byte_and_clears_on_first_token():
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
    assert record.first_byte_s == pytest.approx(0.3)  # the local queue status was not a server event


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
    assert record.first_byte_s == pytest.approx(0.2)
    assert record.first_token_s == pytest.approx(0.5)  # 10.5 - 10.0, not from construction
    assert record.total_s == pytest.approx(1.0)
    assert record.started_at_unix_s > 1.6e9
    assert "chunk_times_s" not in record.as_dict() and record.as_dict(include_timeline=True)["chunk_tokens"] == (1, 1)


class SlowToPrepare:
    """A backend whose prepare() takes a while: that time must not be in the figures."""

    label = "slow-prepare"

    async def prepare(self, messages, params):
        await asyncio.sleep(0.3)
        return PreparedRequest(messages=tuple(messages), params=params, model="m", sent={})

    async def stream(self, request):
        for piece in ["a", "b", "c"]:
            await asyncio.sleep(0.01)
            yield StreamChunk(piece, 1)


async def test_measure_prepares_before_the_clock_starts():
    text, record = await measure(SlowToPrepare(), [ChatMessage("user", "hi")], GenerationParams())
    assert text == "abc" and record.output_tokens == 3 and record.status == "completed"
    assert record.backend == "slow-prepare" and record.model == "m"
    # The 0.3 s of preparing is outside the clock: inside it, both would be 0.3 s and more.
    assert record.first_token_s < 0.3 and record.total_s < 0.3


async def test_a_records_dict_is_what_dataclasses_asdict_gives_with_or_without_its_timeline():
    from dataclasses import asdict

    from backends.base import ServerFigures

    async def backend_stream():
        yield StreamChunk("", 0)
        for index in range(5):
            yield StreamChunk(f"t{index} ", 1)
        yield StreamChunk("", 0, finish_reason="stop",
                          server_figures=ServerFigures(source="usage", output_tokens=5, input_tokens=3))

    ticks = iter([10.0 + step / 10 for step in range(100)])
    timed = TimedStream(backend_stream(), backend="b", model="m", clock=lambda: next(ticks))
    async for _ in timed:
        pass
    await timed.aclose()
    record = timed.finish("completed")
    assert record.itl is not None and record.server is not None  # nested dataclasses, both
    whole = asdict(record)
    assert record.as_dict(include_timeline=True) == whole
    assert record.as_dict() == {name: value for name, value in whole.items()
                                if name not in ("chunk_times_s", "chunk_tokens")}


def consistent_record():
    timeline = [(0.2 + 0.05 * i, StreamChunk(text="x", token_count=1)) for i in range(9)]
    timeline.append((0.62, StreamChunk(finish_reason="stop", token_count=0, server_figures=ServerFigures(
        "engine", input_tokens=40, cached_prompt_tokens=10, prompt_s=0.15, prompt_tokens_per_s=200.0,
        decode_tokens_per_s=20.0, time_per_output_token_s=0.05))))
    return run(StreamMeter(), timeline, end=0.65)


def test_a_replys_figures_keep_their_relations_and_each_broken_one_is_named():
    from core.timing import figure_problems

    record = consistent_record()
    assert figure_problems(record.as_dict()) == []  # the control
    assert record.decode_tokens_per_s * record.ms_per_output_token == pytest.approx(1000)
    good = record.as_dict()
    broken = {
        "cached 50 > prompt 40": {"server": {**good["server"], "cached_prompt_tokens": 50}},
        "prefill 50.0 tokens/s < 30 computed tokens / TTFT 200 ms": {"server": {**good["server"],
                                                                            "prompt_tokens_per_s": 50.0}},
        "tokens after the first": {"decode_tokens_per_s": good["decode_tokens_per_s"] * 1.2},
        "TPOT": {"ms_per_output_token": good["ms_per_output_token"] * 1.2},
        "the engine's TPOT": {"server": {**good["server"], "time_per_output_token_s": 0.06}},
    }
    for expected, change in broken.items():
        problems = figure_problems({**good, **change})
        assert any(expected in problem for problem in problems), (expected, problems)


def test_an_engines_impossible_prompt_figures_are_not_reported():
    """A prefill that took longer than the first token took to arrive (the engine's counter held other
    time: llama.cpp's first reply after its warm-up did) and a cached count above the prompt's are
    "not reported"; a possible report is kept as it is (the control)."""
    from core.timing import possible_server_figures

    kept = ServerFigures("engine", input_tokens=44, cached_prompt_tokens=0, prompt_s=0.3, prompt_tokens_per_s=146.7)
    assert possible_server_figures(kept, first_token_s=0.363) is kept
    slow = ServerFigures("engine", input_tokens=44, cached_prompt_tokens=0, prompt_s=11.0, prompt_tokens_per_s=4.0)
    dropped = possible_server_figures(slow, first_token_s=0.363)
    assert dropped.prompt_tokens_per_s is None and dropped.prompt_s is None and dropped.input_tokens == 44
    odd = possible_server_figures(ServerFigures("engine", input_tokens=10, cached_prompt_tokens=12), first_token_s=0.1)
    assert odd.cached_prompt_tokens is None and odd.input_tokens == 10
