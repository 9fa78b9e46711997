"""The OpenAI-protocol parsing, on chunks recorded from a real vLLM 0.32 server.

Recordings (tests/recordings/):
- continuous-usage-multi-token: `continuous_usage_stats` with `--stream-interval 4`,
  so chunks hold 1, 4, 4 and 1 tokens;
- continuous-usage-chinese: Chinese output, where vLLM sends empty-text chunks for
  tokens that end inside a UTF-8 character;
- include-usage-only: what kind "openai" asks for: no counts until the closing usage;
- in-band-error: an error event after the stream started;
- context-too-long.json: the HTTP 400 body for a prompt over max_model_len.

And two llama.cpp server (kind "openai") stream shapes, hand-written in its
format (each file says where the format comes from): older builds put usage
and timings on the finish chunk, newer ones on a separate `choices: []` chunk.

The error mapping is checked end to end through the openai client against a
loopback server that replays those recorded bodies (with 400/429/401/500) or
stays silent: answers a healthy vLLM cannot be made to give on demand.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from backends.base import ChatMessage, GenerationParams, ServerFigures, StreamChunk
from backends.errors import (
    BackendOverloaded,
    BackendTimeout,
    BackendUnavailable,
    GenerationFailed,
    InputRejected,
)
from backends.openai_compat import OpenAICompatBackend, error_message, parse_chunk, server_root
from config import BackendConfig
from tests.streams import prepared_stream
from core.figures import final_props
from core.timing import StreamMeter
from core.streaming import measure_prepared

RECORDINGS = Path(__file__).parent / "recordings"
USAGE_SOURCE = "vLLM usage"


def recorded_chunks(name: str) -> list[dict]:
    """The JSON of every `data:` event in a recorded SSE stream, up to `[DONE]`."""
    chunks = []
    for line in (RECORDINGS / name).read_text(encoding="utf-8").splitlines():
        if not line.startswith("data: "):
            continue
        payload = line[len("data: "):]
        if payload == "[DONE]":
            break
        chunks.append(json.loads(payload))
    return chunks


def parse_all(chunks: list[dict], usage_source: str = USAGE_SOURCE) -> list[StreamChunk]:
    """Parse a stream as the backend does (no running count until a chunk carries one)."""
    parsed, so_far = [], None
    for data in chunks:
        chunk, so_far = parse_chunk(data, so_far, usage_source=usage_source)
        if chunk is not None:
            parsed.append(chunk)
    return parsed


def record_of(parsed: list[StreamChunk], backend: str = "vllm"):
    meter = StreamMeter(clock=iter(range(100)).__next__)
    for chunk in parsed:
        meter.observe(chunk)
    return meter.finish("completed", backend=backend, model="m")


MULTI_TOKEN = recorded_chunks("vllm-0.32-continuous-usage-multi-token.sse")


def test_role_delta_is_an_empty_event_that_counts_nothing():
    """The role chunk carries no text and no token, but it is the server's first byte."""
    role_delta = MULTI_TOKEN[0]
    assert role_delta["choices"][0]["delta"]["role"] == "assistant"
    assert parse_chunk(role_delta, 0, usage_source=USAGE_SOURCE) == (StreamChunk(text="", token_count=0), 0)


def test_content_chunk_counts_the_usage_delta():
    chunk, so_far = parse_chunk(MULTI_TOKEN[1], 0, usage_source=USAGE_SOURCE)
    assert chunk == StreamChunk(text="Hello", token_count=1)
    assert so_far == 1


def test_multi_token_chunk_counts_all_its_tokens():
    chunk, so_far = parse_chunk(MULTI_TOKEN[2], 1, usage_source=USAGE_SOURCE)
    assert chunk.text == ", welcome to my"
    assert chunk.token_count == 4
    assert so_far == 5


def test_finish_reason_rides_on_its_chunk():
    chunk, _ = parse_chunk(MULTI_TOKEN[4], 9, usage_source=USAGE_SOURCE)
    assert (chunk.text, chunk.token_count, chunk.finish_reason) == (" world", 1, "length")


