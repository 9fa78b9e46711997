"""Typed errors raised at the backend edge.

Each carries the backend's label and URL and a message that tells a person
what happened and what to do. The chat handlers catch `BackendError` only;
anything else is a bug and is allowed to surface.

Configured API keys never appear in an error: a backend registers its key
(`register_secret`) and every `BackendError` is redacted when it is made, so
a server that echoes the key it was sent (as OpenAI's own 401 does) cannot
carry it into the page, the logs or the database.
"""

from __future__ import annotations

import math
from datetime import datetime, timezone
from email.utils import parsedate_to_datetime

from config import ConfigurationError  # noqa: F401  (raised by the backends too; defined with the settings)

SERVER_TEXT_LIMIT = 500  # characters of a server's own error text quoted in a message

REDACTED = "[redacted key]"
_SECRETS: set[str] = set()


def register_secret(value: str) -> None:
    """Keep `value` (a configured API key) out of every BackendError from now on."""
    if value:
        _SECRETS.add(value)


def redact(text: str) -> str:
    """`text` with every registered secret replaced (longest first, so no secret leaves a piece)."""
    for secret in sorted(_SECRETS, key=len, reverse=True):
        text = text.replace(secret, REDACTED)
    return text


def parse_retry_after(value: str | None, now: datetime | None = None) -> float | None:
    """Seconds to wait from an HTTP `Retry-After` header: delay-seconds or an HTTP date.

    None when absent or unreadable; a date in the past gives 0.
    """
    if value is None or not value.strip():
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=timezone.utc)
    return max(0.0, (when - (now or datetime.now(timezone.utc))).total_seconds())


def busy_message(status: int | None, retry_after_s: float | None) -> str:
    """'busy, retry in 7 s (HTTP 429)'; without a Retry-After 'busy (HTTP 429)'; without a status 'busy'."""
    text = "busy" if retry_after_s is None else f"busy, retry in {math.ceil(retry_after_s):d} s"
    return text if status is None else f"{text} (HTTP {status})"


def busy_hint(retry_after_s: float | None) -> str:
    """What to do about a busy server; the app never retries by itself."""
    if retry_after_s is None:
        return "Wait a moment and send again, or choose another backend."
    return "The app does not retry by itself: send again then, or choose another backend."


class BackendError(Exception):
    """A problem with a backend that a person can act on.

    `retry_after_s` is set when the server said when to try again (HTTP
    `Retry-After` on a 429 or 503); the app shows it and never retries by itself.
    """

    kind = "error"

    def __init__(self, backend: str, url: str, message: str, *, hint: str = "",
                 retry_after_s: float | None = None) -> None:
        self.backend = backend
        self.url = url
        self.message = redact(message)
        self.hint = redact(hint)
        self.retry_after_s = retry_after_s
        super().__init__(self.describe())

    def describe(self) -> str:
        where = f"{self.backend} at {self.url}" if self.url else self.backend
        text = f"{where}: {self.message}"
        return f"{text} {self.hint}".strip() if self.hint else text


class BackendUnavailable(BackendError):
    """The server cannot be reached or is not ready (connection refused, 503, model not loaded)."""

    kind = "unavailable"


class BackendTimeout(BackendError):
    """A limit ran out. `limit` says which: "connect", "read" (the transport's read timeout),
    "first_token" or "stall" (the stream watchdog, backends/watchdog.py)."""

    kind = "timeout"

    def __init__(self, backend: str, url: str, message: str, *, limit: str, hint: str = "") -> None:
        self.limit = limit
        super().__init__(backend, url, message, hint=hint)


class InputRejected(BackendError):
    """The server refused the request as invalid (too long for the context, bad parameter)."""

    kind = "rejected"


class BackendOverloaded(BackendError):
    """The server is at capacity (HTTP 429); retrying later may work."""

    kind = "overloaded"


class GenerationFailed(BackendError):
    """Generation started but failed on the server (TGI 424/500, in-stream error event, a
    malformed or unfinished stream)."""

    kind = "generation"


