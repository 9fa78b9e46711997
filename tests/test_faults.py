"""Faults at the backend edge, against real transports and servers.

- The watchdog (backends/watchdog.py) on fake streams with tiny limits, and
  applied the same way by the chat (`ReplyPlan.open_stream`) and the load
  engine (`core.load.runner.run_level`).
- Loopback servers that send exactly the broken answers a healthy engine
  cannot be made to give: malformed or truncated stream lines, a chunk of an
  unexpected shape, a stream that ends early (cleanly or by a dropped
  connection), 429/503 with Retry-After, a 401 that echoes the API key - on
  the OpenAI-compatible backend and on both TGI routes.
- The paced test servers (real HTTP streaming) for first-token, stall and
  read timeouts, and a listening socket whose accept queue is full for the
  connect timeout.
"""

from __future__ import annotations

import asyncio
import json
import logging
import secrets
import socket
import time
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from email.utils import format_datetime
from typing import AsyncIterator

import pytest

from backends.base import ChatMessage, GenerationParams, StreamChunk, StreamLimits
from backends.errors import (
    REDACTED,
    BackendError,
    BackendOverloaded,
    BackendTimeout,
    BackendUnavailable,
    ConnectionLost,
    GenerationFailed,
    parse_retry_after,
)
from backends.openai_compat import OpenAICompatBackend
from backends.tgi import TGIBackend
from backends.watchdog import watch, watched
from core.load.prompt_sets import BenchPrompt
from core.load.runner import run_level
from core.app_state import server_may_be_down
from core.replies import empty_reply_notice, plan_reply
from core.settings import SessionSettings
from config import BackendConfig
from servers.paced_openai import PacedServer, start_paced_server
from servers.tgi_protocol import TGIServer, start_paced_tgi_server
from tests.fakes import FakeBackend, FakeReply, fake_state
from core.timing import TimedStream

ROUTES = ["messages", "generate"]
QUESTION = [ChatMessage("user", "hi")]
PARAMS = GenerationParams(temperature=0.0, max_new_tokens=50)
CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
          "<|im_start|>assistant\n")
TINY = StreamLimits(first_token_s=0.2, stall_s=0.2, prefix="LAB_")
# For scripts whose gaps must stay under the limits: wide enough margins that a loaded machine's
# late timers (tenths of a second) do not fire the watchdog by mistake.
SMALL = StreamLimits(first_token_s=0.6, stall_s=0.6, prefix="LAB_")


# ---------------------------------------------------------------- the watchdog, on fake streams


@dataclass
class FakeStream:
    """An async iterator of timed chunks: (seconds to wait first, chunk); records whether it was closed."""

    script: list[tuple[float, StreamChunk]]
    closed: bool = False

    async def run(self) -> AsyncIterator[StreamChunk]:
        try:
            for wait_s, chunk in self.script:
                await asyncio.sleep(wait_s)
                yield chunk
        finally:
            self.closed = True


async def drain(stream: AsyncIterator[StreamChunk], into: list[StreamChunk]) -> None:
    async for chunk in stream:
        into.append(chunk)


def text(word: str) -> StreamChunk:
    return StreamChunk(text=word, token_count=1)


async def test_no_first_token_names_the_limit_and_its_variable_and_closes_the_stream():
    fake = FakeStream([(0.0, StreamChunk(token_count=0)), (5.0, text("late"))])
    got: list[StreamChunk] = []
    started = time.monotonic()
    with pytest.raises(BackendTimeout) as raised:
        await drain(watch(fake.run(), TINY, label="Lab", url="http://lab"), got)
    assert 0.15 < time.monotonic() - started < 3.0  # fired at its limit, not at the late token (5 s)
    assert raised.value.limit == "first_token"
    assert str(raised.value).startswith("Lab at http://lab: no first token within 0.2 s (LAB_FIRST_TOKEN_TIMEOUT_S).")
    assert got == [StreamChunk(token_count=0)]  # an empty server event does not stop the first-token clock
    assert fake.closed