def test_final_usage_chunk_becomes_server_figures():
    final = MULTI_TOKEN[-1]
    assert final["choices"] == []
    chunk, so_far = parse_chunk(final, 10, usage_source=USAGE_SOURCE)
    assert chunk == StreamChunk(
        text="", token_count=0,
        server_figures=ServerFigures(source=USAGE_SOURCE, output_tokens=10, input_tokens=36),
    )
    assert so_far == 10


def test_whole_stream_counts_match_server_usage_exactly():
    parsed = parse_all(MULTI_TOKEN)
    assert "".join(c.text for c in parsed) == "Hello, welcome to my little corner of the world"
    assert [c.token_count for c in parsed] == [0, 1, 4, 4, 1, 0]
    # vLLM's usage on its finish chunk is cumulative: the final count, and that chunk's one token.
    assert parsed[-2].finish_reason == "length" and parsed[-2].server_figures.output_tokens == 10
    record = record_of(parsed)
    assert (record.output_tokens, record.tokens_exact, record.count_disagreement) == (10, True, None)
    assert record.server_output_tokens == 10 and record.server_input_tokens == 36


def test_tokens_inside_a_utf8_character_are_counted_without_text():
    parsed = parse_all(recorded_chunks("vllm-0.32-continuous-usage-chinese.sse"))
    text = "".join(c.text for c in parsed)
    assert "晨" in text and "\ufffd" not in text
    empty_but_counted = [c for c in parsed if not c.text and c.token_count]
    assert empty_but_counted, "vLLM sends a chunk per token even when the text is held back"
    assert sum(c.token_count for c in parsed) == parsed[-1].server_figures.output_tokens == 20


def test_include_usage_only_marks_counts_unknown_until_the_server_says():
    parsed = parse_all(recorded_chunks("vllm-0.32-include-usage-only.sse"))
    assert [c.token_count for c in parsed[:-1]] == [0, None, None, None, None]
    assert parsed[-1].server_figures.output_tokens == 10
    meter = StreamMeter(clock=iter(range(100)).__next__)
    for chunk in parsed:
        meter.observe(chunk)
    record = meter.finish("completed", backend="openai", model="m")
    # Four chunks held ten tokens: the estimate is replaced by the server's exact count.
    assert (record.output_tokens, record.tokens_exact) == (10, True)
    assert "usage" in record.token_source


LLAMACPP_SHAPES = {
    "usage on the finish chunk (older builds)": "llamacpp-server-usage-on-finish-chunk.sse",
    "usage chunk after the finish chunk (newer builds)": "llamacpp-server-usage-chunk-after-finish.sse",
}
LLAMACPP_USAGE = "llama.cpp server usage"


@pytest.mark.parametrize("recording", LLAMACPP_SHAPES.values(), ids=LLAMACPP_SHAPES.keys())
def test_llamacpp_server_usage_is_final_and_its_timings_are_kept(recording):
    """Three tokens in three chunks without counts: the server's usage replaces the estimate
    (not added to it), and its timings are kept, wherever the server put them."""
    parsed = parse_all(recorded_chunks(recording), usage_source=LLAMACPP_USAGE)
    assert "".join(c.text for c in parsed) == "Hello there!"
    assert [c.token_count for c in parsed if c.text] == [None, None, None]
    assert sum(c.token_count or 0 for c in parsed) == 0  # no chunk claims the server's tokens as its own
    record = record_of(parsed, backend="llama.cpp server")
    assert (record.output_tokens, record.tokens_exact, record.count_disagreement) == (3, True, None)
    assert record.finish_reason == "stop"
    server = record.server
    assert "llama.cpp server timings" in server.source and LLAMACPP_USAGE in server.source
    assert (server.output_tokens, server.input_tokens) == (3, 12)
    assert server.prompt_s == pytest.approx(0.0352) and server.decode_s == pytest.approx(0.0486)
    assert server.decode_tokens_per_s == pytest.approx(61.728, abs=0.001)


