"""The one interface every serving backend implements.

A backend turns (messages, generation parameters) into an async stream of
`StreamChunk`s. It knows nothing about Chainlit or timing: the `timing` module
wraps any backend stream and measures it, so the chat UI and the benchmark get
their numbers from the same code.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import AsyncIterator, Literal, Protocol, Sequence, runtime_checkable

Role = Literal["system", "user", "assistant"]


@dataclass(frozen=True)
class ChatMessage:
    """One turn of a conversation."""

    role: Role
    content: str

    def as_dict(self) -> dict[str, str]:
        return {"role": self.role, "content": self.content}


@dataclass(frozen=True)
class GenerationParams:
    """Sampling settings sent with one request."""

    temperature: float = 0.7
    top_p: float = 0.95
    max_new_tokens: int = 256
    seed: int | None = None


@dataclass(frozen=True)
class ServerFigures:
    """What the server itself reported about a request (vLLM usage, TGI details)."""

    source: str
    output_tokens: int | None = None
    input_tokens: int | None = None
    finish_reason: str | None = None


@dataclass(frozen=True)
class StreamChunk:
    """A piece of a streamed reply.

    `token_count` is the exact number of generated tokens this chunk carries,
    or None when the protocol does not say (then the measurement marks its
    token count as estimated). A chunk may carry no text: a status update such
    as `queue_position`, or the server's closing figures.
    """

    text: str = ""
    token_count: int | None = 0
    finish_reason: str | None = None
    server_figures: ServerFigures | None = None
    queue_position: int | None = None


@dataclass(frozen=True)
class BackendInfo:
    """What a backend says about itself, for the UI and the benchmark table."""

    model_id: str
    context_length: int | None = None
    server_version: str | None = None
    max_input_tokens: int | None = None
    details: dict[str, str] = field(default_factory=dict)


@runtime_checkable
class Backend(Protocol):
    """A serving stack the app can talk to.

    Implementations raise only `backends.errors.BackendError` subclasses for
    problems a person can fix (server down, input too long, overloaded).
    """

    name: str
    kind: str
    label: str
    url: str

    def stream(
        self, messages: Sequence[ChatMessage], params: GenerationParams
    ) -> AsyncIterator[StreamChunk]:
        """Stream the assistant's reply. The request is sent on first iteration;
        closing the iterator (`aclose()`) ends the request on the server."""
        ...

    async def health(self) -> None:
        """Return when the backend can serve; raise BackendUnavailable with the reason otherwise."""
        ...

    async def info(self) -> BackendInfo:
        """Model id, context length and server version, as far as the server says."""
        ...

    async def count_prompt_tokens(self, messages: Sequence[ChatMessage]) -> int | None:
        """Tokens the prompt will take once templated, or None if the backend cannot tell."""
        ...

    async def aclose(self) -> None:
        """Release connections (and nothing shared with other sessions)."""
        ...