class ConnectionLost(GenerationFailed):
    """The connection broke after the reply had started streaming (the server crashed or
    restarted mid-reply): the text so far stays, and the server may be down now."""


# Server error types (TGI's `error_type`, llama.cpp server's and OpenAI's `error.type`) that say
# what happened better than the status does; a proxy may change the status, never these.
# (OpenAI's `invalid_request_error` is not one: it comes with 401 and 404 as well as 400.)
INPUT_ERROR_TYPES = ("validation", "template_error", "exceed_context_size_error")
OVERLOADED_ERROR_TYPES = ("overloaded",)
GENERATION_ERROR_TYPES = ("generation",)
INCOMPLETE_ERROR_TYPES = ("incomplete_generation",)


def error_for_status(status: int | None, server_text: str, *, backend: str, url: str, prefix: str,
                     retry_after_s: float | None = None, error_type: str | None = None,
                     model: str = "", path: str = "") -> BackendError:
    """The typed error for a server's error answer, the same for every HTTP kind.

    `status` is the HTTP status (None for an error event inside a stream that had already
    started), `server_text` the server's own message, `retry_after_s` its `Retry-After`,
    `error_type` the server's error type where it sends one, `prefix` the backend's variable
    prefix (so a hint names the variable to fix), `model` the configured model name if any,
    `path` the route asked for.
    A refused key is said first; then the server's error type decides where it has one (a proxy
    may change a status, not the server's own type), else the status.
    """
    said = server_text.strip()[:SERVER_TEXT_LIMIT]

    def text(summary: str) -> str:
        return f"{summary}: {said}" if said else f"{summary}."

    where = (backend, url)
    kind = (error_type or "").lower()
    check_log = "Send again; if it keeps happening, check the server's log."
    if status in (401, 403):
        return BackendUnavailable(*where, text(f"the server refused the API key (HTTP {status})"),
                                  hint=f"Set {prefix}API_KEY in .env to a key this server accepts.")
    if kind in OVERLOADED_ERROR_TYPES or status == 429:
        return BackendOverloaded(*where, text(f"the server is at capacity, {busy_message(status, retry_after_s)}"),
                                 hint=busy_hint(retry_after_s), retry_after_s=retry_after_s)
    if kind in INCOMPLETE_ERROR_TYPES:
        return GenerationFailed(*where, text("the reply ended before generation finished"), hint=check_log)
    if kind in GENERATION_ERROR_TYPES or status == 424:
        return GenerationFailed(*where, text("generation failed on the server"), hint=check_log)
    if kind in INPUT_ERROR_TYPES or status in (400, 413, 422):
        return InputRejected(*where, text("the server rejected the request"),
                             hint="Shorten the conversation or lower max new tokens, then send again.")
    if status == 404:
        if model and "model" in said.lower():
            return BackendUnavailable(*where, text(f"the server does not serve the model {model!r}"),
                                      hint=f"Set {prefix}MODEL in .env to a model the server lists, or leave it empty.")
        return BackendUnavailable(*where, text(f"{path or 'the route'} does not exist on this server (HTTP 404)"),
                                  hint=f"Check {prefix}BASE_URL in .env: it should point at the server's API.")
    if status == 503:
        if retry_after_s is not None:
            return BackendUnavailable(*where, text(f"the server is {busy_message(status, retry_after_s)}"),
                                      hint=busy_hint(retry_after_s), retry_after_s=retry_after_s)
        return BackendUnavailable(*where, text("the server is not ready (HTTP 503)"),
                                  hint="Wait for the model to finish loading, then send again.")
    if status is None:
        return GenerationFailed(*where, text("generation failed on the server"), hint=check_log)
    if status >= 500:
        return GenerationFailed(*where, text(f"server error (HTTP {status})"), hint=check_log)
    return GenerationFailed(*where, text(f"unexpected HTTP {status}"), hint=check_log)


class UnknownBackend(LookupError):
    """A backend name that is not configured; the message lists the configured ones."""

    def __init__(self, name: str, known: list[str]) -> None:
        self.name = name
        self.known = known
        super().__init__(f"Unknown backend {name!r}. Configured backends: {', '.join(known) or 'none'}.")
