"""The TGI backend against a TGI-protocol server serving the real bundled model.

Both routes (Messages API and native /generate_stream) stream real text with
exact token counts that agree with the server's own figures; TGI's errors
(422, 429, an error event inside the stream) and an unreachable server each
become the typed error with a message naming the backend and its URL; the
LoRA adapter id travels the way TGI expects; closing the stream stops the
generation on the server. After every test, the server must not have sent a
single response or event outside TGI's OpenAPI spec, and every request the
backend sent must match the spec's request schemas.
"""

from __future__ import annotations

import asyncio
import socket
from contextlib import suppress

import huggingface_hub.constants
import pytest
from huggingface_hub import AsyncInferenceClient

from backends.base import ChatMessage, GenerationParams
from backends.errors import (
    BackendError,
    BackendOverloaded,
    BackendTimeout,
    BackendUnavailable,
    ConfigurationError,
    GenerationFailed,
    InputRejected,
)
from backends.tgi import TGIBackend
from config import BackendConfig
from servers.tgi_protocol import contract
from tests.fixtures_app import closed_loopback_port
from tests.fixtures_tgi import TGI_LABEL, TGI_MAX_INPUT_TOKENS, TGI_MAX_TOTAL_TOKENS
from tests.streams import prepared_stream
from core.streaming import measure

ROUTES = ["messages", "generate"]
ROUTE_PATHS = {"messages": "/v1/chat/completions", "generate": "/generate_stream"}
QUESTION = [ChatMessage("user", "What is the capital of France?")]
# Greedy, the bundled model answers this in 8 tokens, the last one its end-of-sequence token.
SHORT_ANSWER = [ChatMessage("user", "What is the capital of France? One word.")]
# With greedy decoding the bundled model writes 400+ tokens for this one.
LONG_REPLY = [ChatMessage("user", "Write a very long story about a dragon and a knight.")]
TOO_LONG = [ChatMessage("user", "word " * (TGI_MAX_INPUT_TOKENS + 200))]
SHORT = GenerationParams(temperature=0.0, max_new_tokens=8)
LONG = GenerationParams(temperature=0.0, max_new_tokens=300)
# Tests that need a generation still running hold it here (the server's hold_after_tokens fault):
# a fast machine would otherwise finish LONG before the test looks.
HOLD_AFTER_TOKENS = 8
CHATML_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


@pytest.fixture(autouse=True)
async def server_kept_the_contract(tgi_server):
    """After each test: no response or event outside the spec, no request outside it either."""
    violations_before = len(await tgi_server.violations())
    await tgi_server.clear_requests()
    yield
    assert (await tgi_server.violations())[violations_before:] == []
    problems = [(r["path"], r["request_schema_problems"]) for r in await tgi_server.requests()
                if r["request_schema_problems"]]
    assert problems == []


async def paths_requested(tgi_server) -> list[str]:
    return [request["path"] for request in await tgi_server.requests()]


async def last_body(tgi_server, path: str) -> dict:
    return [request for request in await tgi_server.requests() if request["path"] == path][-1]["body"]


def assert_names_backend(error: BackendError, tgi_server, *server_words: str) -> None:
    message = str(error)
    assert TGI_LABEL in message and tgi_server.url in message, message
    for words in server_words:
        assert words in message, message


# ---------------------------------------------------------------- streaming


