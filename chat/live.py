"""Stream one measured reply into the UI.

Measurement stays per chunk (in `timing`); only rendering is batched:
- text is coalesced and sent to the browser at most every TEXT_INTERVAL_S,
  so a backend at hundreds of tokens/s does not leave the browser seconds behind;
- the metrics element is refreshed at most every METRICS_INTERVAL_S (~10 Hz),
  because each refresh re-mounts it.

`LiveReply` talks to duck-typed `message` (`stream_token`) and `metrics`
(`props`, `update`) objects, so the same code drives Chainlit and unit tests,
and a future side-by-side view runs one `LiveReply` per column.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Protocol

from backends.errors import BackendError
from timing import LiveFigures, RequestRecord, TimedStream

TEXT_INTERVAL_S = 0.04
METRICS_INTERVAL_S = 0.1


class TextSink(Protocol):
    async def stream_token(self, token: str) -> None: ...


class MetricsSink(Protocol):
    props: dict

    async def update(self) -> None: ...


def live_props(figures: LiveFigures, *, backend: str, model: str, lang: str) -> dict:
    """Props for public/elements/Metrics.jsx while streaming."""
    return {
        "state": "queued" if figures.queue_position else "streaming",
        "lang": lang,
        "backend": backend,
        "model": model,
        "queuePosition": figures.queue_position,
        "elapsedMs": round(figures.elapsed_s * 1000),
        "ttftMs": None if figures.first_token_s is None else round(figures.first_token_s * 1000, 1),
        "tokens": figures.output_tokens,
        "tokensPerS": None if figures.decode_tokens_per_s is None else round(figures.decode_tokens_per_s, 1),
        "tokensExact": figures.tokens_exact,
    }


def final_props(record: RequestRecord, *, lang: str) -> dict:
    """Props for the frozen figures once the reply has ended."""
    return {
        "state": record.status,
        "lang": lang,
        "backend": record.backend,
        "model": record.model,
        "queuePosition": None,
        "elapsedMs": round(record.total_s * 1000),
        "ttftMs": None if record.first_token_s is None else round(record.first_token_s * 1000, 1),
        "tokens": record.output_tokens,
        "tokensPerS": None if record.decode_tokens_per_s is None else round(record.decode_tokens_per_s, 1),
        "msPerToken": None if record.ms_per_output_token is None else round(record.ms_per_output_token, 2),
        "finishReason": record.finish_reason,
        "tokensExact": record.tokens_exact,
        "tokenSource": record.token_source,
        "serverTokens": record.server_output_tokens,
        "disagreement": record.count_disagreement,
    }


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
        text_interval_s: float = TEXT_INTERVAL_S,
        metrics_interval_s: float = METRICS_INTERVAL_S,
    ) -> None:
        self.timed = timed
        self.message = message
        self.metrics = metrics
        self.lang = lang
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
        self.metrics.props = final_props(record, lang=self.lang)
        await self.metrics.update()
        return ReplyOutcome("".join(self._shown), record, error)

    async def _flush_text(self) -> None:
        if self._pending:
            batch = "".join(self._pending)
            self._pending.clear()
            self._shown.append(batch)
            await self.message.stream_token(batch)

    async def _render_loop(self) -> None:
        loop = asyncio.get_running_loop()
        next_metrics = loop.time()
        while True:
            await self._flush_text()
            now = loop.time()
            if now >= next_metrics:
                self.metrics.props = live_props(
                    self.timed.live(), backend=self.timed.backend, model=self.timed.model, lang=self.lang
                )
                await self.metrics.update()
                next_metrics = now + self.metrics_interval_s
            # Sleep one text interval; tokens arriving meanwhile are batched.
            await asyncio.sleep(self.text_interval_s)
