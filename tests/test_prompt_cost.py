"""What each reply's prompt cost: prompt tokens, how many came from the engine's cache, prefill speed.

On recorded answers first (vLLM 0.32 started with --enable-prompt-tokens-details, llama-server
b11312), then against the real engines: a conversation's second turn reports cached prompt tokens,
a fresh conversation none (on llama.cpp: none beyond the chat template's opening tokens, which
every prompt shares).
"""

from __future__ import annotations

import uuid
from datetime import datetime, timezone

import httpx
import pytest

from backends.base import ChatMessage, GenerationParams, ServerFigures
from backends.llama_server import KIND as LLAMA_SERVER_KIND, LlamaServerBackend
from backends.llamacpp import LlamaCppBackend, kept_prefix
from backends.openai_compat import OpenAICompatBackend
from config import BackendConfig
from core.figures import final_props, prompt_props
from core.reports import stats_markdown, stats_rows
from core.streaming import measure
from store import StoredReply
from tests.test_openai_parsing import parse_all, record_of, recorded_chunks

SHORT = GenerationParams(temperature=0.0, top_p=1.0, max_new_tokens=8)
VLLM_BLOCK = 32  # scripts/vllm_launch.py CPU_BLOCK_SIZE


def conversation(system: str) -> list[ChatMessage]:
    return [ChatMessage("system", system), ChatMessage("user", "What does a cache keep, in one sentence?")]


def class_system_prompt() -> str:
    """A system prompt no earlier request of the test run has sent (a fresh conversation)."""
    return (f"Course {uuid.uuid4().hex}: you are the teaching assistant of an introductory course on "
            "computer systems. Answer in two or three short sentences, with one everyday example. " * 3)


async def two_turns(backend, system: str) -> tuple[ServerFigures, ServerFigures]:
    """Turn 1, then turn 2 carrying turn 1 and its reply: each reply's server figures."""
    first_turn = conversation(system)
    reply, first = await measure(backend, first_turn, SHORT)
    second_turn = [*first_turn, ChatMessage("assistant", reply), ChatMessage("user", "Give one more example.")]
    _, second = await measure(backend, second_turn, SHORT)
    return first.server, second.server


# ---------------------------------------------------------------- recorded answers


def test_vllm_second_turn_reports_its_cached_prompt_tokens_and_a_prefill_rate_over_the_rest():
    first = record_of(parse_all(recorded_chunks("vllm-0.32-prompt-tokens-details-turn1.sse"))).server
    second = record_of(parse_all(recorded_chunks("vllm-0.32-prompt-tokens-details-turn2.sse"))).server
    assert (first.input_tokens, first.cached_prompt_tokens) == (98, 0)
    assert (second.input_tokens, second.cached_prompt_tokens, second.computed_prompt_tokens) == (125, 96, 29)
    # Prefill speed: the tokens it computed over its own scheduled-to-first-token time.
    assert second.prompt_tokens_per_s == pytest.approx(29 / second.first_token_s)
    assert first.prompt_tokens_per_s == pytest.approx(98 / first.first_token_s)


def test_a_vllm_reply_without_prompt_details_says_nothing_about_its_cache():
    server = record_of(parse_all(recorded_chunks("vllm-0.32-include-usage-only.sse"))).server
    assert server.input_tokens == 36 and server.cached_prompt_tokens is None
    assert server.prompt_tokens_per_s is None and server.computed_prompt_tokens is None
    props = prompt_props(server)
    assert props["tokens"] == 36 and props["cached"] is None and props["prefillTokensPerS"] is None


def test_llama_server_timings_give_cache_n_prompt_n_and_its_own_prompt_rate():
    chunks = recorded_chunks("llama-server-b11312-include-usage.sse")
    closing = chunks[-1]
    record = record_of(parse_all(chunks, usage_source="llama.cpp server usage"), backend="llama.cpp server")
    timings = closing["timings"]
    assert record.server.input_tokens == timings["cache_n"] + timings["prompt_n"] == closing["usage"]["prompt_tokens"]
    assert record.server.cached_prompt_tokens == timings["cache_n"]
    assert record.server.prompt_tokens_per_s == pytest.approx(timings["prompt_per_second"])


def test_the_embedded_models_kept_prefix_follows_llama_cpp_pythons_rule():
    assert kept_prefix([], [1, 2, 3], logits_live=False) == 0
    assert kept_prefix([1, 2, 3, 9, 9], [1, 2, 3, 4], logits_live=True) == 3  # the new turn goes on from 3
    assert kept_prefix([1, 2, 3, 4, 5], [1, 2, 3, 4], logits_live=True) == 3  # whole prompt kept: last one again
    assert kept_prefix([1, 2, 3, 4], [1, 2, 3, 4], logits_live=True) == 4  # exactly the context, logits live
    assert kept_prefix([1, 2, 3, 4], [1, 2, 3, 4], logits_live=False) == 3
    assert kept_prefix([7, 2, 3], [1, 2, 3], logits_live=True) == 0


