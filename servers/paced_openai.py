"""A stand-in OpenAI-protocol server that streams at an exact, known pace, and its handle.

It stands in for a fast (or slow) serving engine when a test, a benchmark or a
classroom demo needs to know exactly what was sent and when:

- `/v1/chat/completions` streams one token per chunk, token i sent at
  `start + first_token_s + i / rate` (an absolute schedule, so the pace does
  not drift however late one chunk was). The reply is ` w1 w2 ... w(n-1)`
  followed by a marker word unique to the request (`pacedend<number>x<hex>`),
  so a browser can tell exactly when the last token is on screen. With
  `stream_options.include_usage` the closing chunk carries `usage`; with
  vLLM's `continuous_usage_stats` every chunk carries the running usage.
- `/v1/models` and `/health` answer like a real engine does.
- Test-only routes under `/test/`: `GET /test/requests` lists every chat
  request with its marker, its last user message, the wall-clock time
  (`time.time()`) at which its last token was handed to the transport and
  whether the client closed the stream early; `GET /test/last` is the latest of those; `POST /test/pace`
  with `{"rate_tokens_per_s": ..., "tokens": ..., "first_token_s": ...}`
  changes the pace for later requests (`"slots": K` lets at most K replies generate at
  once, the rest wait before their first token, as in an engine whose batch is full;
  `/metrics` reports running and waiting under vLLM's gauge names). Faults for later requests, in the same body:
  `"stall_after_tokens": N, "stall_s": S` pauses S seconds after the N-th token
  (null: no stall); `"require_key": K` answers chat requests whose bearer key is
  not K with OpenAI's own 401, which quotes the key it was given (null: no key). Two more keys of that body hold only
  until the next `/test/pace` without them: `"text"` makes every reply exactly
  that text, streamed in pieces of up to `TEXT_PIECE_CHARS` characters at the
  pace (no marker; `tokens` is ignored), and `"error": {"status", "body",
  "content_type"}` makes every chat request fail with that HTTP answer (a
  server's error page, say) instead of streaming.

Run: `python -m servers.paced_openai --port P --rate 500 [--tokens 300]`.
It binds 127.0.0.1 only. From Python, `start_paced_server(rate, tokens)` runs one
in a process of its own and returns a `PacedServer` (its URLs, pace, faults and
request log); `paced_pair` starts two, a left and a right engine.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import secrets
import time
import urllib.request
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from typing import AsyncIterator, Iterator

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from servers.process import PYTHON, ServerProcess, free_port

MODEL_ID = "paced-test-model"
CONTEXT_LENGTH_TOKENS = 8192
# A set reply text streams in pieces this long, so markup arrives split mid-tag.
TEXT_PIECE_CHARS = 4


@dataclass
class Pace:
    """How the next replies are streamed."""

    rate_tokens_per_s: float
    tokens: int
    first_token_s: float = 0.0
    stall_after_tokens: int | None = None
    stall_s: float = 0.0
    require_key: str | None = None
    text: str | None = None  # the whole reply, instead of w1..w(n-1) and the marker
    error: dict | None = None  # {"status", "body", "content_type"}: every request fails so
    slots: int | None = None  # at most this many replies generate at once; the rest wait (None: no limit)


@dataclass
class RequestLog:
    """What the server did for one chat request (times are `time.time()`)."""

    number: int
    marker: str
    tokens_planned: int
    rate_tokens_per_s: float
    received_at_s: float
    last_user_text: str = ""
    first_token_sent_at_s: float | None = None
    last_token_sent_at_s: float | None = None
    tokens_sent: int = 0
    completed: bool = False
    closed_by_client: bool = False
    client_port: int | None = None
    sampling: dict = field(default_factory=dict)
    messages_count: int = 0


@dataclass
class PacedServerState:
    pace: Pace
    requests: list[RequestLog] = field(default_factory=list)
    numbers: itertools.count = field(default_factory=lambda: itertools.count(1))
    running: int = 0  # replies generating now
    waiting: int = 0  # replies waiting for a slot (`Pace.slots`)
    slot_freed: asyncio.Event = field(default_factory=asyncio.Event)

    async def take_slot(self, slots: int | None) -> bool:
        """Wait for a place among `slots` generating replies (first come, first served by wake-up order);
        whether it had to wait."""
        self.waiting += 1
        waited = False
        try:
            while slots is not None and self.running >= slots:
                waited = True
                self.slot_freed.clear()
                await self.slot_freed.wait()
        finally:
            self.waiting -= 1
        self.running += 1
        return waited

    def free_slot(self) -> None:
        self.running -= 1
        self.slot_freed.set()


def reply_tokens(count: int, marker: str) -> list[str]:
    """The reply, one token per entry: ` w1 ... w(count-1)` then the marker word."""
    return [f" w{i}" for i in range(1, count)] + [f" {marker}"]


def text_pieces(text: str) -> list[str]:
    """A set reply text as the pieces it is streamed in (at least one, even for "")."""
    return [text[i:i + TEXT_PIECE_CHARS] for i in range(0, len(text), TEXT_PIECE_CHARS)] or [""]


def _chunk(request_id: str, created: int, delta: dict, finish_reason: str | None = None) -> dict:
    return {
        "id": request_id,
        "object": "chat.completion.chunk",
        "created": created,
        "model": MODEL_ID,
        "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}],
    }


def _sse(data: dict | str) -> bytes:
    payload = data if isinstance(data, str) else json.dumps(data, ensure_ascii=False)
    return f"data: {payload}\n\n".encode("utf-8")


def _prompt_tokens(messages: list[dict]) -> int:
    """A rough prompt size (words); this server runs no tokenizer."""
    return sum(len(str(m.get("content") or "").split()) for m in messages)


def create_app(pace: Pace) -> Starlette:
    """The ASGI app; `app.state.paced` holds the pace and the request log."""
    state = PacedServerState(pace=pace)

    async def models(_: Request) -> Response:
        return JSONResponse({
            "object": "list",
            "data": [{
                "id": MODEL_ID, "object": "model", "created": 0, "owned_by": "paced-test-server",
                "max_model_len": CONTEXT_LENGTH_TOKENS,
            }],
        })

    async def health(_: Request) -> Response:
        return Response(status_code=200)

    async def chat_completions(request: Request) -> Response:
        # Arrival: when the app hands the request over, before its body is read (with many requests at
        # once, reading them queues here; the pace counts from arrival, as an engine's TTFT does).
        arrived_at_s, arrived_loop_s = time.time(), asyncio.get_running_loop().time()
        body = await request.json()
        required = state.pace.require_key
        given = request.headers.get("authorization", "").removeprefix("Bearer ").strip()
        if required is not None and given != required:
            # OpenAI's own answer quotes the key it was given.
            return JSONResponse({"error": {
                "message": f"Incorrect API key provided: {given}. You can find your API key at "
                           "https://platform.openai.com/account/api-keys.",
                "type": "invalid_request_error", "param": None, "code": "invalid_api_key"}}, status_code=401)
        messages = body.get("messages") or []
        if not messages:
            return JSONResponse(
                {"error": {"message": "messages must not be empty", "type": "BadRequestError",
                           "param": "messages", "code": 400}},
                status_code=400,
            )
        current = state.pace
        last_user_text = next((str(m.get("content") or "") for m in reversed(messages) if m.get("role") == "user"), "")
        if current.error is not None:
            state.requests.append(RequestLog(number=next(state.numbers), marker="", tokens_planned=0,
                                             rate_tokens_per_s=current.rate_tokens_per_s, received_at_s=arrived_at_s,
                                             last_user_text=last_user_text, messages_count=len(messages)))
            return Response(current.error.get("body", ""), status_code=int(current.error.get("status", 500)),
                            media_type=current.error.get("content_type", "text/html"))
        planned = current.tokens if current.text is None else len(text_pieces(current.text))
        max_tokens = body.get("max_tokens") or body.get("max_completion_tokens")
        finish_reason = "stop"
        if max_tokens is not None and int(max_tokens) < planned:
            planned, finish_reason = max(1, int(max_tokens)), "length"
        number = next(state.numbers)
        log = RequestLog(
            number=number, marker=f"pacedend{number}x{secrets.token_hex(4)}",
            tokens_planned=planned, rate_tokens_per_s=current.rate_tokens_per_s,
            received_at_s=arrived_at_s,
            last_user_text=last_user_text,
            client_port=request.client.port if request.client else None,
            messages_count=len(messages),
            sampling={key: body[key] for key in ("temperature", "top_p", "top_k", "min_p", "repetition_penalty",
                                                 "seed", "max_tokens") if key in body},
        )
        state.requests.append(log)
        tokens = reply_tokens(planned, log.marker) if current.text is None else text_pieces(current.text)[:planned]
        request_id = f"chatcmpl-paced-{number}"
        created = int(log.received_at_s)
        prompt_tokens = _prompt_tokens(messages)
        stream_options = body.get("stream_options") or {}
        include_usage = bool(stream_options.get("include_usage"))
        continuous_usage = include_usage and bool(stream_options.get("continuous_usage_stats"))

        def usage(completion_tokens: int) -> dict:
            return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                    "total_tokens": prompt_tokens + completion_tokens}

        def chunk(delta: dict, sent: int, finish: str | None = None) -> dict:
            data = _chunk(request_id, created, delta, finish)
            if continuous_usage:
                data["usage"] = usage(sent)
            return data

        if not body.get("stream"):
            await asyncio.sleep(current.first_token_s + (planned - 1) / current.rate_tokens_per_s)
            log.tokens_sent, log.completed = planned, True
            log.first_token_sent_at_s = log.last_token_sent_at_s = time.time()
            return JSONResponse({
                "id": request_id, "object": "chat.completion", "created": created, "model": MODEL_ID,
                "choices": [{"index": 0, "message": {"role": "assistant", "content": "".join(tokens)},
                             "logprobs": None, "finish_reason": finish_reason}],
                "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": planned,
                          "total_tokens": prompt_tokens + planned},
            })

        async def events() -> AsyncIterator[bytes]:
            loop = asyncio.get_running_loop()
            holding = False
            try:
                yield _sse(chunk({"role": "assistant", "content": ""}, 0))
                waited = await state.take_slot(current.slots)
                holding = True
                # From arrival; a reply that waited for a slot starts counting when it got one.
                start = (loop.time() if waited else arrived_loop_s) + current.first_token_s
                interval_s = 1.0 / current.rate_tokens_per_s
                for index, token in enumerate(tokens):
                    if index == current.stall_after_tokens:
                        start += current.stall_s  # the test's stall: later tokens move by as much
                    # Absolute schedule: lateness of one token does not delay the next ones.
                    delay_s = start + index * interval_s - loop.time()
                    if delay_s > 0:
                        await asyncio.sleep(delay_s)
                    now_s = time.time()
                    if index == 0:
                        log.first_token_sent_at_s = now_s
                    if index == len(tokens) - 1:
                        log.last_token_sent_at_s = now_s
                    log.tokens_sent = index + 1
                    yield _sse(chunk({"content": token}, index + 1))
                yield _sse(chunk({}, planned, finish_reason))
                if include_usage:
                    yield _sse({
                        "id": request_id, "object": "chat.completion.chunk", "created": created,
                        "model": MODEL_ID, "choices": [], "usage": usage(planned),
                    })
                yield _sse("[DONE]")
                log.completed = True
            finally:
                if holding:
                    state.free_slot()
                # Starlette cancels this generator when the client disconnects (the user's Stop).
                if not log.completed:
                    log.closed_by_client = True

        return StreamingResponse(events(), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache"})

    async def metrics(_: Request) -> Response:
        # The two gauges of vLLM's /metrics a load test watches, under vLLM's names.
        label = f'{{model_name="{MODEL_ID}"}}'
        return Response(f"# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{label} {state.running}\n"
                        f"# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting{label} {state.waiting}\n",
                        media_type="text/plain; version=0.0.4")

    async def test_requests(_: Request) -> Response:
        return JSONResponse([asdict(r) for r in state.requests])

    async def test_last(_: Request) -> Response:
        if not state.requests:
            return JSONResponse({"error": "no request yet"}, status_code=404)
        return JSONResponse(asdict(state.requests[-1]))

    async def test_pace(request: Request) -> Response:
        body = await request.json()
        rate = float(body.get("rate_tokens_per_s", state.pace.rate_tokens_per_s))
        tokens = int(body.get("tokens", state.pace.tokens))
        first_token_s = float(body.get("first_token_s", state.pace.first_token_s))
        stall_after = body.get("stall_after_tokens", state.pace.stall_after_tokens)
        stall_s = float(body.get("stall_s", state.pace.stall_s))
        require_key = body.get("require_key", state.pace.require_key)
        slots = body.get("slots", state.pace.slots)
        text, error = body.get("text"), body.get("error")
        if rate <= 0 or tokens < 1 or first_token_s < 0 or stall_s < 0 or not isinstance(text, (str, type(None))) \
                or not isinstance(error, (dict, type(None))) or not (slots is None or int(slots) >= 1):
            return JSONResponse({"error": "rate_tokens_per_s > 0, tokens >= 1, first_token_s >= 0, stall_s >= 0, "
                                          "text a string, error an object"}, status_code=422)
        state.pace = Pace(rate, tokens, first_token_s, None if stall_after is None else int(stall_after), stall_s,
                          None if require_key is None else str(require_key), text, error,
                          None if slots is None else int(slots))
        return JSONResponse(asdict(state.pace))

    app = Starlette(routes=[
        Route("/v1/models", models),
        Route("/health", health),
        Route("/metrics", metrics),
        Route("/v1/chat/completions", chat_completions, methods=["POST"]),
        Route("/test/requests", test_requests),
        Route("/test/last", test_last),
        Route("/test/pace", test_pace, methods=["POST"]),
    ])
    app.state.paced = state
    return app


# ---------------------------------------------------------------- a running server, from another process


@dataclass
class PacedServer:
    """A running paced server (`python -m servers.paced_openai`) and its test-only routes."""

    root_url: str
    process: ServerProcess

    @property
    def base_url(self) -> str:
        """The OpenAI base URL (what `N_BASE_URL` takes)."""
        return self.root_url + "/v1"

    def _call(self, path: str, body: dict | None = None) -> object:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(self.root_url + path, data=data,
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=10) as response:
            return json.loads(response.read())

    def set_pace(self, rate_tokens_per_s: float, tokens: int, first_token_s: float = 0.0) -> None:
        self._call("/test/pace", {"rate_tokens_per_s": rate_tokens_per_s, "tokens": tokens,
                                  "first_token_s": first_token_s})

    def set_faults(self, **faults: object) -> None:
        """Test faults for later requests: stall_after_tokens=N, stall_s=S; require_key=K (None: off)."""
        self._call("/test/pace", faults)

    def set_reply(self, *, text: str | None = None, error: dict | None = None,
                  rate_tokens_per_s: float = 200, first_token_s: float = 0.0) -> None:
        """Every reply is `text` (streamed in small pieces), or every request fails with `error`
        ({"status", "body", "content_type"}); the next `set_pace` goes back to w1..wN + marker."""
        self._call("/test/pace", {"rate_tokens_per_s": rate_tokens_per_s, "first_token_s": first_token_s,
                                  "text": text, "error": error})

    def requests(self) -> list[dict]:
        """Every chat request so far (marker, last_token_sent_at_s, closed_by_client, ...)."""
        return self._call("/test/requests")

    def stop(self) -> None:
        self.process.stop()


def start_paced_server(rate_tokens_per_s: float, tokens: int, *, name: str = "paced-openai",
                       timeout_s: float = 30.0) -> PacedServer:
    """A paced server on a free loopback port, once its /health answers."""
    port = free_port()
    command = [PYTHON, "-m", "servers.paced_openai", "--port", str(port),
               "--rate", str(rate_tokens_per_s), "--tokens", str(tokens)]
    root_url = f"http://127.0.0.1:{port}"
    process = ServerProcess(name, command).start_serving(root_url + "/health", timeout_s)
    return PacedServer(root_url, process)


@contextmanager
def paced_pair(name: str, *, tokens: tuple[int, int] = (8, 6),
               rates: tuple[float, float] = (200.0, 150.0)) -> Iterator[tuple[PacedServer, PacedServer]]:
    """Two paced servers, a left and a right engine (for rounds, votes and the leaderboard), both
    stopped on the way out (the first too if the second fails to start)."""
    servers: list[PacedServer] = []
    try:
        for side, rate, count in zip(("left", "right"), rates, tokens):
            servers.append(start_paced_server(rate_tokens_per_s=rate, tokens=count, name=f"paced-{name}-{side}"))
        yield servers[0], servers[1]
    finally:
        for server in servers:
            server.stop()


def main(argv: list[str] | None = None) -> None:
    import uvicorn

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--rate", type=float, required=True, help="tokens per second")
    parser.add_argument("--tokens", type=int, default=300, help="tokens per reply (the last is the marker)")
    parser.add_argument("--first-token-s", type=float, default=0.0, help="delay before the first token")
    args = parser.parse_args(argv)
    app = create_app(Pace(args.rate, args.tokens, args.first_token_s))
    uvicorn.run(app, host="127.0.0.1", port=args.port, log_level="warning", access_log=False)


if __name__ == "__main__":
    main()
