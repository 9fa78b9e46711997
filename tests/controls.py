"""Control runs: proof that a request runs to its cap when nothing stops it.

A Stop or abort test asserts that a reply ended below its cap of new tokens.
That means Stop worked only if, left alone, the same request would have
reached the cap: a model that finishes its story by itself at 300 tokens
passes "below 400" without any Stop. `reaches_the_cap` sends the very request
straight to the engine, without Stop, and checks it was ended by the cap
(finish reason "length", exactly the cap's tokens). Each proof is kept for the
session, so the same request on the same engine runs once.
"""

from __future__ import annotations

from typing import Sequence

from backends.base import Backend, ChatMessage, GenerationParams
from backends.registry import create_backend
from config import BackendConfig
from core.streaming import measure

_PROVEN: set[tuple] = set()


async def reaches_the_cap(backend: Backend, messages: Sequence[ChatMessage], params: GenerationParams) -> None:
    """Assert that `messages` with `params` (greedy) on `backend`, left alone, end at the cap."""
    assert params.greedy, "a control run needs greedy decoding to say anything about the next run"
    key = (backend.kind, backend.url, getattr(backend, "route", None), tuple(messages), params)
    if key in _PROVEN:
        return
    _, record = await measure(backend, messages, params)
    assert record.status == "completed", record.error
    assert record.finish_reason == "length" and record.output_tokens == params.max_new_tokens, (
        f"control run on {backend.label}: the reply ended by itself ({record.finish_reason}, "
        f"{record.output_tokens} of {params.max_new_tokens} tokens), so a stop test with this prompt and cap "
        f"would pass without Stop working: choose a longer prompt or a lower cap")
    _PROVEN.add(key)


async def config_reaches_the_cap(config: BackendConfig, messages: Sequence[ChatMessage],
                                 params: GenerationParams) -> None:
    """`reaches_the_cap` on a backend made from `config` for the control run alone."""
    backend = create_backend(config)
    try:
        await backend.warm_up()
        await reaches_the_cap(backend, messages, params)
    finally:
        await backend.aclose()