async def test_a_stall_after_text_names_the_token_it_stalled_after():
    fake = FakeStream([(0.0, text("a")), (0.05, StreamChunk(text="bc", token_count=2)), (0.05, text("d")),
                       (5.0, text("never"))])
    got: list[StreamChunk] = []
    with pytest.raises(BackendTimeout) as raised:
        await drain(watch(fake.run(), SMALL, label="Lab", url="http://lab"), got)
    assert raised.value.limit == "stall"
    assert "stalled: no token for 0.6 s after token 4 (LAB_STALL_TIMEOUT_S)" in str(raised.value)
    assert "".join(c.text for c in got) == "abcd"
    assert fake.closed


async def test_a_slow_but_steady_reply_longer_than_both_limits_completes():
    # Each gap 0.2 s under its 0.6 s limit (a margin a loaded machine's late timers stay inside);
    # the whole reply ~1.3 s, longer than both.
    fake = FakeStream([(0.1, StreamChunk(token_count=0)), (0.1, text(" w0"))] + [(0.22, text(f" w{i}"))
                                                                                 for i in range(1, 6)]
                      + [(0.0, StreamChunk(token_count=0, finish_reason="stop"))])
    got: list[StreamChunk] = []
    await drain(watch(fake.run(), SMALL, label="Lab", url="http://lab"), got)
    assert len(got) == 8 and got[-1].finish_reason == "stop"


async def test_time_in_the_embedded_queue_does_not_count_and_its_turn_restarts_the_clock():
    # 1.4 s in the queue, over twice the 0.6 s first-token limit, then the text 0.1 s after the turn.
    waited = FakeStream([(0.0, StreamChunk(queue_position=2)), (0.7, StreamChunk(queue_position=1)),
                         (0.7, StreamChunk(queue_position=0)), (0.1, text("hi")),
                         (0.0, StreamChunk(finish_reason="stop"))])
    got: list[StreamChunk] = []
    await drain(watch(waited.run(), SMALL, label="Lab", url="in-process"), got)
    assert [c.text for c in got if c.text] == ["hi"]
    silent_after_turn = FakeStream([(0.0, StreamChunk(queue_position=1)), (0.3, StreamChunk(queue_position=0)),
                                    (5.0, text("late"))])
    started = time.monotonic()
    with pytest.raises(BackendTimeout, match="no first token within 0.2 s"):
        await drain(watch(silent_after_turn.run(), TINY, label="Lab", url="in-process"), [])
    # 0.3 s in the queue, then the 0.2 s limit (the clock did not start at the request: not ~0.2 s;
    # it fired at its limit: well before the late token at 5.3 s).
    assert 0.45 < time.monotonic() - started < 3.0


async def test_on_the_real_embedded_model_its_queue_does_not_count_towards_the_first_token_limit():
    """A request waits in the embedded model's queue longer than its first-token limit (another
    request holds the model) and still gets its reply: its clock starts at its turn."""
    from backends.llamacpp import LlamaCppBackend

    limit_s = 3.0  # generous: the first token takes 0.01-0.5 s here, more on a loaded machine
    llama = LlamaCppBackend(BackendConfig(name="llama_cpp", kind="llamacpp", label="llama.cpp",
                                          first_token_timeout_s=limit_s, stall_timeout_s=10.0))
    await llama.warm_up()
    request = await llama.prepare([ChatMessage("user", "Say hi.")], GenerationParams(temperature=0.0, max_new_tokens=4))
    await drain(watched(llama, request), [])  # a first generation pages the model in
    ahead = llama.model.enqueue()  # another request holds the model, as a long reply would
    chunks: list[StreamChunk] = []
    reply = asyncio.create_task(drain(watched(llama, request), chunks))
    try:
        await asyncio.sleep(limit_s + 1.5)
        assert not reply.done() and chunks == [StreamChunk(queue_position=1)]
    finally:
        llama.model.leave(ahead)
    await asyncio.wait_for(reply, 60)
    assert chunks[1] == StreamChunk(queue_position=0) and any(c.text for c in chunks)


