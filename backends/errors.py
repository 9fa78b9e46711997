"""Typed errors raised at the backend edge.

Each carries the backend's label and URL and a message that tells a person
what happened and what to do. The chat handlers catch `BackendError` only;
anything else is a bug and is allowed to surface.
"""

from __future__ import annotations

from config import ConfigurationError  # noqa: F401  (raised by the backends too; defined with the settings)


class BackendError(Exception):
    """A problem with a backend that a person can act on."""

    kind = "error"

    def __init__(self, backend: str, url: str, message: str, *, hint: str = "") -> None:
        self.backend = backend
        self.url = url
        self.message = message
        self.hint = hint
        super().__init__(self.describe())

    def describe(self) -> str:
        where = f"{self.backend} at {self.url}" if self.url else self.backend
        text = f"{where}: {self.message}"
        return f"{text} {self.hint}".strip() if self.hint else text


class BackendUnavailable(BackendError):
    """The server cannot be reached or is not ready (connection refused, 503, model not loaded)."""

    kind = "unavailable"


class BackendTimeout(BackendError):
    """The server did not answer in time."""

    kind = "timeout"


class InputRejected(BackendError):
    """The server refused the request as invalid (too long for the context, bad parameter)."""

    kind = "rejected"


class BackendOverloaded(BackendError):
    """The server is at capacity (HTTP 429); retrying later may work."""

    kind = "overloaded"


class GenerationFailed(BackendError):
    """Generation started but failed on the server (TGI 424/500, in-stream error event)."""

    kind = "generation"


class UnknownBackend(LookupError):
    """A backend name that is not configured; the message lists the configured ones."""

    def __init__(self, name: str, known: list[str]) -> None:
        self.name = name
        self.known = known
        super().__init__(f"Unknown backend {name!r}. Configured backends: {', '.join(known) or 'none'}.")


