"""The contract check itself: TGI's OpenAPI spec as a validator.

The validator must be able to fail (wrong shapes are rejected, with the
reason), must accept what the spec allows (its own examples, TGI's nullable
fields), and the TGI-protocol test server must answer every route in the
spec's schemas.
"""

from __future__ import annotations

import json

import httpx
import pytest

from servers.tgi_protocol import contract
from servers.tgi_protocol.contract import ContractViolation

# Recorded from the TGI-protocol server (bundled SmolLM2, greedy, "What is the
# capital of France? One word."): the last two events of /generate_stream and
# the last two chunks of the Messages API stream (include_usage).
TOKEN_EVENT = {"index": 7, "token": {"id": 30, "text": ".", "logprob": -0.3234625458717346, "special": False},
               "top_tokens": [], "generated_text": None, "details": None}
LAST_EVENT = {"index": 8, "token": {"id": 2, "text": "<|im_end|>", "logprob": -0.3344005346298218, "special": True},
              "top_tokens": [], "generated_text": "The capital of France is Paris.",
              "details": {"finish_reason": "eos_token", "generated_tokens": 8, "input_length": 40, "seed": None}}
CHAT_CHUNK = {"id": "", "created": 1796215777, "model": "SmolLM2-135M-Instruct.Q4_1.gguf",
              "system_fingerprint": "3.3.6-dev0-native",
              "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                           "finish_reason": "stop"}], "usage": None}
USAGE_CHUNK = {"id": "", "created": 1796215777, "model": "SmolLM2-135M-Instruct.Q4_1.gguf",
               "system_fingerprint": "3.3.6-dev0-native", "choices": [],
               "usage": {"prompt_tokens": 40, "completion_tokens": 8, "total_tokens": 48}}
STREAM = ("/generate_stream", "post", 200, "text/event-stream")
CHAT_STREAM = ("/v1/chat/completions", "post", 200, "text/event-stream")


def without(payload: dict, key: str) -> dict:
    return {k: v for k, v in payload.items() if k != key}


def test_accepts_recorded_tgi_events():
    for operation, payload in ((STREAM, TOKEN_EVENT), (STREAM, LAST_EVENT),
                               (CHAT_STREAM, CHAT_CHUNK), (CHAT_STREAM, USAGE_CHUNK)):
        contract.validate(*operation, payload)
    # A null logprob is allowed (nullable in the spec), a missing one is not.
    contract.validate(*STREAM, {**TOKEN_EVENT, "token": {**TOKEN_EVENT["token"], "logprob": None}})


@pytest.mark.parametrize(("operation", "payload", "reason"), [
    (STREAM, without(TOKEN_EVENT, "token"), "'token' is a required property"),
    (STREAM, {**TOKEN_EVENT, "token": {**TOKEN_EVENT["token"], "id": "5248"}}, "is not of type 'integer'"),
    (STREAM, {**TOKEN_EVENT, "index": -1}, "less than the minimum of 0"),
    # The native route's finish reasons are TGI's own, not OpenAI's "stop".
    (STREAM, {**LAST_EVENT, "details": {**LAST_EVENT["details"], "finish_reason": "stop"}},
     "'stop' is not one of ['length', 'eos_token', 'stop_sequence']"),
    (STREAM, {**LAST_EVENT, "details": without(LAST_EVENT["details"], "generated_tokens")},
     "'generated_tokens' is a required property"),
    (CHAT_STREAM, without(CHAT_CHUNK, "system_fingerprint"), "'system_fingerprint' is a required property"),
    (CHAT_STREAM, {**CHAT_CHUNK, "choices": [{"index": 0, "delta": {"role": "assistant"}}]},
     "'content' is a required property"),
    (CHAT_STREAM, {**USAGE_CHUNK, "usage": {"prompt_tokens": 1, "completion_tokens": 2}},
     "'total_tokens' is a required property"),
    (("/info", "get", 200, "application/json"), {"model_id": "m"}, "'max_total_tokens' is a required property"),
    (("/generate", "post", 422, "application/json"), {"error": "Input validation error"},
     "'error_type' is a required property"),
])
def test_rejects_wrong_shapes_with_the_reason(operation, payload, reason):
    with pytest.raises(ContractViolation) as caught:
        contract.validate(*operation, payload)
    assert reason in str(caught.value)


@pytest.mark.parametrize(("operation", "reason"), [
    (("/generate", "post", 404, "application/json"), "status 404 is not declared"),
    (("/info", "get", 200, "text/plain"), "content type 'text/plain' is not declared"),
    (("/v1/embeddings", "post", 200, "application/json"), "the spec has no such path"),
])
def test_rejects_undeclared_responses(operation, reason):
    with pytest.raises(ContractViolation) as caught:
        contract.validate(*operation, {"error": "x", "error_type": "y"})
    assert reason in str(caught.value)


def test_health_declares_no_body():
    assert contract.violations("/health", "get", 200, None, None) == []
    assert contract.violations("/health", "get", 200, "application/json", {"ok": True}) != []


def test_accepts_the_specs_own_examples_except_its_one_inconsistency():
    examples = list(contract.media_examples())
    assert len(examples) > 20
    failing = {(e.path, e.status): contract.violations(e.path, e.method, e.status, e.content_type, e.payload)
               for e in examples}
    failing = {where: problems for where, problems in failing.items() if problems}
    # The spec's example for /tokenize 404 omits `error_type`, which its own ErrorResponse requires.
    assert failing == {("/tokenize", 404): ["at (root): 'error_type' is a required property"]}


def test_request_schemas():
    sent_by_the_backend = {"inputs": "Hi", "parameters": {"max_new_tokens": 8, "details": True, "do_sample": False},
                           "stream": True}
    assert contract.request_violations("/generate_stream", "post", sent_by_the_backend) == []
    # The spec (like TGI's validation) refuses temperature 0 on the native route.
    zero = {"inputs": "Hi", "parameters": {"temperature": 0}}
    assert contract.request_violations("/generate_stream", "post", zero) == [
        "at parameters/temperature: 0 is less than or equal to the minimum of 0"]
    assert contract.request_violations("/v1/chat/completions", "post", {"model": "tgi"}) == [
        "at (root): 'messages' is a required property"]


def test_openapi_3_0_forms_are_converted():
    converted = contract.to_json_schema({
        "type": "object",
        "properties": {
            "a": {"type": "integer", "minimum": 0, "exclusiveMinimum": True, "nullable": True},
            "b": {"allOf": [{"$ref": "#/components/schemas/X"}], "nullable": True, "default": "null"},
            "format": {"type": "string", "example": 3},
        },
    })
    assert converted["properties"]["a"] == {"type": ["integer", "null"], "exclusiveMinimum": 0}
    assert converted["properties"]["b"] == {"anyOf": [{"type": "null"},
                                                      {"allOf": [{"$ref": "#/components/schemas/X"}]}]}
    assert converted["properties"]["format"] == {"type": "string"}


def test_spec_path_is_overridable(tmp_path, monkeypatch):
    spec = json.loads(contract.spec_path().read_text(encoding="utf-8"))
    spec["components"]["schemas"]["ErrorResponse"]["required"] = ["error"]
    altered = tmp_path / "tgi-openapi.json"
    altered.write_text(json.dumps(spec), encoding="utf-8")
    payload = {"error": "Input validation error"}
    assert contract.violations("/generate", "post", 422, "application/json", payload) != []
    monkeypatch.setenv(contract.SPEC_PATH_VARIABLE, str(altered))
    assert contract.spec_path() == altered
    assert contract.violations("/generate", "post", 422, "application/json", payload) == []


# ---------------------------------------------------------------- the test server, route by route


def sse_payloads(body: str) -> list:
    """The JSON payloads of an SSE body (a test's check, not a client)."""
    payloads = []
    for line in body.splitlines():
        if line.startswith("data:") and line[5:].strip() != "[DONE]":
            payloads.append(json.loads(line[5:]))
    return payloads


async def test_every_route_of_the_test_server_answers_in_the_spec(tgi_server):
    violations_before = len(await tgi_server.violations())
    chat = {"messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 5, "temperature": 0}
    native = {"inputs": "<|im_start|>user\nSay hi.<|im_end|>\n<|im_start|>assistant\n",
              "parameters": {"max_new_tokens": 5, "details": True}}
    async with httpx.AsyncClient(base_url=tgi_server.url, timeout=60) as client:
        checks = []
        for method, path, body in [
            ("GET", "/info", None), ("GET", "/health", None), ("GET", "/v1/models", None),
            ("GET", "/metrics", None), ("POST", "/generate", native), ("POST", "/", native),
            ("POST", "/tokenize", {"inputs": "Hello world"}), ("POST", "/chat_tokenize", chat),
            ("POST", "/v1/chat/completions", chat),
            ("POST", "/generate", {**native, "parameters": {"temperature": 0}}),
        ]:
            response = await client.request(method, path, json=body)
            content_type = response.headers.get("content-type")
            payload = None if not response.content else (
                response.text if content_type.startswith("text/plain") else response.json())
            checks.append((path, response.status_code))
            contract.validate(path, method, response.status_code, content_type, payload)
        assert checks[-1] == ("/generate", 422)
        for path, body in [("/generate_stream", native), ("/", {**native, "stream": True}),
                           ("/v1/chat/completions", {**chat, "stream": True, "stream_options": {"include_usage": True}})]:
            response = await client.post(path, json=body)
            events = sse_payloads(response.text)
            assert response.status_code == 200 and len(events) >= 2
            for event in events:
                contract.validate(path, "post", 200, "text/event-stream", event)
            if path == "/v1/chat/completions":
                assert response.text.rstrip().endswith("data: [DONE]")
                assert events[-1]["choices"] == [] and events[-1]["usage"]["completion_tokens"] == len(events) - 1
            else:
                assert events[-1]["details"]["generated_tokens"] == len(events)
    assert (await tgi_server.violations())[violations_before:] == []


# ---------------------------------------------------------------- the server's own check can fail


SAY_HI_NATIVE = {"inputs": "<|im_start|>user\nSay hi.<|im_end|>\n<|im_start|>assistant\n",
                 "parameters": {"max_new_tokens": 3, "details": True}}
SAY_HI_CHAT = {"messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 3, "temperature": 0,
               "stream": True}


@pytest.mark.parametrize(("path", "body", "fault", "reason"), [
    ("/generate_stream", SAY_HI_NATIVE, {"drop": "token"}, "at (root): 'token' is a required property"),
    ("/generate_stream", SAY_HI_NATIVE, {"set": {"token.id": "5248"}}, "at token/id: '5248' is not of type 'integer'"),
    ("/v1/chat/completions", SAY_HI_CHAT, {"drop": "system_fingerprint"},
     "at (root): 'system_fingerprint' is a required property"),
    ("/v1/chat/completions", SAY_HI_CHAT, {"set": {"created": "now"}}, "at created: 'now' is not of type 'integer'"),
], ids=["native-missing-token", "native-id-as-text", "chat-missing-fingerprint", "chat-created-as-text"])
async def test_the_server_records_an_event_it_sent_outside_the_spec(tgi_server, path, body, fault, reason):
    """The `server_kept_the_contract` checks elsewhere can fail: a deliberately broken event is
    recorded (and still sent, so a client sees what a broken server sends); a normal one is not."""
    async with httpx.AsyncClient(base_url=tgi_server.url, timeout=60) as client:
        before = len(await tgi_server.violations())
        clean = sse_payloads((await client.post(path, json=body)).text)
        assert clean and (await tgi_server.violations())[before:] == []

        await tgi_server.set_faults(corrupt_next_event=fault)
        broken = sse_payloads((await client.post(path, json=body)).text)
        (violation,) = (await tgi_server.violations())[before:]
        assert violation["path"] == path and violation["status"] == 200, violation
        assert violation["content_type"] == "text/event-stream"
        assert reason in violation["problems"], violation["problems"]
        assert violation["payload"] == broken[0]  # the first event of the stream, as sent

        # One event only: the rest of that stream and the next stream are in the spec again.
        again = sse_payloads((await client.post(path, json=body)).text)
        assert len(again) == len(clean) and (await tgi_server.violations())[before + 1:] == []


async def test_the_server_records_a_request_body_outside_the_spec(tgi_server):
    """Every request body is checked against the spec's request schema: an ill-typed or missing
    field is recorded with the reason. The spec allows fields it does not name (no
    `additionalProperties: false`), as TGI's router ignores them, so an unknown one is not."""
    native = SAY_HI_NATIVE["parameters"]
    sent = [  # (path, body, the recorded problem; None: nothing recorded)
        ("/generate_stream", {**SAY_HI_NATIVE, "parameters": {**native, "max_new_tokens": "three"}},
         "at parameters/max_new_tokens: 'three' is not of type 'integer'"),
        ("/generate_stream", {"parameters": native}, "at (root): 'inputs' is a required property"),
        ("/v1/chat/completions", {**SAY_HI_CHAT, "temperature": "warm"}, "at temperature: 'warm' is not of type 'number'"),
        ("/generate_stream", {**SAY_HI_NATIVE, "parameters": {**native, "frobnicate": 1}}, None),
        ("/generate_stream", SAY_HI_NATIVE, None),
    ]
    await tgi_server.clear_requests()
    async with httpx.AsyncClient(base_url=tgi_server.url, timeout=60) as client:
        for path, body, _ in sent:
            response = await client.post(path, json=body)
            assert response.status_code == 200  # TGI streams first: errors come as events
    recorded = await tgi_server.requests()
    assert [r["path"] for r in recorded] == [path for path, _, _ in sent]
    for request, (_, _, problem) in zip(recorded, sent):
        problems = request["request_schema_problems"]
        if problem is None:
            assert problems == [], request
        else:
            assert len(problems) == 1 and problems[0].startswith(problem), request