async def test_closing_the_watched_stream_closes_the_backend_stream():
    fake = FakeStream([(0.0, text("a")), (0.0, text("b"))])
    stream = watch(fake.run(), TINY, label="Lab", url="http://lab")
    assert (await stream.__anext__()).text == "a"
    await stream.aclose()
    assert fake.closed


async def test_the_chat_and_the_load_engine_apply_the_same_watchdog():
    backend = FakeBackend("slowpoke", label="Slowpoke", stream_limits=TINY,
                          replies=[FakeReply(["a", "b"], interval_s=0.5)])
    state = fake_state(backend)
    settings = SessionSettings.initial(state.defaults, state.presets, state.registry.names)
    plan = await plan_reply(state, settings, [], "hi")
    timed = plan.open_stream()
    with pytest.raises(BackendTimeout) as in_chat:
        await drain(timed, [])
    await timed.aclose()
    assert "no first token within 0.2 s (LAB_FIRST_TOKEN_TIMEOUT_S)" in str(in_chat.value)

    backend.replies = [FakeReply(["a", "b"], interval_s=0.5)]
    level = await run_level(backend, [BenchPrompt(tuple(QUESTION), None, None, "test:1")], concurrency=1, requests=1,
                            params=PARAMS)
    (outcome,) = level.outcomes
    assert not outcome.ok and outcome.record.status == "error"
    assert outcome.error == str(in_chat.value)


async def test_a_reply_that_finishes_without_text_is_not_shown_as_a_normal_answer():
    backend = FakeBackend("mute", replies=[FakeReply([])])
    request = await backend.prepare(QUESTION, PARAMS)
    timed = TimedStream(watched(backend, request), backend="mute", model="m")
    await drain(timed, [])
    record = timed.finish("completed")
    notice = empty_reply_notice(record, "")
    assert notice is not None
    assert notice.render("en").startswith("⚠️ The engine finished without any text (0 tokens, finish reason: stop)")
    assert empty_reply_notice(record, "some text") is None


def test_which_failures_make_the_app_probe_the_backend_again():
    where = ("B", "http://b")
    assert server_may_be_down(BackendUnavailable(*where, "down"))
    assert server_may_be_down(BackendTimeout(*where, "slow", limit="stall"))
    assert server_may_be_down(ConnectionLost(*where, "lost"))
    assert not server_may_be_down(GenerationFailed(*where, "bad json"))
    assert not server_may_be_down(BackendOverloaded(*where, "busy"))
    assert not server_may_be_down(None)


# ---------------------------------------------------------------- Retry-After and redaction, pure


def test_retry_after_in_seconds_or_as_an_http_date():
    now = datetime(2026, 5, 1, 12, 0, 0, tzinfo=timezone.utc)
    assert parse_retry_after("7", now) == 7.0
    assert parse_retry_after(format_datetime(now + timedelta(seconds=42), usegmt=True), now) == 42.0
    assert parse_retry_after(format_datetime(now - timedelta(seconds=5), usegmt=True), now) == 0.0
    assert parse_retry_after(None, now) is None and parse_retry_after("soon", now) is None
    assert parse_retry_after("-3", now) is None


def test_a_registered_key_is_redacted_from_every_backend_error():
    from backends.errors import register_secret

    key = "sk-unit-" + secrets.token_hex(12)
    register_secret(key)
    error = BackendUnavailable("B", "http://b", f"Incorrect API key provided: {key}.", hint=f"not {key}")
    assert key not in str(error) and key not in error.describe() and key not in error.hint
    assert f"Incorrect API key provided: {REDACTED}." in str(error)