@pytest.mark.parametrize("route", ROUTES)
async def test_streams_real_text_with_exact_token_counts(route, tgi_backend_factory, tgi_server):
    backend = tgi_backend_factory(route)
    params = GenerationParams(temperature=0.7, top_p=0.9, max_new_tokens=24, seed=7)

    text, record = await measure(backend, QUESTION, params)

    assert text.strip()
    assert record.tokens_exact and record.count_disagreement is None
    assert record.output_tokens == record.server_output_tokens > 1
    # One chunk per token, arriving one by one (the Messages API's end token has no text: no chunk).
    if route == "generate":
        assert len(record.chunk_gaps_s) == record.output_tokens - 1
    else:
        assert record.output_tokens - 2 <= len(record.chunk_gaps_s) <= record.output_tokens - 1
    assert record.finish_reason in ("stop", "length")
    assert record.server_input_tokens == await backend.count_prompt_tokens(QUESTION)
    generation = (await tgi_server.generations())[-1]
    assert generation["path"] == ROUTE_PATHS[route]
    assert generation["generated_tokens"] == record.output_tokens
    paths = await paths_requested(tgi_server)
    expected = ["/v1/chat/completions"] if route == "messages" else ["/chat_tokenize", "/generate_stream"]
    assert paths[:len(expected)] == expected
    body = await last_body(tgi_server, ROUTE_PATHS[route])
    sent = body if route == "messages" else body["parameters"]
    assert sent["seed"] == 7 and sent["top_p"] == 0.9 and sent["temperature"] == 0.7
    if route == "messages":
        assert body["stream"] is True and body["stream_options"] == {"include_usage": True}
        assert body["max_tokens"] == 24
    else:
        assert body["parameters"]["details"] is True and body["parameters"]["do_sample"] is True
        assert body["parameters"]["max_new_tokens"] == 24


@pytest.mark.parametrize("route", ROUTES)
async def test_reply_that_ends_by_itself_counts_but_hides_the_end_token(route, tgi_backend_factory, tgi_server):
    backend = tgi_backend_factory(route)
    params = GenerationParams(temperature=0.0, max_new_tokens=40)
    chunks = [chunk async for chunk in prepared_stream(backend, SHORT_ANSWER, params)]

    text = "".join(chunk.text for chunk in chunks)
    assert text == "The capital of France is Paris."
    assert "<|im_end|>" not in text
    figures = [chunk.server_figures for chunk in chunks if chunk.server_figures]
    assert len(figures) == 1 and figures[0].source == ("TGI usage" if route == "messages" else "TGI details")
    finishing = [chunk for chunk in chunks if chunk.finish_reason]
    assert len(finishing) == 1 and finishing[0].text == "" and finishing[0].finish_reason == "stop"
    if route == "generate":
        # One event per token, the end-of-sequence token included (counted, not shown).
        token_chunks = [chunk for chunk in chunks if chunk.token_count]
        assert all(chunk.token_count == 1 for chunk in token_chunks)
        assert token_chunks[-1] is finishing[0]
        assert figures[0].output_tokens == len(token_chunks) < params.max_new_tokens
        assert figures[0].finish_reason == "eos_token"
    else:
        # The Messages API's chunks carry no counts: text chunks are estimates, empty ones count
        # nothing, and the closing usage is the exact count (the end token is one of them).
        assert any(chunk.text for chunk in chunks) and any(not chunk.text for chunk in chunks)
        assert all(chunk.token_count is None for chunk in chunks if chunk.text)
        assert all(chunk.token_count == 0 for chunk in chunks if not chunk.text)
        visible = [chunk for chunk in chunks if chunk.text]
        assert figures[0].output_tokens == len(visible) + 1 < params.max_new_tokens
    _, record = await measure(backend, SHORT_ANSWER, params)
    assert record.tokens_exact and record.count_disagreement is None
    assert record.output_tokens == figures[0].output_tokens


async def test_both_routes_give_the_same_greedy_reply(tgi_backend_factory, tgi_server):
    """Temperature 0 is greedy on both routes; the native prompt is the server's own templating."""
    params = GenerationParams(temperature=0.0, max_new_tokens=20)
    replies = []
    for route in ROUTES:
        backend = tgi_backend_factory(route)
        text, record = await measure(backend, QUESTION, params)
        replies.append((text, record.output_tokens))
    assert replies[0] == replies[1] and replies[0][0].strip()
    native = (await last_body(tgi_server, "/generate_stream"))["parameters"]
    # TGI refuses temperature 0 on the native route: greedy is do_sample=false, no sampling settings.
    assert native["do_sample"] is False
    assert not {"temperature", "top_p", "seed"} & set(native)


