"""Fair numbers across engines: the same figures for the same stream, whatever the protocol.

Two paced servers whose true send times are recorded (the OpenAI-protocol one,
for kinds "openai" and "vllm", and the TGI-protocol one with its paced engine,
for both TGI routes) stream at a known pace. For every kind, the backend +
timing path must give a TTFT just above the server's first send, the server's
decode rate and its exact token count.

What is known by construction is asserted exactly: the server's token count,
one inter-token latency per gap, a TTFT never below the server's own first send
and a set-up cost inside the measured time showing in it in full. How close the
figures come (the README's claims: median TTFT bias within +15 ms, decode rate
within 2 %, ITL median near the pace) is a speed goal, judged with a verdict by
`experiments/measurement_parity.py` (measured: +1..+5 ms TTFT, decode within
0.1 %); here only safety bounds that a loaded machine keeps.
"""

from __future__ import annotations

import asyncio

import pytest

from backends.base import ChatMessage, GenerationParams
from backends.openai_compat import OpenAICompatBackend
from backends.tgi import TGIBackend
from config import BackendConfig
from servers.paced_openai import start_paced_server
from servers.tgi_protocol import start_paced_tgi_server
from core.timing import RequestRecord
from core.streaming import measure, measure_prepared

RATE_TOKENS_PER_S = 100.0
TOKENS = 60
FIRST_TOKEN_S = 0.05
ATTEMPTS = 5
KINDS = ["openai", "vllm", "tgi-messages", "tgi-generate"]
# Safety bounds only (a loaded CI machine may stall an attempt); the goals are the experiment's.
MAX_TTFT_BIAS_ANY_S = 0.5
RATE_TOLERANCE_ANY = 0.5
MAX_ITL_MEDIAN_MS = 500.0  # the pace is 10 ms
SET_UP_INSIDE_S = 0.024  # what a new huggingface_hub client per request cost


@pytest.fixture(scope="module")
def paced_openai():
    server = start_paced_server(rate_tokens_per_s=RATE_TOKENS_PER_S, tokens=TOKENS, name="paced-openai-parity")
    server.set_pace(RATE_TOKENS_PER_S, TOKENS, first_token_s=FIRST_TOKEN_S)
    yield server
    server.stop()


@pytest.fixture(scope="module")
def paced_tgi():
    server = start_paced_tgi_server(RATE_TOKENS_PER_S, TOKENS, FIRST_TOKEN_S)
    yield server
    server.process.stop()


@pytest.fixture
async def backend_of(paced_openai, paced_tgi):
    created = []

    def make(kind: str):
        if kind in ("openai", "vllm"):
            backend = OpenAICompatBackend(BackendConfig(name=kind, kind=kind, label=kind,
                                                        base_url=paced_openai.base_url))
        else:
            route = kind.split("-")[1]
            backend = TGIBackend(BackendConfig(name=kind, kind="tgi", label=kind, base_url=paced_tgi.url,
                                               options={"route": route}))
        created.append(backend)
        return backend

    yield make
    for backend in created:
        await backend.aclose()


async def server_send_times(kind: str, paced_openai, paced_tgi) -> dict:
    """When the latest request arrived, when its first and last token left (wall clock), tokens sent."""
    if kind in ("openai", "vllm"):
        return paced_openai.requests()[-1]
    generation = (await paced_tgi.generations())[-1]
    arrival = (await paced_tgi.requests())[-1]
    return {**generation, "received_at_s": arrival["received_at_s"]}


def ttft_bias_s(record: RequestRecord, sent: dict) -> float:
    """Shown TTFT minus the server's own TTFT (its first send after the request arrived): all that
    the client adds, before sending (client set-up, connecting) and after receiving (parsing)."""
    return record.first_token_s - (sent["first_token_sent_at_s"] - sent["received_at_s"])