# ---------------------------------------------------------------- canned servers


@dataclass
class Canned:
    """What a canned server answers to every POST (GETs get a healthy JSON answer):
    a status line, headers and body parts sent as HTTP/1.1 chunks, or the connection
    dropped before the body's end (`drop`)."""

    status: str = "200 OK"
    headers: dict[str, str] = field(default_factory=lambda: {"content-type": "text/event-stream"})
    parts: list[bytes] = field(default_factory=list)
    drop: bool = False
    get_status: str = "200 OK"
    get_body: bytes = json.dumps({"object": "list", "data": [{"id": "m", "max_model_len": 2048}]}).encode()
    posts: int = 0
    bodies: list[bytes] = field(default_factory=list)
    authorizations: list[str] = field(default_factory=list)


@asynccontextmanager
async def canned_server(canned: Canned) -> AsyncIterator[str]:
    """A loopback HTTP server answering as `canned` says; yields its root URL."""

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                lines = head.decode("latin-1").split("\r\n")
                headers = {k.strip().lower(): v.strip() for k, _, v in (l.partition(":") for l in lines[1:] if l)}
                body = await reader.readexactly(int(headers.get("content-length", 0)))
                if lines[0].startswith("GET"):
                    writer.write(f"HTTP/1.1 {canned.get_status}\r\ncontent-type: application/json\r\n"
                                 f"content-length: {len(canned.get_body)}\r\n\r\n".encode() + canned.get_body)
                    await writer.drain()
                    continue
                canned.posts += 1
                canned.bodies.append(body)
                canned.authorizations.append(headers.get("authorization", ""))
                head_out = f"HTTP/1.1 {canned.status}\r\n" + "".join(f"{k}: {v}\r\n" for k, v in canned.headers.items())
                writer.write((head_out + "transfer-encoding: chunked\r\nconnection: close\r\n\r\n").encode())
                for part in canned.parts:
                    writer.write(f"{len(part):x}\r\n".encode() + part + b"\r\n")
                    await writer.drain()
                    await asyncio.sleep(0.01)
                if canned.drop:
                    writer.transport.abort()  # mid-body: no terminating chunk, as a killed server
                    return
                writer.write(b"0\r\n\r\n")
                await writer.drain()
                writer.close()
                return
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()

    server = await asyncio.start_server(answer, "127.0.0.1", 0)
    try:
        yield f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    finally:
        server.close()
        await server.wait_closed()


def sse(data: object) -> bytes:
    return f"data: {data if isinstance(data, str) else json.dumps(data)}\n\n".encode()