@pytest.mark.parametrize("template_source", ["inline", "file"])
async def test_generate_route_with_a_configured_chat_template(template_source, tgi_backend_factory,
                                                              tgi_server, tmp_path):
    template = CHATML_TEMPLATE
    if template_source == "file":
        path = tmp_path / "chatml.jinja"
        path.write_text(CHATML_TEMPLATE, encoding="utf-8")
        template = str(path)
    backend = tgi_backend_factory("generate", chat_template=template)

    text, record = await measure(backend, QUESTION, SHORT)

    assert text.strip() and record.tokens_exact and record.count_disagreement is None
    body = await last_body(tgi_server, "/generate_stream")
    assert body["inputs"] == "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n"
    assert "/chat_tokenize" not in await paths_requested(tgi_server)
    assert await backend.count_prompt_tokens(QUESTION) == record.server_input_tokens


# ---------------------------------------------------------------- info and health


async def test_info_and_health(tgi_backend_factory, tgi_server):
    backend = tgi_backend_factory()
    await backend.health()
    info = await backend.info()
    assert info.model_id == tgi_server.model_id
    assert info.context_length == TGI_MAX_TOTAL_TOKENS
    assert info.max_input_tokens == TGI_MAX_INPUT_TOKENS
    assert info.server_version == contract.spec_version()


async def test_unhealthy_server_is_unavailable(tgi_backend_factory, tgi_server):
    backend = tgi_backend_factory()
    await tgi_server.set_faults(unhealthy=True)
    try:
        with pytest.raises(BackendUnavailable) as caught:
            await backend.health()
    finally:
        await tgi_server.set_faults(unhealthy=False)
    assert_names_backend(caught.value, tgi_server, "unhealthy")
    await backend.health()


# ---------------------------------------------------------------- TGI's errors


@pytest.mark.parametrize("route", ROUTES)
async def test_input_longer_than_the_server_allows_is_rejected(route, tgi_backend_factory, tgi_server):
    backend = tgi_backend_factory(route)
    with pytest.raises(InputRejected) as caught:
        await measure(backend, TOO_LONG, SHORT)
    assert_names_backend(caught.value, tgi_server, f"must have less than {TGI_MAX_INPUT_TOKENS} tokens",
                         "Shorten the conversation")


@pytest.mark.parametrize("route", ROUTES)
async def test_max_new_tokens_past_the_total_is_rejected(route, tgi_backend_factory, tgi_server):
    backend = tgi_backend_factory(route)
    params = GenerationParams(temperature=0.0, max_new_tokens=TGI_MAX_TOTAL_TOKENS)
    with pytest.raises(InputRejected) as caught:
        await measure(backend, QUESTION, params)
    assert_names_backend(caught.value, tgi_server, f"`max_new_tokens` must be <= {TGI_MAX_TOTAL_TOKENS}",
                         "lower max new tokens")


async def in_flight_is(tgi_server, count: int) -> bool:
    return await tgi_server.in_flight() == count


@pytest.mark.parametrize("route", ROUTES)
async def test_overloaded_server_gives_backend_overloaded(route, tgi_backend_factory, tgi_server):
    """Two requests hold the server's two slots (one generating, one queued); a third is refused.
    The first generation is held after a few tokens, so both slots stay taken however fast the model is."""
    backend = tgi_backend_factory(route)
    await tgi_server.set_faults(hold_after_tokens=HOLD_AFTER_TOKENS)
    generating = prepared_stream(backend, LONG_REPLY, LONG)
    queued = prepared_stream(backend, LONG_REPLY, LONG)
    waiting = None
    try:
        await anext(generating)
        await tgi_server.wait_until_held()
        # The second is held too: it waits behind the first on this one-at-a-time engine, but an engine
        # that runs both at once (the paced one, a real TGI) would otherwise finish it at once.
        await tgi_server.set_faults(hold_after_tokens=HOLD_AFTER_TOKENS)
        waiting = asyncio.create_task(anext(queued))
        await tgi_server.wait_until(lambda: in_flight_is(tgi_server, 2), what="two requests in flight")

        with pytest.raises(BackendOverloaded) as caught:
            await measure(backend, QUESTION, SHORT)
        assert_names_backend(caught.value, tgi_server, "Model is overloaded", "Wait a moment")
    finally:
        if waiting is not None:
            waiting.cancel()
            with suppress(asyncio.CancelledError, StopAsyncIteration):
                await waiting
        await queued.aclose()
        await generating.aclose()
        await tgi_server.release_holds()
    await tgi_server.wait_until(lambda: in_flight_is(tgi_server, 0), what="the slots to be released")


