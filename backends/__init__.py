"""Serving backends behind one interface (see base.py); registry.py builds them from .env."""

from backends.base import (
    Backend,
    BackendInfo,
    ChatMessage,
    GenerationParams,
    ServerFigures,
    StreamChunk,
    StreamLimits,
)
from backends.errors import (
    BackendError,
    BackendOverloaded,
    BackendTimeout,
    BackendUnavailable,
    ConnectionLost,
    GenerationFailed,
    InputRejected,
    UnknownBackend,
)

__all__ = [
    "Backend", "BackendInfo", "ChatMessage", "GenerationParams", "ServerFigures", "StreamChunk", "StreamLimits",
    "BackendError", "BackendOverloaded", "BackendTimeout", "BackendUnavailable", "ConnectionLost",
    "GenerationFailed", "InputRejected", "UnknownBackend",
]