def oai_chunk(delta: dict, finish: str | None = None) -> bytes:
    return sse({"id": "c", "object": "chat.completion.chunk", "created": 0, "model": "m",
                "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})


def tgi_chat_chunk(content: str, finish: str | None = None) -> bytes:
    return sse({"id": "", "created": 0, "model": "m", "system_fingerprint": "3.3.6-native",
                "choices": [{"index": 0, "delta": {"role": "assistant", "content": content}, "logprobs": None,
                             "finish_reason": finish}], "usage": None})


def tgi_token_event(index: int, word: str, last: bool = False) -> bytes:
    return sse({"index": index, "token": {"id": index, "text": word, "logprob": 0.0, "special": False},
                "top_tokens": [], "generated_text": "..." if last else None,
                "details": {"finish_reason": "length", "generated_tokens": index, "input_length": 3, "seed": None}
                if last else None})


def words(route: str | None, count: int) -> list[bytes]:
    """`count` text pieces as the protocol streams them (route None: OpenAI / vLLM)."""
    if route is None:
        return [oai_chunk({"role": "assistant", "content": ""})] + [oai_chunk({"content": f" w{i}"})
                                                                    for i in range(1, count + 1)]
    if route == "messages":
        return [tgi_chat_chunk(f" w{i}") for i in range(1, count + 1)]
    return [tgi_token_event(i, f" w{i}") for i in range(1, count + 1)]


def make_backend(root_url: str, route: str | None, **config) -> OpenAICompatBackend | TGIBackend:
    if route is None:
        return OpenAICompatBackend(BackendConfig(name="vllm", kind="vllm", label="vLLM", base_url=root_url + "/v1",
                                                 options={"model": "m"}, **config))
    return TGIBackend(BackendConfig(name="tgi", kind="tgi", label="TGI", base_url=root_url,
                                    options={"route": route, "chat_template": CHATML}, **config))


async def stream_reply(backend, received: list[str] | None = None) -> list[str]:
    """Prepare and stream one reply under the backend's watchdog; text pieces land in `received`."""
    received = [] if received is None else received
    request = await backend.prepare(QUESTION, PARAMS)
    stream = watched(backend, request)
    try:
        async for chunk in stream:
            if chunk.text:
                received.append(chunk.text)
    finally:
        await stream.aclose()
        await backend.aclose()
    return received


ALL_KINDS = [None, *ROUTES]  # None: the OpenAI-compatible (vLLM) backend
KIND_IDS = ["openai", "tgi-messages", "tgi-generate"]
VARIABLE = {None: "VLLM_", "messages": "TGI_", "generate": "TGI_"}


@pytest.mark.parametrize("route", ALL_KINDS, ids=KIND_IDS)
async def test_a_stream_that_ends_without_its_final_event_is_not_a_complete_reply(route):
    canned = Canned(parts=words(route, 3))
    received: list[str] = []
    async with canned_server(canned) as url:
        with pytest.raises(GenerationFailed) as raised:
            await stream_reply(make_backend(url, route), received)
    assert received == [" w1", " w2", " w3"]  # the text so far was passed on
    assert "the server closed the stream before the reply finished" in str(raised.value)
    assert url in str(raised.value) and not isinstance(raised.value, ConnectionLost)


@pytest.mark.parametrize("route", ALL_KINDS, ids=KIND_IDS)
async def test_a_connection_dropped_mid_reply_says_so_not_unreachable(route):
    canned = Canned(parts=words(route, 3), drop=True)
    received: list[str] = []
    async with canned_server(canned) as url:
        backend = make_backend(url, route)
        with pytest.raises(ConnectionLost) as raised:
            await stream_reply(backend, received)
    message = str(raised.value)
    assert received == [" w1", " w2", " w3"]
    assert "the connection was lost mid-reply (after " in message, message
    assert "not reachable" not in message and "Start" not in message
    assert isinstance(raised.value, GenerationFailed)


@pytest.mark.parametrize("route", ALL_KINDS, ids=KIND_IDS)
async def test_a_line_that_is_not_json_is_quoted_in_a_clear_error(route):
    broken = b'data: {"id": "c", "choices": [{"delta": {"content": "trunc' + b"\n\n"
    canned = Canned(parts=[*words(route, 2), broken, *words(route, 1)])
    received: list[str] = []
    async with canned_server(canned) as url:
        with pytest.raises(GenerationFailed) as raised:
            await stream_reply(make_backend(url, route), received)
    message = str(raised.value)
    assert received == [" w1", " w2"]
    assert "not JSON" in message and '"trunc' in message, message


@pytest.mark.parametrize("route", ALL_KINDS, ids=KIND_IDS)
async def test_a_truncated_last_line_is_a_clear_error(route):
    """The body ends cleanly in the middle of a line: no complete final event ever came."""
    canned = Canned(parts=[*words(route, 2), b'data: {"id": "c", "cho'])
    received: list[str] = []
    async with canned_server(canned) as url:
        with pytest.raises(GenerationFailed) as raised:
            await stream_reply(make_backend(url, route), received)
    assert received == [" w1", " w2"]
    message = str(raised.value)
    assert "not JSON" in message or "closed the stream before the reply finished" in message, message


@pytest.mark.parametrize(("route", "chunk", "expected"), [
    (None, {"id": "c", "choices": "oops"}, '"choices" is a str, not a list'),
    (None, {"id": "c", "choices": [{"delta": {"content": 42}}]}, '"delta.content" is a int, not text'),
    (None, ["not", "an", "object"], "the chunk is a JSON list, not an object"),
    ("messages", {"id": "", "created": 0, "model": "m", "choices": "oops"}, "outside TGI's schema"),
    ("generate", {"index": 1, "token": "oops"}, "outside TGI's schema"),
    ("generate", ["not", "an", "object"], "unexpected event"),
], ids=["openai-choices", "openai-content", "openai-list", "tgi-messages", "tgi-generate", "tgi-list"])
async def test_a_chunk_of_an_unexpected_shape_names_the_problem(route, chunk, expected):
    canned = Canned(parts=[*words(route, 1), sse(chunk)])
    async with canned_server(canned) as url:
        with pytest.raises(GenerationFailed) as raised:
            await stream_reply(make_backend(url, route))
    assert expected in str(raised.value), str(raised.value)


def retry_after_date(seconds: int) -> str:
    return format_datetime(datetime.now(timezone.utc) + timedelta(seconds=seconds), usegmt=True)


@pytest.mark.parametrize("route", ALL_KINDS, ids=KIND_IDS)
@pytest.mark.parametrize(("status", "retry_after", "error_type"), [
    ("429 Too Many Requests", "7", BackendOverloaded),
    ("503 Service Unavailable", "7", BackendUnavailable),
    ("429 Too Many Requests", "date", BackendOverloaded),
])
async def test_busy_with_retry_after_says_when_and_is_not_retried(route, status, retry_after, error_type):
    header = retry_after_date(8) if retry_after == "date" else retry_after
    if route is None:
        body = json.dumps({"error": {"message": "Too many requests", "type": "rate_limit"}}).encode()
    elif status.startswith("429"):
        body = json.dumps({"error": "Model is overloaded", "error_type": "overloaded"}).encode()
    else:
        body = b"Service Unavailable"  # a proxy in front of TGI
    canned = Canned(status=status, headers={"content-type": "application/json", "retry-after": header}, parts=[body])
    async with canned_server(canned) as url:
        with pytest.raises(error_type) as raised:
            await stream_reply(make_backend(url, route))
    message = str(raised.value)
    assert "busy, retry in 7 s" in message or "busy, retry in 8 s" in message, message
    assert 6 <= raised.value.retry_after_s <= 8
    assert "does not retry by itself" in message
    assert canned.posts == 1  # one request: no automatic retry


@pytest.mark.parametrize("route", ALL_KINDS, ids=KIND_IDS)
async def test_busy_without_retry_after_still_says_busy(route):
    canned = Canned(status="429 Too Many Requests", headers={"content-type": "application/json"},
                    parts=[b'{"error": "Model is overloaded", "error_type": "overloaded"}'])
    async with canned_server(canned) as url:
        with pytest.raises(BackendOverloaded) as raised:
            await stream_reply(make_backend(url, route))
    assert "busy" in str(raised.value) and raised.value.retry_after_s is None
    assert canned.posts == 1


@pytest.mark.parametrize("route", ALL_KINDS, ids=KIND_IDS)
async def test_a_server_that_echoes_the_key_cannot_put_it_in_an_error(route, caplog):
    key = "sk-lab-" + secrets.token_urlsafe(24)
    echo = json.dumps({"error": {"message": f"Incorrect API key provided: {key}. Fix it.",
                                 "type": "invalid_request_error", "code": "invalid_api_key"}})
    canned = Canned(status="401 Unauthorized", headers={"content-type": "application/json"},
                    parts=[echo.encode()])
    caplog.set_level(logging.DEBUG)  # everything the transports log, at their most verbose
    async with canned_server(canned) as url:
        with pytest.raises(BackendUnavailable) as raised:
            await stream_reply(make_backend(url, route, api_key=key))
    assert canned.authorizations == [f"Bearer {key}"]  # the key did go to the server
    message = str(raised.value)
    assert key not in message and REDACTED in message and "API_KEY" in message, message
    logged = "\n".join(f"{record.getMessage()} {record.args!r}" for record in caplog.records)
    assert key not in logged, "a debug log printed the key (a header or the echoing body)"


@pytest.mark.parametrize("route", ALL_KINDS, ids=KIND_IDS)
async def test_status_probes_redact_an_echoed_key_too(route):
    """The backend list shows why a backend is down: that reason must not carry the key either."""
    key = "sk-lab-" + secrets.token_urlsafe(24)
    canned = Canned(get_status="401 Unauthorized",
                    get_body=json.dumps({"error": {"message": f"Incorrect API key provided: {key}."}}).encode())
    async with canned_server(canned) as url:
        backend = (OpenAICompatBackend(BackendConfig(name="gw", kind="openai", label="Gateway", api_key=key,
                                                     base_url=url + "/v1"))
                   if route is None else make_backend(url, route, api_key=key))
        with pytest.raises(BackendUnavailable) as raised:
            await backend.health()
        await backend.aclose()
    assert "HTTP 401" in str(raised.value)
    assert key not in str(raised.value) and REDACTED in str(raised.value), str(raised.value)


# ---------------------------------------------------------------- timeouts on real servers


@pytest.fixture(scope="module")
def paced_openai() -> PacedServer:
    server = start_paced_server(rate_tokens_per_s=50, tokens=40, name="paced-openai-faults")
    yield server
    server.stop()


@pytest.fixture(scope="module")
def paced_tgi() -> TGIServer:
    server = start_paced_tgi_server(rate_tokens_per_s=50, tokens=40, first_token_s=1.5, name="tgi-paced-faults")
    yield server
    server.process.stop()


def paced_vllm(server: PacedServer, **config) -> OpenAICompatBackend:
    return OpenAICompatBackend(BackendConfig(name="vllm", kind="vllm", label="vLLM", base_url=server.base_url,
                                             **config))


async def test_first_token_timeout_on_a_real_stream_ends_the_request(paced_openai: PacedServer):
    paced_openai.set_pace(50, 40, first_token_s=1.5)
    try:
        with pytest.raises(BackendTimeout) as raised:
            await stream_reply(paced_vllm(paced_openai, first_token_timeout_s=0.4))
    finally:
        paced_openai.set_pace(50, 40, first_token_s=0.0)
    assert raised.value.limit == "first_token"
    assert f"vLLM at {paced_openai.base_url}: no first token within 0.4 s (VLLM_FIRST_TOKEN_TIMEOUT_S)." \
        in str(raised.value)
    # The server notices the client going (at the latest when its first token, due at 1.5 s, finds
    # no one); a request left running would instead complete its 40 tokens.
    deadline = time.monotonic() + 15
    while not ((last := paced_openai.requests()[-1])["closed_by_client"] or last["completed"]):
        assert time.monotonic() < deadline, last
        await asyncio.sleep(0.1)
    assert last["closed_by_client"] and not last["completed"], "the request kept running on the server"


async def test_stall_timeout_on_a_real_stream_keeps_the_text_so_far(paced_openai: PacedServer):
    paced_openai.set_faults(stall_after_tokens=5, stall_s=2.0)
    received: list[str] = []
    try:
        with pytest.raises(BackendTimeout) as raised:
            await stream_reply(paced_vllm(paced_openai, stall_timeout_s=0.5), received)
    finally:
        paced_openai.set_faults(stall_after_tokens=None, stall_s=0.0)
    assert raised.value.limit == "stall"
    assert "stalled: no token for 0.5 s after token 5 (VLLM_STALL_TIMEOUT_S)" in str(raised.value)
    assert "".join(received) == " w1 w2 w3 w4 w5"


async def test_read_timeout_mid_reply_says_it_is_the_read_timeout(paced_openai: PacedServer):
    paced_openai.set_faults(stall_after_tokens=3, stall_s=2.0)
    try:
        with pytest.raises(BackendTimeout) as raised:
            await stream_reply(paced_vllm(paced_openai, timeout_s=0.5, stall_timeout_s=30))
    finally:
        paced_openai.set_faults(stall_after_tokens=None, stall_s=0.0)
    assert raised.value.limit == "read"
    assert "no data from the server for 0.5 s mid-reply" in str(raised.value)
    assert "(VLLM_TIMEOUT_S, the read timeout)" in str(raised.value)


@pytest.mark.parametrize("route", ROUTES)
async def test_first_token_timeout_on_tgi_ends_the_generation(route, paced_tgi: TGIServer):
    backend = TGIBackend(BackendConfig(name="tgi", kind="tgi", label="TGI", base_url=paced_tgi.url,
                                       options={"route": route}, first_token_timeout_s=0.4))
    with pytest.raises(BackendTimeout) as raised:
        await stream_reply(backend)
    assert f"TGI at {paced_tgi.url}: no first token within 0.4 s (TGI_FIRST_TOKEN_TIMEOUT_S)." in str(raised.value)
    await paced_tgi.wait_until(lambda: _idle(paced_tgi), timeout_s=15, what="the generation to be cancelled")
    assert (await paced_tgi.generations())[-1]["status"] == "cancelled"


async def _idle(server: TGIServer) -> bool:
    return await server.in_flight() == 0


@pytest.fixture
def full_listener():
    """A listening socket whose accept queue is full: further connection attempts are not answered
    (on Linux the SYN is dropped), so a client can only time out connecting."""
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("127.0.0.1", 0))
    listener.listen(0)
    port = listener.getsockname()[1]
    queued = []
    for _ in range(2):  # a backlog of 0 still queues one connection; this one fills it
        client = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        client.settimeout(0.3)
        try:
            client.connect(("127.0.0.1", port))
        except TimeoutError:
            client.close()
            break
        queued.append(client)
    probe = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    probe.settimeout(0.3)
    with pytest.raises(TimeoutError):  # the premise: this kernel really drops the next SYN
        probe.connect(("127.0.0.1", port))
    probe.close()
    yield f"http://127.0.0.1:{port}"
    for client in queued:
        client.close()
    listener.close()


@pytest.mark.parametrize("route", ALL_KINDS, ids=KIND_IDS)
async def test_connect_timeout_names_the_connect_limit(route, full_listener):
    backend = make_backend(full_listener, route, connect_timeout_s=0.5)
    started = time.monotonic()
    with pytest.raises(BackendTimeout) as raised:
        await backend.health()
    await backend.aclose()
    assert 0.4 < time.monotonic() - started < 3.0
    assert raised.value.limit == "connect"
    assert f"could not connect within 0.5 s ({VARIABLE[route]}CONNECT_TIMEOUT_S)" in str(raised.value)


@pytest.mark.parametrize("route", ALL_KINDS, ids=KIND_IDS)
async def test_nothing_listening_is_still_not_reachable_with_the_start_hint(route):
    with socket.socket() as placeholder:
        placeholder.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{placeholder.getsockname()[1]}"
    backend = make_backend(url, route)
    with pytest.raises(BackendUnavailable) as raised:
        await stream_reply(backend)
    assert "not reachable" in str(raised.value) and "BASE_URL" in str(raised.value)


def test_every_backend_error_kind_still_describes_itself():
    for error in (BackendTimeout("B", "u", "m", limit="connect"), ConnectionLost("B", "u", "m")):
        assert isinstance(error, BackendError) and error.describe() == "B at u: m"
