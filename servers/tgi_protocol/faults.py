"""The stand-in's test faults (not part of TGI): armed by POST /__test__/faults, each used once.

- `{"fail_after_tokens": N, "error_type": "generation"}`: the next generation
  fails after N tokens with an in-stream error (or "incomplete_generation").
- `{"http_status": 429}` (or 422, 424, 500): the next streaming request is
  answered with that HTTP status and TGI's error body instead of a stream;
  `"retry_after": "7"` beside it adds that `Retry-After` header.
- `{"corrupt_next_event": {"drop": "token"}}` (or `{"set": {"token.id": "5"}}`)
  breaks the next SSE event of a stream, so a test sees the contract check record it.
- `{"unhealthy": true}` makes /health answer 503 (until set false).
- `{"hold_after_tokens": N}` pauses the next generation after its N-th token
  (its record says `held`) until `{"release_holds": true}` is posted or its
  client goes away; a hold ends by itself after HOLD_LIMIT_S.
"""

from __future__ import annotations

import json
from typing import Any

from servers.tgi_protocol.engines import Job
from servers.tgi_protocol.errors import InferError, injected_error, overloaded_error, validation_error


class Faults:
    """The faults armed now, and the generations a hold fault paused."""

    def __init__(self) -> None:
        self.armed: dict[str, Any] = {}
        self.held_jobs: list[Job] = []  # generations given a hold_after_tokens fault, until released

    def update(self, payload: dict[str, Any]) -> dict[str, Any]:
        """Arm what `payload` names (releasing held generations first if it says so); all armed now."""
        if payload.pop("release_holds", False):
            for job in self.held_jobs:
                job.released.set()
            self.held_jobs.clear()
        self.armed.update(payload)
        return self.armed

    @property
    def unhealthy(self) -> bool:
        return bool(self.armed.get("unhealthy"))

    def arm(self, job: Job) -> None:
        """Give a new generation the armed fail_after_tokens and hold_after_tokens faults."""
        if self.armed.get("fail_after_tokens") is not None:
            job.fail_after_tokens = int(self.armed.pop("fail_after_tokens"))
            job.fail_error_type = self.armed.pop("error_type", "generation")
        if self.armed.get("hold_after_tokens") is not None:
            job.hold_after_tokens = int(self.armed.pop("hold_after_tokens"))
            self.held_jobs.append(job)

    def status_error(self) -> InferError | None:
        """The armed `http_status` fault, as the error to answer the next streaming request with (as an
        older TGI or a proxy in front of it would), with its `Retry-After` header if one is armed."""
        status = self.armed.pop("http_status", None)
        if status is None:
            return None
        error = {422: validation_error("injected test rejection"), 429: overloaded_error(),
                 424: injected_error("generation", 0),
                 500: injected_error("incomplete_generation", 0)}[int(status)]
        retry_after = self.armed.pop("retry_after", None)
        if retry_after is not None:
            error.headers["Retry-After"] = str(retry_after)
        return error

    def corrupt_next(self, payload: Any) -> Any:
        """`payload`, broken as the armed corrupt_next_event fault says (which it uses up), or as it is."""
        fault = self.armed.pop("corrupt_next_event", None)
        return payload if fault is None else corrupted(payload, fault)


def corrupted(payload: Any, fault: dict[str, Any]) -> Any:
    """A copy of `payload` broken the way a test fault asks, to show that the contract check
    catches it: `{"drop": "token"}` removes a field, `{"set": {"token.id": "5"}}` replaces one
    (dotted paths; a number steps into a list, e.g. "choices.0.delta.content")."""
    broken = json.loads(json.dumps(payload))

    def parent_of(dotted: str) -> tuple[Any, Any]:
        *steps, last = dotted.split(".")
        target = broken
        for step in steps:
            target = target[int(step)] if isinstance(target, list) else target[step]
        return target, int(last) if isinstance(target, list) else last

    if fault.get("drop"):
        target, key = parent_of(fault["drop"])
        del target[key]
    for dotted, value in (fault.get("set") or {}).items():
        target, key = parent_of(dotted)
        target[key] = value
    return broken