def test_llamacpp_server_timings_on_a_finish_chunk_without_usage_are_kept():
    """Newer builds asked without include_usage: the timings ride on the finish chunk alone."""
    finish = next(data for data in recorded_chunks("llamacpp-server-usage-chunk-after-finish.sse")
                  if data["choices"] and data["choices"][0]["finish_reason"])
    timings = recorded_chunks("llamacpp-server-usage-chunk-after-finish.sse")[-1]["timings"]
    chunk, _ = parse_chunk({**finish, "timings": timings}, None, usage_source=LLAMACPP_USAGE)
    assert chunk.finish_reason == "stop" and chunk.token_count == 0
    assert chunk.server_figures.source == "llama.cpp server timings"
    assert chunk.server_figures.prompt_s == pytest.approx(0.0352)


def test_error_message_from_the_context_length_error():
    body = json.loads((RECORDINGS / "vllm-0.32-context-too-long.json").read_text())
    assert error_message(body).startswith("This model's maximum context length is 2048 tokens.")
    assert error_message(body["error"]) == error_message(body)  # the openai package keeps the inner dict


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        ({"object": "error", "message": "old vLLM shape"}, "old vLLM shape"),
        ({"detail": [{"msg": "field required"}, {"msg": "bad type"}]}, "field required; bad type"),
        ("plain text error", "plain text error"),
        (None, "fallback"),
    ],
)
def test_error_message_shapes(body, expected):
    assert error_message(body, fallback="fallback") == expected


def test_server_root():
    assert server_root("http://127.0.0.1:8000/v1") == "http://127.0.0.1:8000"
    assert server_root("http://host/proxy/v1/") == "http://host/proxy"
    assert server_root("http://host:8080") == "http://host:8080"