def test_the_reply_row_shows_the_prompt_cost_and_stats_carry_it():
    second = record_of(parse_all(recorded_chunks("vllm-0.32-prompt-tokens-details-turn2.sse")))
    props = final_props(second, lang="en")
    assert props["prompt"]["tokens"] == 125 and props["prompt"]["cached"] == 96
    assert props["timeline"]["server"]["cachedTokens"] == 96 and props["timeline"]["server"]["computedTokens"] == 29
    reply = StoredReply(id="r", thread_id="t", user_identifier=None, created_at=datetime.now(timezone.utc),
                        backend="vllm", backend_label="vLLM", model="m", mode="chat", round_id=None, column_label=None,
                        prompt="q", reply_text="a", status="completed", first_token_s=0.1, decode_tokens_per_s=10.0,
                        output_tokens=12, total_s=1.0, ms_per_output_token=50.0, settings_sent={},
                        record=second.as_dict())
    row = stats_rows([reply])[0]
    assert (row["prompt_tokens"], row["cached_prompt_tokens"]) == (125, 96)
    assert row["prefill_tokens_per_s"] == round(29 / second.server.first_token_s, 1)
    assert "| 125 | 96 |" in stats_markdown([row])


# ---------------------------------------------------------------- the real engines


async def test_vllm_second_turn_reports_cached_tokens_and_a_fresh_conversation_none(vllm_base_url):
    backend = OpenAICompatBackend(BackendConfig(name="vllm", kind="vllm", label="vLLM", base_url=vllm_base_url))
    try:
        first, second = await two_turns(backend, class_system_prompt())
    finally:
        await backend.aclose()
    print(f"vLLM: turn 1 {first.input_tokens} prompt tokens, {first.cached_prompt_tokens} cached; "
          f"turn 2 {second.input_tokens}, {second.cached_prompt_tokens} cached, "
          f"prefill {second.prompt_tokens_per_s:.0f} tokens/s")
    assert first.cached_prompt_tokens == 0
    # Turn 1's whole blocks (at least) come back from the prefix cache.
    assert second.cached_prompt_tokens >= first.input_tokens // VLLM_BLOCK * VLLM_BLOCK > 0
    assert second.prompt_tokens_per_s is not None and first.prompt_tokens_per_s is not None


async def opening_tokens(llama_server_url: str) -> int:
    """The tokens every templated prompt opens with (the chat template's own), as the server counts."""
    async with httpx.AsyncClient(base_url=llama_server_url, timeout=30) as client:
        tokens = []
        for system in ("alpha", "zulu"):
            templated = (await client.post("/apply-template", json={"messages": [
                message.as_dict() for message in conversation(system)]})).json()["prompt"]
            tokens.append((await client.post("/tokenize", json={"content": templated, "add_special": True,
                                                                "parse_special": True})).json()["tokens"])
    return kept_prefix(tokens[0], tokens[1], logits_live=True)


async def test_llama_server_second_turn_reports_cached_tokens_and_a_fresh_conversation_none(llama_server):
    backend = LlamaServerBackend(BackendConfig(name="llama_server", kind=LLAMA_SERVER_KIND.name,
                                               label="llama.cpp server", base_url=llama_server.base_url))
    try:
        first, second = await two_turns(backend, class_system_prompt())
    finally:
        await backend.aclose()
    opening = await opening_tokens(llama_server.url)
    print(f"llama-server: turn 1 {first.input_tokens} prompt tokens, {first.cached_prompt_tokens} cached "
          f"(template opening {opening}); turn 2 {second.input_tokens}, {second.cached_prompt_tokens} cached")
    assert first.cached_prompt_tokens <= opening  # nothing of this conversation was in its cache
    assert second.cached_prompt_tokens >= first.input_tokens - 1  # turn 1's prompt, kept in its slot
    assert second.prompt_tokens_per_s is not None


async def test_embedded_second_turn_reports_its_kept_prefix_and_a_fresh_conversation_none():
    backend = LlamaCppBackend(BackendConfig(name="llama_cpp", kind="llamacpp", label="llama.cpp"))
    await backend.warm_up()
    model = backend.model
    first, second = await two_turns(backend, class_system_prompt())
    alpha = await model.run(model.prompt_tokens, conversation("alpha"))
    zulu = await model.run(model.prompt_tokens, conversation("zulu"))
    opening = kept_prefix(alpha, zulu, logits_live=True)
    print(f"embedded: turn 1 {first.input_tokens} prompt tokens, {first.cached_prompt_tokens} kept "
          f"(template opening {opening}); turn 2 {second.input_tokens}, {second.cached_prompt_tokens} kept")
    assert first.cached_prompt_tokens <= opening
    assert second.cached_prompt_tokens >= first.input_tokens - 1
    assert second.input_tokens - second.cached_prompt_tokens > 1
    # llama.cpp's own count of the prompt tokens it evaluated agrees: the prefill rate is over them.
    assert second.prompt_tokens_per_s is not None
    assert second.prompt_s * second.prompt_tokens_per_s == pytest.approx(second.computed_prompt_tokens, rel=0.01)
