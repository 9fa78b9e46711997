"""A fake Backend with queued replies, for testing the reply flow and rounds without servers."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import AsyncIterator, Sequence

from backends.base import BackendInfo, ChatMessage, GenerationParams, PreparedRequest, StreamChunk, StreamLimits
from backends.errors import BackendOverloaded, BackendUnavailable
from backends.registry import Registry
from core.app_state import AppState
from config import ChatDefaults


@dataclass
class FakeReply:
    """One queued reply: its words, the pace, and optionally a failure after some words."""

    words: Sequence[str]
    interval_s: float = 0.01
    fail_after: int | None = None
    close_s: float = 0.0  # how long closing the stream takes (the embedded model's worker finishing its step)
    tokens_per_word: int = 1  # tokens each chunk carries (llama.cpp puts several in one around multi-byte text)


@dataclass
class FakeBackend:
    """Implements the Backend protocol; records what it was asked and when it streamed."""

    name: str
    label: str = ""
    kind: str = "openai"
    url: str = "http://10.0.0.1:8000/v1"
    in_process: bool = False
    replies: list[FakeReply] = field(default_factory=list)
    available: bool = True
    context_length: int = 4096
    stand_in: str | None = None  # as BackendInfo.stand_in: what it only stands in for
    requests: list[PreparedRequest] = field(default_factory=list)
    started_at: list[float] = field(default_factory=list)
    ended_at: list[float] = field(default_factory=list)
    closed: int = 0
    stream_limits: StreamLimits = StreamLimits(first_token_s=60.0, stall_s=30.0, prefix="FAKE_")

    def __post_init__(self) -> None:
        self.label = self.label or self.name

    async def prepare(self, messages: Sequence[ChatMessage], params: GenerationParams) -> PreparedRequest:
        if not self.available:
            raise BackendUnavailable(self.label, self.url, "the server is not reachable.")
        return PreparedRequest(messages=tuple(messages), params=params, model=f"{self.name}-model",
                               sent={"temperature": params.temperature})

    async def stream(self, request: PreparedRequest) -> AsyncIterator[StreamChunk]:
        loop = asyncio.get_running_loop()
        self.requests.append(request)
        self.started_at.append(loop.time())
        reply = self.replies.pop(0) if self.replies else FakeReply(["ok"])
        try:
            yield StreamChunk(token_count=0)
            for index, word in enumerate(reply.words):
                if reply.fail_after is not None and index == reply.fail_after:
                    raise BackendOverloaded(self.label, self.url, "Model is overloaded.")
                await asyncio.sleep(reply.interval_s)
                yield StreamChunk(text=word, token_count=reply.tokens_per_word)
            yield StreamChunk(token_count=0, finish_reason="stop")
        finally:
            if reply.close_s:
                await asyncio.sleep(reply.close_s)
            self.closed += 1
            self.ended_at.append(loop.time())

    async def health(self) -> None:
        if not self.available:
            raise BackendUnavailable(self.label, self.url, "the server is not reachable.")

    async def info(self) -> BackendInfo:
        return BackendInfo(model_id=f"{self.name}-model", context_length=self.context_length, stand_in=self.stand_in)

    async def count_prompt_tokens(self, messages: Sequence[ChatMessage]) -> int | None:
        return sum(len(m.content.split()) + 4 for m in messages)

    def start_up(self) -> None:
        pass

    def pending_warm_up(self) -> str | None:
        return None

    async def warm_up(self) -> None:
        return None

    async def engine_snapshot(self):
        return None

    async def aclose(self) -> None:
        return None


def fake_state(*backends: FakeBackend) -> AppState:
    """An AppState over fake backends, with no database."""
    registry = Registry({backend.name: backend for backend in backends})
    state = AppState(registry=registry, defaults=ChatDefaults(backend=backends[0].name),
                     presets={"none": ""}, database_url="sqlite:////nonexistent/dir/for/tests.db")
    state.storage_problem = "no database in this test"
    state._storage_tried = True  # never opened (see AppState.storage)
    return state