class CannedServer:
    """A loopback HTTP server that answers every request with the same bytes (or never answers).

    For the answers a healthy vLLM cannot be made to give on demand: an in-band
    error event, 429, 401, silence. The bodies are vLLM's own shapes.
    """

    def __init__(self, response: bytes | None) -> None:
        self.response = response
        self.server: asyncio.base_events.Server | None = None

    @classmethod
    def replying(cls, status: str, body: bytes, content_type: str = "application/json") -> "CannedServer":
        head = f"HTTP/1.1 {status}\r\ncontent-type: {content_type}\r\nconnection: close\r\n"
        return cls(head.encode() + f"content-length: {len(body)}\r\n\r\n".encode() + body)

    async def __aenter__(self) -> str:
        self.server = await asyncio.start_server(self._answer, "127.0.0.1", 0)
        return f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}/v1"

    async def __aexit__(self, *exc) -> None:
        self.server.close()
        await self.server.wait_closed()

    async def _answer(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await self._answer_after_headers(await reader.readuntil(b"\r\n\r\n"), reader, writer)

    async def _answer_after_headers(self, headers: bytes, reader: asyncio.StreamReader,
                                    writer: asyncio.StreamWriter) -> None:
        length = next(
            (int(line.split(b":")[1]) for line in headers.split(b"\r\n") if line.lower().startswith(b"content-length")),
            0,
        )
        await reader.readexactly(length)
        if self.response is None:
            await reader.read()  # say nothing until the client gives up
        else:
            writer.write(self.response)
            await writer.drain()
        writer.close()


class LlamaServerStandIn(CannedServer):
    """Answers /v1/models like llama.cpp's server and every chat request with one recorded stream,
    after as long as the recording's prompt took (its timings say 35.2 ms): a reply whose first
    token came before the server's own prefill ended would be impossible, and its prompt
    figures are then "not reported" (core.timing.possible_server_figures)."""

    PREFILL_S = 0.05

    MODELS = json.dumps({"object": "list", "data": [{"id": "smollm2-135m-instruct", "object": "model",
                                                     "owned_by": "llamacpp"}]}).encode()

    async def _answer(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        headers = await reader.readuntil(b"\r\n\r\n")
        if headers.startswith(b"GET ") and b"/models" in headers.split(b"\r\n")[0]:
            head = "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\nconnection: close\r\n"
            writer.write(head.encode() + f"content-length: {len(self.MODELS)}\r\n\r\n".encode() + self.MODELS)
            await writer.drain()
            writer.close()
            return
        await asyncio.sleep(self.PREFILL_S)
        await super()._answer_after_headers(headers, reader, writer)


async def stream_all(base_url: str, received: list[str] | None = None, **config) -> list[str]:
    """Stream a reply from `base_url` with the vLLM backend; the text pieces land in `received`."""
    backend = OpenAICompatBackend(
        BackendConfig(name="vllm", kind="vllm", label="vLLM", base_url=base_url,
                      options={"model": "smollm2-135m-instruct"}, **config)
    )
    received = [] if received is None else received
    try:
        async for chunk in prepared_stream(backend, [ChatMessage("user", "hi")], GenerationParams(max_new_tokens=10)):
            received.append(chunk.text)
    finally:
        await backend.aclose()
    return received


async def test_in_band_error_event_raises_generation_failed_after_the_text_so_far():
    body = (RECORDINGS / "vllm-0.32-in-band-error.sse").read_bytes()
    received: list[str] = []
    async with CannedServer.replying("200 OK", body, "text/event-stream") as base_url:
        with pytest.raises(GenerationFailed) as raised:
            await stream_all(base_url, received)
    assert [text for text in received if text] == ["Hello", ", welcome to my", " little corner of the"]
    assert "Internal server error" in str(raised.value)
    assert base_url in str(raised.value)


@pytest.mark.parametrize(
    ("status", "error_type", "expected_in_message"),
    [
        ("400 Bad Request", InputRejected, "maximum context length is 2048 tokens"),
        ("429 Too Many Requests", BackendOverloaded, "maximum context length"),
        ("401 Unauthorized", BackendUnavailable, "VLLM_API_KEY"),
        ("500 Internal Server Error", GenerationFailed, "HTTP 500"),
    ],
)
async def test_http_errors_become_typed_errors(status, error_type, expected_in_message):
    body = (RECORDINGS / "vllm-0.32-context-too-long.json").read_bytes()
    async with CannedServer.replying(status, body) as base_url:
        with pytest.raises(error_type) as raised:
            await stream_all(base_url)
    assert expected_in_message in str(raised.value)
    assert base_url in str(raised.value)


async def test_silent_server_times_out():
    async with CannedServer(None) as base_url:
        with pytest.raises(BackendTimeout) as raised:
            await stream_all(base_url, timeout_s=0.5)
    assert "VLLM_TIMEOUT_S" in str(raised.value)


@pytest.mark.parametrize("recording", LLAMACPP_SHAPES.values(), ids=LLAMACPP_SHAPES.keys())
async def test_llamacpp_server_reply_shows_the_exact_count_and_the_servers_timings(recording):
    """Kind "openai" against llama.cpp's server, through the backend, the measurement and the
    figures the UI shows: 3 tokens (not 6, not estimated) and the server's own timings, named."""
    body = (RECORDINGS / recording).read_bytes()
    async with LlamaServerStandIn.replying("200 OK", body, "text/event-stream") as base_url:
        backend = OpenAICompatBackend(BackendConfig(name="llamacpp-server", kind="openai",
                                                    label="llama.cpp server", base_url=base_url))
        try:
            request = await backend.prepare([ChatMessage("user", "hi")], GenerationParams(max_new_tokens=10))
            text, record = await measure_prepared(backend, request)
        finally:
            await backend.aclose()
    assert text == "Hello there!"
    props = final_props(record, lang="en", request=request)
    assert (props["tokens"], props["tokensExact"], props["disagreement"]) == (3, True, None)
    server = props["timeline"]["server"]
    assert server["source"] == "llama.cpp server usage + llama.cpp server timings"
    assert (server["promptMs"], server["decodeTokensPerS"], server["promptTokensPerS"]) == (35.2, 61.7, 340.9)
    assert (server["decodeMs"], server["outputTokens"], server["inputTokens"]) == (48.6, 3, 12)