@pytest.mark.parametrize("route", ROUTES)
@pytest.mark.parametrize(("error_type", "server_words", "our_words"), [
    ("generation", "injected test failure after 3 tokens", "generation failed on the server"),
    ("incomplete_generation", "Incomplete generation stream", "ended before generation finished"),
])
async def test_error_event_inside_the_stream_becomes_generation_failed(
        route, error_type, server_words, our_words, tgi_backend_factory, tgi_server):
    backend = tgi_backend_factory(route)
    await tgi_server.set_faults(fail_after_tokens=3, error_type=error_type)
    received = []
    with pytest.raises(GenerationFailed) as caught:
        async for chunk in prepared_stream(backend, LONG_REPLY, LONG):
            received.append(chunk)
    # Three token events arrived before the error (the Messages API's chunks carry text, not counts).
    assert len([chunk for chunk in received if chunk.text or chunk.token_count]) == 3
    assert "".join(chunk.text for chunk in received).strip()
    assert_names_backend(caught.value, tgi_server, server_words, our_words)
    assert (await tgi_server.generations())[-1]["status"] == "failed"


@pytest.mark.parametrize("route", ROUTES)
@pytest.mark.parametrize(("status", "error_class", "words"), [
    (429, BackendOverloaded, "Model is overloaded"),
    (422, InputRejected, "injected test rejection"),
    (424, GenerationFailed, "generation failed on the server"),
])
async def test_http_status_instead_of_a_stream_becomes_the_same_typed_error(
        route, status, error_class, words, tgi_backend_factory, tgi_server):
    """An older TGI, or a proxy in front of it, answers a stream request with the HTTP status itself."""
    backend = tgi_backend_factory(route)
    await tgi_server.set_faults(http_status=status)
    with pytest.raises(error_class) as caught:
        await measure(backend, QUESTION, SHORT)
    assert_names_backend(caught.value, tgi_server, words)
    assert "data:" not in str(caught.value)
    # The next request on the same kept client works.
    text, _ = await measure(backend, QUESTION, SHORT)
    assert text.strip()


@pytest.mark.parametrize("route", ROUTES)
async def test_429_with_retry_after_says_when_to_send_again_and_is_sent_once(route, tgi_backend_factory, tgi_server):
    """TGI's "Model is overloaded" as HTTP 429 with a Retry-After header (the TGI-protocol server,
    not a canned reply): the person reads when to send again, and the app does not retry."""
    backend = tgi_backend_factory(route)
    generations_before = len(await tgi_server.generations())
    await tgi_server.set_faults(http_status=429, retry_after="7")
    with pytest.raises(BackendOverloaded) as caught:
        await measure(backend, QUESTION, SHORT)
    # describe() is what the chat shows under "... could not answer".
    shown = caught.value.describe()
    assert_names_backend(caught.value, tgi_server, "busy, retry in 7 s (HTTP 429)", "Model is overloaded")
    assert "does not retry by itself" in shown and "data:" not in shown, shown
    assert caught.value.retry_after_s == 7
    # Exactly one request reached the stream route, and nothing was generated.
    assert (await paths_requested(tgi_server)).count(ROUTE_PATHS[route]) == 1
    assert len(await tgi_server.generations()) == generations_before


