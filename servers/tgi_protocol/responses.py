"""Every answer the stand-in sends, checked against TGI's spec first (contract.py).

A body or SSE event that departs from the spec is still sent, so the client
sees what a broken server would send, but it is recorded; tests read the record
at GET /__contract__/violations to assert that the server kept the contract.
Every error sent is also counted in /metrics, as TGI counts its failures.
"""

from __future__ import annotations

import json
from typing import Any

from starlette.responses import JSONResponse

from servers.tgi_protocol import contract
from servers.tgi_protocol.errors import InferError
from servers.tgi_protocol.faults import Faults
from servers.tgi_protocol.metrics import ServerMetrics


class Responder:
    """Builds contract-checked responses and SSE events, and keeps the violations seen."""

    def __init__(self, metrics: ServerMetrics, faults: Faults) -> None:
        self.metrics = metrics
        self.faults = faults
        self.violations: list[dict[str, Any]] = []

    def checked(self, path: str, method: str, status: int, content_type: str | None, payload: Any) -> Any:
        """Check a payload against the spec before it is sent; record a mismatch."""
        problems = contract.violations(path, method, status, content_type, payload)
        if problems:
            self.violations.append({"path": path, "method": method.upper(), "status": status,
                                    "content_type": content_type, "problems": problems, "payload": payload})
        return payload

    def json(self, path: str, method: str, status: int, payload: Any,
             headers: dict[str, str] | None = None) -> JSONResponse:
        return JSONResponse(self.checked(path, method, status, "application/json", payload), status_code=status,
                            headers=headers)

    def sse(self, path: str, status: int, payload: Any) -> bytes:
        """One SSE event of a stream (a corrupt_next_event fault breaks it first)."""
        if status == 200:
            payload = self.faults.corrupt_next(payload)
        self.checked(path, "post", status, "text/event-stream", payload)
        return _event(payload)

    def error_event(self, path: str, error: InferError) -> bytes:
        """An error as TGI sends it inside a stream."""
        # The spec has no 200 schema for an error event; it lists the body under
        # the error's status, as text/event-stream (generate) or JSON (chat).
        content_type = "text/event-stream" if path == "/generate_stream" else "application/json"
        self.checked(path, "post", error.status, content_type, error.body())
        self.metrics.failed(error)
        return _event(error.body())

    def error_json(self, path: str, error: InferError) -> JSONResponse:
        """An error as TGI answers it outside a stream: its HTTP status and body."""
        self.metrics.failed(error)
        return self.json(path, "post", error.status, error.body(), headers=error.headers)


def _event(payload: Any) -> bytes:
    return b"data:" + json.dumps(payload, ensure_ascii=False).encode("utf-8") + b"\n\n"
