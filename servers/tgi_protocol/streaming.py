"""The stand-in's streaming driver: one generation as SSE, or run whole, for every generating route.

`token_stream` admits a request, validates it, starts its generation and turns
each token into the route's own events (TGI's StreamResponse, or Messages API
chunks), with every error an in-stream event as TGI sends it. `generate_once`
runs a generation to its end for the non-streaming routes. `SSEResponse` stops
the generation when the client goes away, even while it waits in the queue.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, AsyncIterator, Callable

from starlette.responses import StreamingResponse

from servers.tgi_protocol.engines import Job
from servers.tgi_protocol.errors import InferError, incomplete_error
from servers.tgi_protocol.metrics import ServerMetrics
from servers.tgi_protocol.responses import Responder
from servers.tgi_protocol.scheduler import Scheduler
from servers.tgi_protocol.validation import ValidRequest

Render = Callable[..., list[bytes]]
"""`render(token, finish_reason, generated_text, count)`: the SSE events for one token."""


class SSEResponse(StreamingResponse):
    """An SSE stream that tells its producer when the client goes away.

    Watching `receive()` for http.disconnect notices a client that left even
    while its request waits in the queue (nothing is being sent then), and the
    body iterator is always closed, so generation stops.
    """

    media_type = "text/event-stream"

    def __init__(self, content: AsyncIterator[bytes], on_disconnect: Callable[[], None]) -> None:
        super().__init__(content, headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        self.on_disconnect = on_disconnect

    async def __call__(self, scope, receive, send) -> None:
        async def watch() -> None:
            while True:
                message = await receive()
                if message["type"] == "http.disconnect":
                    self.on_disconnect()
                    return

        watcher = asyncio.create_task(watch())
        try:
            await self.stream_response(send)
        except OSError:
            self.on_disconnect()
        finally:
            watcher.cancel()
            await self.body_iterator.aclose()


def record_sent(job: Job, count: int) -> None:
    """Note on the generation's record that its `count`-th token event goes to the transport now."""
    record = job.record
    sent_at = time.time()
    if record.first_token_sent_at_s is None:
        record.first_token_sent_at_s = sent_at
    record.last_token_sent_at_s = sent_at
    record.tokens_sent = count


class GenerationDriver:
    """Runs generations for the routes: streamed token by token, or whole."""

    def __init__(self, scheduler: Scheduler, responder: Responder, metrics: ServerMetrics) -> None:
        self.scheduler = scheduler
        self.responder = responder
        self.metrics = metrics

    def token_stream(self, path: str, prepare: Callable[[], tuple[ValidRequest, Render]],
                     closing: bytes | None = None) -> SSEResponse:
        """One generation as SSE, shared by the native and the chat streaming routes.

        `prepare()` validates the request (raising InferError) and returns the
        ValidRequest and its `Render`. As in TGI, every error is an in-stream
        event; `closing` (the chat route's `[DONE]`) ends every stream not cancelled.
        """
        job_holder: list[Job] = []

        def on_disconnect() -> None:
            if job_holder:
                job_holder[0].cancelled.set()

        async def events() -> AsyncIterator[bytes]:
            try:
                self.scheduler.admit()
            except InferError as error:
                yield self.responder.error_event(path, error)
                if closing:
                    yield closing
                return
            try:
                try:
                    valid, render = prepare()
                except InferError as error:
                    yield self.responder.error_event(path, error)
                    if closing:
                        yield closing
                    return
                job, queue = self.scheduler.start(path, valid)
                job_holder.append(job)
                count = 0
                async for item in self.scheduler.tokens(queue):
                    if item[0] == "error":
                        yield self.responder.error_event(path, item[1])
                        break
                    if item[0] == "cancelled":
                        return
                    _, token, finish_reason, generated_text = item
                    count += 1
                    rendered = render(token, finish_reason, generated_text, count)
                    if finish_reason is not None:
                        self.metrics.succeeded(job, count)
                    record_sent(job, count)
                    for event in rendered:
                        yield event
                if closing:
                    yield closing
            finally:
                if job_holder:
                    job_holder[0].cancelled.set()
                self.scheduler.release()

        return SSEResponse(events(), on_disconnect)

    async def generate_once(self, path: str, valid: ValidRequest, return_full_text: bool) -> dict[str, Any]:
        """Run a whole generation; the GenerateResponse body. Raises InferError."""
        job, queue = self.scheduler.start(path, valid)
        tokens: list[dict[str, Any]] = []
        try:
            async for item in self.scheduler.tokens(queue):
                if item[0] == "error":
                    raise item[1]
                if item[0] == "cancelled":
                    raise incomplete_error()
                _, token, finish_reason, generated_text = item
                tokens.append(token.as_json())
                if finish_reason is None:
                    continue
                self.metrics.succeeded(job, len(tokens))
                text = (valid.inputs + generated_text) if return_full_text else generated_text
                details = None
                if valid.details:
                    details = {"finish_reason": finish_reason, "generated_tokens": len(tokens),
                               "seed": valid.seed if valid.sampling else None, "prefill": [],
                               "tokens": tokens, "top_tokens": [], "best_of_sequences": None}
                return {"generated_text": text, "details": details}
        finally:
            job.cancelled.set()
        raise incomplete_error()