# ---------------------------------------------------------------- reaching the server


@pytest.mark.parametrize("route", ROUTES)
async def test_unreachable_server_is_backend_unavailable(route, tgi_backend_factory):
    url = f"http://127.0.0.1:{closed_loopback_port()}"
    backend = tgi_backend_factory(route, base_url=url)
    for attempt in (lambda: measure(backend, QUESTION, SHORT),
                    backend.health, backend.info):
        with pytest.raises(BackendUnavailable) as caught:
            await attempt()
        message = str(caught.value)
        assert TGI_LABEL in message and url in message and "TGI_BASE_URL" in message, message


@pytest.mark.parametrize("route", ROUTES)
async def test_server_that_never_answers_is_backend_timeout(route, tgi_backend_factory):
    """A socket that accepts connections (the kernel's backlog) but never answers, like a hung server."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)
        url = f"http://127.0.0.1:{listener.getsockname()[1]}"
        backend = tgi_backend_factory(route, base_url=url, timeout_s=0.5)
        for attempt in (lambda: measure(backend, QUESTION, SHORT),
                        backend.health):
            with pytest.raises(BackendTimeout) as caught:
                await attempt()
            message = str(caught.value)
            assert TGI_LABEL in message and url in message and "for 0.5 s" in message, message
            assert "TGI_TIMEOUT_S, the read timeout" in message and caught.value.limit == "read", message


def test_unknown_route_is_a_configuration_error():
    with pytest.raises(ConfigurationError) as caught:
        TGIBackend(BackendConfig(name="tgi", kind="tgi", label="TGI", base_url="http://127.0.0.1:1",
                                 options={"route": "completions"}))
    assert "TGI_ROUTE" in str(caught.value) and "messages" in str(caught.value)


async def test_url_that_is_not_tgi_says_so(tgi_backend_factory, tgi_server):
    backend = tgi_backend_factory(base_url=f"{tgi_server.url}/not-tgi")
    with pytest.raises(BackendUnavailable) as caught:
        await measure(backend, QUESTION, SHORT)
    message = str(caught.value)
    assert "HTTP 404" in message and "TGI_BASE_URL" in message, message


async def test_hf_hub_offline_in_the_environment_does_not_matter(tgi_backend_factory, monkeypatch):
    """The backend speaks TGI over its own pooled client: huggingface_hub's offline switch
    (which makes the hub's own client refuse even a local server) plays no part."""
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    for route in ROUTES:
        text, record = await measure(tgi_backend_factory(route), QUESTION, SHORT)
        assert text.strip() and record.tokens_exact


async def test_only_the_configured_key_is_sent(tgi_backend_factory, tgi_server, monkeypatch):
    """A Hugging Face token in the environment never reaches the TGI server; a configured key does."""
    monkeypatch.setenv("HF_TOKEN", "hf_thisTokenMustNotLeave")
    # huggingface_hub on its own would send it:
    client = AsyncInferenceClient(base_url=tgi_server.url)
    try:
        await client.chat_completion([m.as_dict() for m in QUESTION], max_tokens=2)
    finally:
        await client.close()
    assert (await tgi_server.requests())[-1]["has_authorization"] is True
    await tgi_server.clear_requests()

    for route in ROUTES:
        backend = tgi_backend_factory(route)
        await measure(backend, QUESTION, SHORT)
    assert [r["has_authorization"] for r in await tgi_server.requests()] == [False] * 3
    await tgi_server.clear_requests()

    for route in ROUTES:
        backend = tgi_backend_factory(route, api_key="configured-key")
        await measure(backend, QUESTION, SHORT)
    assert [r["has_authorization"] for r in await tgi_server.requests()] == [True] * 3


# ---------------------------------------------------------------- adapters and stopping


@pytest.mark.parametrize("route", ROUTES)
async def test_lora_adapter_is_passed_the_way_tgi_expects(route, tgi_backend_factory, tgi_server):
    path = ROUTE_PATHS[route]
    await measure(tgi_backend_factory(route), QUESTION, SHORT)
    without = await last_body(tgi_server, path)
    backend = tgi_backend_factory(route, adapter_id="support-lora")
    await measure(backend, QUESTION, SHORT)
    with_adapter = await last_body(tgi_server, path)

    if route == "messages":
        assert without["model"] == "tgi" and with_adapter["model"] == "support-lora"
    else:
        assert "adapter_id" not in without["parameters"]
        assert with_adapter["parameters"]["adapter_id"] == "support-lora"
    assert (await tgi_server.generations())[-1]["adapter_id"] == "support-lora"
    assert (await backend.info()).details["adapter_id"] == "support-lora"


@pytest.mark.parametrize("route", ROUTES)
async def test_closing_the_stream_stops_generation_on_the_server(route, tgi_backend_factory, tgi_server):
    """The generation is held after a few tokens: still running when the stream is closed, on any machine.
    Only the client going away ends it (a release never comes), so "cancelled" shows the close reached it."""
    backend = tgi_backend_factory(route)
    await tgi_server.set_faults(hold_after_tokens=HOLD_AFTER_TOKENS)
    stream = prepared_stream(backend, LONG_REPLY, LONG)
    try:
        received = [await anext(stream) for _ in range(3)]
        assert "".join(chunk.text for chunk in received).strip()
        held = await tgi_server.wait_until_held()
        assert held["status"] == "running" and held["path"] == ROUTE_PATHS[route]

        await stream.aclose()

        async def cancelled():
            last = (await tgi_server.generations())[-1]
            return last if last["status"] != "running" else None

        last = await tgi_server.wait_until(cancelled, timeout_s=30, what="the server to stop generating")
        assert last["status"] == "cancelled" and last["path"] == ROUTE_PATHS[route]
        assert 3 <= last["generated_tokens"] <= HOLD_AFTER_TOKENS + 1
        await tgi_server.wait_until(lambda: in_flight_is(tgi_server, 0), what="the slot to be released")
    finally:
        await stream.aclose()
        await tgi_server.release_holds()


@pytest.mark.parametrize("route", ROUTES)
async def test_one_kept_connection_carries_request_after_request(route, tgi_backend_factory, tgi_server):
    """No client is built per request: successive requests (and the /chat_tokenize lookup of the
    native route) travel on the same pooled connection, so none pays for a new one."""
    backend = tgi_backend_factory(route)
    for _ in range(3):
        await measure(backend, QUESTION, SHORT)
    ports = {request["client_port"] for request in await tgi_server.requests()}
    assert len(ports) == 1, ports


@pytest.mark.parametrize("route", ROUTES)
async def test_stop_on_the_kept_client_cancels_on_the_server_and_the_next_request_works(
        route, tgi_backend_factory, tgi_server):
    backend = tgi_backend_factory(route)
    await tgi_server.set_faults(hold_after_tokens=HOLD_AFTER_TOKENS)  # still running at Stop, on any machine
    stream = prepared_stream(backend, LONG_REPLY, LONG)
    try:
        for _ in range(3):
            await anext(stream)
        await tgi_server.wait_until_held()
        await stream.aclose()  # the UI's Stop
        generation = await tgi_server.wait_until(
            lambda: last_generation_with_status(tgi_server, "cancelled"), timeout_s=30,
            what="the generation to be cancelled")
    finally:
        await stream.aclose()
        await tgi_server.release_holds()
    assert generation["generated_tokens"] <= HOLD_AFTER_TOKENS + 1
    text, record = await measure(backend, QUESTION, SHORT)
    assert text.strip() and record.status == "completed"
    assert (await tgi_server.generations())[-1]["status"] == "completed"


async def last_generation_with_status(tgi_server, status: str):
    generations = await tgi_server.generations()
    return generations[-1] if generations and generations[-1]["status"] == status else None