async def attempts(kind: str, backend, paced_openai, paced_tgi, count: int = ATTEMPTS,
                   measure_one=measure) -> list[float]:
    """TTFT biases (s) of `count` sequential replies, each checked for exact counts and against
    the safety bounds."""
    params = GenerationParams(temperature=0.7, top_p=0.9, max_new_tokens=TOKENS)
    biases = []
    for attempt in range(count):
        text, record = await measure_one(backend, [ChatMessage("user", f"Attempt {attempt}: count.")], params)
        sent = await server_send_times(kind, paced_openai, paced_tgi)
        assert text.split()[:2] in (["w1", "w2"],) and len(text.split()) == TOKENS, text
        # TTFT: at least the server's own, at most a little above it.
        bias = ttft_bias_s(record, sent)
        assert -0.002 < bias < MAX_TTFT_BIAS_ANY_S, f"{kind}: TTFT {bias * 1000:.1f} ms above the server's own"
        biases.append(bias)
        assert record.first_token_s >= FIRST_TOKEN_S
        # Decode rate: the server's own pace between its first and last send.
        server_rate = (sent["tokens_sent"] - 1) / (sent["last_token_sent_at_s"] - sent["first_token_sent_at_s"])
        assert abs(record.decode_tokens_per_s / server_rate - 1) < RATE_TOLERANCE_ANY, (
            kind, record.decode_tokens_per_s, server_rate)
        # Token count: exact, and the server's.
        assert record.tokens_exact and record.count_disagreement is None
        assert record.output_tokens == sent["tokens_sent"] == TOKENS
        assert record.itl is not None and record.itl.count == TOKENS - 1
        assert 0 < record.itl.median_ms < MAX_ITL_MEDIAN_MS
    return biases


@pytest.mark.parametrize("kind", KINDS)
async def test_shown_figures_match_the_servers_count_and_send_times_within_safety_bounds(
        kind, backend_of, paced_openai, paced_tgi):
    await attempts(kind, backend_of(kind), paced_openai, paced_tgi)  # its checks are per attempt


async def test_set_up_inside_the_measured_time_shows_in_the_ttft_in_full(backend_of, paced_openai, paced_tgi):
    """24 ms of set-up after the clock started (what a new huggingface_hub client per request cost)
    adds at least 24 ms to every TTFT bias: the clock covers everything the client does, so the
    experiment's +15 ms goal can see such a cost."""
    backend = backend_of("tgi-messages")

    async def measured_with_setup_inside(backend, messages, params):
        request = await backend.prepare(messages, params)
        inner = backend.stream

        async def stream_after_setup(prepared):
            await asyncio.sleep(SET_UP_INSIDE_S)  # a client built after the clock started
            async for chunk in inner(prepared):
                yield chunk

        backend.stream = stream_after_setup
        try:
            return await measure_prepared(backend, request)
        finally:
            del backend.stream

    biases = await attempts("tgi-messages", backend, paced_openai, paced_tgi, count=3,
                            measure_one=measured_with_setup_inside)
    assert min(biases) >= SET_UP_INSIDE_S, biases


@pytest.mark.parametrize("kind", ["openai", "vllm"])
async def test_openai_protocol_requests_reuse_one_kept_connection(kind, backend_of, paced_openai):
    backend = backend_of(kind)
    before = len(paced_openai.requests())
    for _ in range(3):
        await measure(backend, [ChatMessage("user", "hello")], GenerationParams(max_new_tokens=5))
    ports = {request["client_port"] for request in paced_openai.requests()[before:]}
    assert len(ports) == 1, ports


async def test_connection_idle_past_the_servers_keep_alive_is_reopened_before_the_clock(
        backend_of, paced_openai, monkeypatch):
    """After an idle spell the backend opens a fresh connection in prepare(), not inside the request."""
    backend = backend_of("vllm")
    await measure(backend, [ChatMessage("user", "hello")], GenerationParams(max_new_tokens=3))
    warmed = []
    original = backend.warm_up

    async def counting_warm_up():
        warmed.append(True)
        await original()

    monkeypatch.setattr(backend, "warm_up", counting_warm_up)
    await backend.prepare([ChatMessage("user", "again")], GenerationParams(max_new_tokens=3))
    assert warmed == []  # just used: the pooled connection is still warm
    monkeypatch.setattr(backend._warmth, "after_s", 0.0)
    await backend.prepare([ChatMessage("user", "again")], GenerationParams(max_new_tokens=3))
    assert warmed == [True]


