"""Test helpers around the two-step Backend protocol (prepare, then stream)."""

from __future__ import annotations

from typing import AsyncIterator, Sequence

from backends.base import Backend, ChatMessage, GenerationParams, StreamChunk


async def prepared_stream(backend: Backend, messages: Sequence[ChatMessage],
                          params: GenerationParams) -> AsyncIterator[StreamChunk]:
    """Prepare, then stream; closing this generator closes the backend's stream at once (the UI's Stop)."""
    request = await backend.prepare(messages, params)
    inner = backend.stream(request)
    try:
        async for chunk in inner:
            yield chunk
    finally:
        await inner.aclose()
