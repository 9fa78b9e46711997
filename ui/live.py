"""Stream one measured reply into the UI.

Measurement stays per chunk (in `timing`); only rendering is batched:
- text is coalesced and sent to the browser at most every TEXT_INTERVAL_S,
  so a backend at hundreds of tokens/s does not leave the browser seconds behind;
- the metrics element is refreshed at most every METRICS_INTERVAL_S (~10 Hz),
  because each refresh re-mounts it.

`LiveReply` talks to duck-typed `message` (`stream_token`) and `metrics`
(`props`, `update`) objects, so the same code drives Chainlit and unit tests,
and one `LiveReply` drives a chat reply (compare rounds draw all their columns
as one element, core/rounds.py).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Protocol

from backends.base import PreparedRequest
from backends.errors import BackendError
from core.figures import final_props, ignored_lines, live_props
from core.timing import RequestRecord, TimedStream

TEXT_INTERVAL_S = 0.04
METRICS_INTERVAL_S = 0.1


class TextSink(Protocol):
    async def stream_token(self, token: str) -> None: ...


class MetricsSink(Protocol):
    props: dict

    async def update(self) -> None: ...


@dataclass
class ReplyOutcome:
    """What happened: the text shown, the record, and the error if any."""

    text: str
    record: RequestRecord
    error: BackendError | None = None


class LiveReply:
    """Drives one reply: consume the timed stream, render text and figures."""

    def __init__(
        self,
        timed: TimedStream,
        message: TextSink,
        metrics: MetricsSink,
        *,
        lang: str = "en",
        request: PreparedRequest | None = None,
        engine_at_start: str | None = None,
        text_interval_s: float = TEXT_INTERVAL_S,
        metrics_interval_s: float = METRICS_INTERVAL_S,
    ) -> None:
        self.timed = timed
        self.message = message
        self.metrics = metrics
        self.lang = lang
        self.request = request
        self.engine_at_start = engine_at_start
        self.text_interval_s = text_interval_s
        self.metrics_interval_s = metrics_interval_s
        self._pending: list[str] = []
        self._shown: list[str] = []

    async def run(self) -> ReplyOutcome:
        """Stream to the end, a backend error, or cancellation (the user's Stop)."""
        renderer = asyncio.create_task(self._render_loop())
        status, error = "completed", None
        try:
            async for chunk in self.timed:
                if chunk.text:
                    self._pending.append(chunk.text)
        except BackendError as failure:
            status, error = "error", failure
        except asyncio.CancelledError:
            # Stop pressed: the backend stream is closed below; the partial reply stays.
            status = "stopped"
        finally:
            renderer.cancel()
            await self.timed.aclose()
        await self._flush_text()
        record = self.timed.finish(status, error=error.describe() if error else None)
        self.metrics.props = final_props(record, lang=self.lang, request=self.request,
                                         engine_at_start=self.engine_at_start)
        await self.metrics.update()
        return ReplyOutcome("".join(self._shown), record, error)

    async def _flush_text(self) -> None:
        if self._pending:
            batch = "".join(self._pending)
            self._pending.clear()
            self._shown.append(batch)
            await self.message.stream_token(batch)

    async def _render_loop(self) -> None:
        # The first drawing waits one interval: the request leaves (and its clock starts) first,
        # so no drawing of ours can sit between the clock starting and the request leaving (the
        # figures already show "starting" from the message's first send).
        loop = asyncio.get_running_loop()
        next_metrics = loop.time() + self.metrics_interval_s
        while True:
            await asyncio.sleep(self.text_interval_s)
            await self._flush_text()
            now = loop.time()
            if now >= next_metrics:
                self.metrics.props = live_props(
                    self.timed.live(), backend=self.timed.backend, model=self.timed.model, lang=self.lang,
                    ignored=ignored_lines(self.request),
                )
                await self.metrics.update()
                next_metrics = now + self.metrics_interval_s
            # Tokens arriving during the next sleep are batched.