async def test_vllm_kind_sends_the_panels_optional_settings_and_nothing_unset(backend_of, paced_openai):
    backend = backend_of("vllm")
    params = GenerationParams(temperature=0.5, top_p=0.8, max_new_tokens=4, top_k=20, min_p=0.05,
                              repetition_penalty=1.1, seed=3)
    request = await backend.prepare([ChatMessage("user", "hi")], params)
    assert request.ignored == ()
    await measure(backend, [ChatMessage("user", "hi")], params)
    assert paced_openai.requests()[-1]["sampling"] == {"temperature": 0.5, "top_p": 0.8, "top_k": 20, "min_p": 0.05,
                                                       "repetition_penalty": 1.1, "seed": 3, "max_tokens": 4}
    await measure(backend, [ChatMessage("user", "hi")], GenerationParams(temperature=0.5, top_p=0.8, max_new_tokens=4))
    assert paced_openai.requests()[-1]["sampling"] == {"temperature": 0.5, "top_p": 0.8, "max_tokens": 4}


async def test_openai_kind_says_which_settings_it_cannot_send(backend_of, paced_openai):
    backend = backend_of("openai")
    params = GenerationParams(max_new_tokens=4, top_k=20, repetition_penalty=1.1, seed=9)
    request = await backend.prepare([ChatMessage("user", "hi")], params)
    assert [ignored.setting for ignored in request.ignored] == ["top_k", "repetition_penalty"]
    assert request.ignored[0].describe() == "top-k is not part of the OpenAI API (kind openai): ignored"
    await measure(backend, [ChatMessage("user", "hi")], params)
    sampling = paced_openai.requests()[-1]["sampling"]
    assert sampling["seed"] == 9 and "top_k" not in sampling and "repetition_penalty" not in sampling


@pytest.mark.parametrize(("route", "ignored"), [("messages", ["top_k", "min_p", "repetition_penalty"]),
                                                ("generate", ["min_p"])])
async def test_tgi_routes_say_which_settings_they_cannot_honour(route, ignored, backend_of, paced_tgi):
    backend = backend_of(f"tgi-{route}")
    params = GenerationParams(temperature=0.7, top_p=0.9, max_new_tokens=4, top_k=20, min_p=0.05,
                              repetition_penalty=1.1, seed=5)
    request = await backend.prepare([ChatMessage("user", "hi")], params)
    assert [item.setting for item in request.ignored] == ignored
    await measure(backend, [ChatMessage("user", "hi")], params)
    body = (await paced_tgi.requests())[-1]["body"]
    sent = body if route == "messages" else body["parameters"]
    assert sent["seed"] == 5 and sent["top_p"] == 0.9 and sent["temperature"] == 0.7
    assert ("top_k" in sent) == (route == "generate") and "min_p" not in sent
    # Only what the panel set: nothing else reaches the server.
    unset = await backend.prepare([ChatMessage("user", "hi")], GenerationParams(temperature=0.7, top_p=0.9,
                                                                                 max_new_tokens=4))
    assert not {"top_k", "seed", "repetition_penalty", "min_p"} & set(unset.sent)


async def test_replies_that_find_a_backend_idle_share_one_warm_up():
    """A class sending at once finds the backend idle past keep-alive: one warm-up request serves
    every reply waiting on it, not one each before it may leave."""
    from backends.warmth import IdleWarmth

    warmed = []

    async def warm():
        warmed.append(True)
        await asyncio.sleep(0.05)
        warmth.used()

    warmth = IdleWarmth(warm, after_s=3.0)
    await asyncio.gather(*(warmth.ensure() for _ in range(30)))
    assert warmed == [True]
    await warmth.ensure()  # just warmed: nothing more
    assert warmed == [True]
