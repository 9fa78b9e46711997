"""The stand-in's HTTP side: TGI's routes as a Starlette app, plus its test-only routes.

TGI's routes: `/generate`, `/generate_stream`, `/` (the compat route),
`/v1/chat/completions`, `/chat_tokenize`, `/tokenize`, `/info`, `/health`,
`/v1/models`, `/metrics`. Streaming routes always answer 200 and send errors
as events, as TGI does; the others answer with the error's HTTP status.
Test-only routes (not part of TGI): `/__contract__/violations` (DELETE
clears), `/__test__/requests` (DELETE clears), `/__test__/generations`,
`/__test__/state` and `/__test__/faults` (see faults.py).
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict
from typing import Any, Callable

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from servers.tgi_protocol import contract
from servers.tgi_protocol.engines import Engine
from servers.tgi_protocol.errors import InferError, validation_error
from servers.tgi_protocol.faults import Faults
from servers.tgi_protocol.metrics import ServerMetrics
from servers.tgi_protocol.responses import Responder
from servers.tgi_protocol.scheduler import Scheduler
from servers.tgi_protocol.streaming import GenerationDriver, Render, SSEResponse
from servers.tgi_protocol.validation import (
    MAX_BEST_OF,
    MAX_CLIENT_BATCH_SIZE,
    MAX_STOP_SEQUENCES,
    GenerateParameters,
    Limits,
    ValidRequest,
    chat_messages,
    chat_parameters,
    validate,
)

# What /info says in `router`: the app's TGI backend reads it to label this server's numbers a stand-in's.
ROUTER_NAME = "tgi-protocol-test-server"


class TGIProtocolServer:
    """TGI's routes over an engine: parse, validate, generate, answer in the spec's schemas."""

    def __init__(self, engine: Engine, limits: Limits, model_id: str) -> None:
        self.engine = engine
        self.limits = limits
        self.model_id = model_id
        self.version = contract.spec_version()
        self.requests: list[dict[str, Any]] = []
        self.faults = Faults()
        self.metrics = ServerMetrics(limits.max_total_tokens)
        self.scheduler = Scheduler(engine, limits, self.faults)
        self.responder = Responder(self.metrics, self.faults)
        self.driver = GenerationDriver(self.scheduler, self.responder, self.metrics)

    async def body(self, request: Request) -> Any:
        """The request's JSON body, logged for the tests with its problems against the spec."""
        received_at_s = time.time()
        raw = await request.body()
        try:
            payload = json.loads(raw) if raw else None
        except json.JSONDecodeError:
            payload = raw.decode("utf-8", errors="replace")
        self.requests.append({
            "path": request.url.path,
            "body": payload,
            "has_authorization": "authorization" in request.headers,
            "client_port": request.client.port if request.client else None,
            "received_at_s": received_at_s,
            "request_schema_problems": contract.request_violations(request.url.path, request.method, payload)
            if isinstance(payload, dict) else ["body is not a JSON object"],
        })
        self.metrics.request_count += 1
        if not isinstance(payload, dict):
            raise validation_error("Failed to deserialize the JSON body into the target type")
        return payload

    def validate(self, inputs: str, parameters: GenerateParameters, add_special_tokens: bool) -> ValidRequest:
        return validate(inputs, parameters, limits=self.limits,
                        tokenize=lambda text: self.engine.tokenize(text, add_special_tokens))

    # -- native routes

    async def generate_json(self, path: str, payload: dict[str, Any]) -> dict[str, Any]:
        self.scheduler.admit()
        try:
            parameters = GenerateParameters.from_json(payload.get("parameters"))
            valid = self.validate(str(payload.get("inputs", "")), parameters, True)
            return await self.driver.generate_once(path, valid, bool(parameters.return_full_text))
        finally:
            self.scheduler.release()

    async def route_generate(self, request: Request) -> Response:
        path = "/generate"
        try:
            payload = await self.body(request)
            return self.responder.json(path, "post", 200, await self.generate_json(path, payload))
        except InferError as error:
            return self.responder.error_json(path, error)

    async def route_generate_stream(self, request: Request) -> Response:
        path = "/generate_stream"
        try:
            payload = await self.body(request)
            injected = self.faults.status_error()
            if injected is not None:
                raise injected
        except InferError as error:
            return Response(self.responder.error_event(path, error), status_code=error.status,
                            media_type="text/event-stream", headers=error.headers)
        return self.stream_response(path, payload)

    async def route_compat(self, request: Request) -> Response:
        path = "/"
        try:
            payload = await self.body(request)
            if payload.get("stream"):
                return self.stream_response(path, payload)
            return self.responder.json(path, "post", 200, [await self.generate_json(path, payload)])
        except InferError as error:
            return self.responder.error_json(path, error)

    def stream_response(self, path: str, payload: dict[str, Any]) -> SSEResponse:
        """/generate_stream (and / with stream): StreamResponse events, errors in-stream."""

        def prepare() -> tuple[ValidRequest, Render]:
            parameters = GenerateParameters.from_json(payload.get("parameters"))
            parameters.check_streamable()
            valid = self.validate(str(payload.get("inputs", "")), parameters, True)

            def render(token, finish_reason, generated_text, index) -> list[bytes]:
                event = {"index": index, "token": token.as_json(), "top_tokens": [],
                         "generated_text": None, "details": None}
                if finish_reason is not None:
                    if parameters.return_full_text:
                        generated_text = valid.inputs + generated_text
                    event["generated_text"] = generated_text
                    if valid.details:
                        event["details"] = {"finish_reason": finish_reason, "generated_tokens": index,
                                            "input_length": valid.input_length,
                                            "seed": valid.seed if valid.sampling else None}
                return [self.responder.sse(path, 200, event)]

            return valid, render

        return self.driver.token_stream(path, prepare)

    # -- Messages API

    def chat_request(self, payload: dict[str, Any]) -> tuple[str, GenerateParameters]:
        """TGI's ChatRequest -> (templated prompt, GenerateParameters)."""
        prompt = self.engine.apply_chat_template(chat_messages(payload))
        return prompt, chat_parameters(payload)

    def chat_chunk(self, choices: list[dict[str, Any]], usage: dict[str, int] | None) -> dict[str, Any]:
        return {"id": "", "created": int(time.time()), "model": self.model_id,
                "system_fingerprint": f"{self.version}-native", "choices": choices, "usage": usage}

    async def route_chat_completions(self, request: Request) -> Response:
        path = "/v1/chat/completions"
        try:
            payload = await self.body(request)
            prompt, parameters = self.chat_request(payload)
        except InferError as error:
            return self.responder.error_json(path, error)
        if payload.get("stream"):
            injected = self.faults.status_error()
            if injected is not None:
                return self.responder.error_json(path, injected)
            return self.chat_stream(path, payload, prompt, parameters)
        try:
            self.scheduler.admit()
            try:
                valid = self.validate(prompt, parameters, False)
                result = await self.driver.generate_once(path, valid, False)
            finally:
                self.scheduler.release()
        except InferError as error:
            return self.responder.error_json(path, error)
        details = result["details"]
        usage = {"prompt_tokens": valid.input_length, "completion_tokens": details["generated_tokens"],
                 "total_tokens": valid.input_length + details["generated_tokens"]}
        body = self.chat_chunk([{"index": 0, "message": {"role": "assistant", "content": result["generated_text"]},
                                 "logprobs": None, "finish_reason": chat_finish(details["finish_reason"])}], usage)
        return self.responder.json(path, "post", 200, body)

    def chat_stream(self, path: str, payload: dict[str, Any], prompt: str,
                    parameters: GenerateParameters) -> SSEResponse:
        include_usage = bool((payload.get("stream_options") or {}).get("include_usage"))

        def prepare() -> tuple[ValidRequest, Render]:
            valid = self.validate(prompt, parameters, False)

            def render(token, finish_reason, _generated_text, generated) -> list[bytes]:
                finish = None if finish_reason is None else chat_finish(finish_reason)
                delta = {"role": "assistant", "content": "" if token.special else token.text}
                choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
                events = [self.responder.sse(path, 200, self.chat_chunk([choice], None))]
                if finish_reason is not None and include_usage:
                    usage = {"prompt_tokens": valid.input_length, "completion_tokens": generated,
                             "total_tokens": valid.input_length + generated}
                    events.append(self.responder.sse(path, 200, self.chat_chunk([], usage)))
                return events

            return valid, render

        return self.driver.token_stream(path, prepare, closing=b"data: [DONE]\n\n")

    # -- tokenizer, info, health, models, metrics

    async def route_chat_tokenize(self, request: Request) -> Response:
        path = "/chat_tokenize"
        try:
            payload = await self.body(request)
            prompt, _ = self.chat_request(payload)
        except InferError as error:
            # The spec declares only 404 (with an ErrorResponse) for a failure here.
            return self.responder.json(path, "post", 404, error.body())
        body = {"tokenize_response": self.engine.simple_tokens(prompt, False), "templated_text": prompt}
        return self.responder.json(path, "post", 200, body)

    async def route_tokenize(self, request: Request) -> Response:
        path = "/tokenize"
        try:
            payload = await self.body(request)
        except InferError as error:
            return self.responder.json(path, "post", 404, error.body())
        return self.responder.json(path, "post", 200,
                                   self.engine.simple_tokens(str(payload.get("inputs", "")), True))

    async def route_info(self, request: Request) -> Response:
        body = {
            "model_id": self.model_id, "model_sha": None, "model_pipeline_tag": "text-generation",
            "max_concurrent_requests": self.limits.max_concurrent, "max_best_of": MAX_BEST_OF,
            "max_stop_sequences": MAX_STOP_SEQUENCES, "max_input_tokens": self.limits.max_input_tokens,
            "max_total_tokens": self.limits.max_total_tokens, "validation_workers": 1,
            "max_client_batch_size": MAX_CLIENT_BATCH_SIZE, "router": ROUTER_NAME, "version": self.version,
            "sha": None, "docker_label": None,
        }
        return self.responder.json("/info", "get", 200, body)

    async def route_health(self, request: Request) -> Response:
        if self.faults.unhealthy:
            return self.responder.json("/health", "get", 503, {"error": "unhealthy", "error_type": "healthcheck"})
        self.responder.checked("/health", "get", 200, None, None)
        return Response(status_code=200)

    async def route_models(self, request: Request) -> Response:
        body = {"id": self.model_id, "object": "model", "created": 0, "owned_by": self.model_id}
        return self.responder.json("/v1/models", "get", 200, body)

    async def route_metrics(self, request: Request) -> Response:
        text = self.metrics.render(*self.scheduler.counts())
        self.responder.checked("/metrics", "get", 200, "text/plain", text)
        return Response(text, media_type="text/plain")

    def app(self) -> Starlette:
        """The ASGI app: TGI's routes, then the test-only ones."""
        return Starlette(routes=[
            Route("/", self.route_compat, methods=["POST"]),
            Route("/generate", self.route_generate, methods=["POST"]),
            Route("/generate_stream", self.route_generate_stream, methods=["POST"]),
            Route("/v1/chat/completions", self.route_chat_completions, methods=["POST"]),
            Route("/chat_tokenize", self.route_chat_tokenize, methods=["POST"]),
            Route("/tokenize", self.route_tokenize, methods=["POST"]),
            Route("/info", self.route_info, methods=["GET"]),
            Route("/health", self.route_health, methods=["GET"]),
            Route("/v1/models", self.route_models, methods=["GET"]),
            Route("/metrics", self.route_metrics, methods=["GET"]),
            *routes_for_tests(self),
        ])


def chat_finish(finish_reason: str) -> str:
    """A native finish reason in the Messages API's words (eos_token is "stop")."""
    return "stop" if finish_reason == "eos_token" else finish_reason


def routes_for_tests(server: TGIProtocolServer) -> list[Route]:
    """The routes tests read the server's records through, and arm its faults with."""

    def listing(records: list, as_json: Callable[[Any], Any] = lambda record: record, clears: bool = False):
        async def route(request: Request) -> Response:
            if clears and request.method == "DELETE":
                records.clear()
            return JSONResponse([as_json(record) for record in records])
        return route

    async def state(request: Request) -> Response:
        return JSONResponse({"in_flight": server.scheduler.in_flight})

    async def faults(request: Request) -> Response:
        payload = await request.json()
        if not isinstance(payload, dict):
            return JSONResponse({"error": "send a JSON object"}, status_code=400)
        return JSONResponse(server.faults.update(payload))

    return [
        Route("/__contract__/violations", listing(server.responder.violations, clears=True), methods=["GET", "DELETE"]),
        Route("/__test__/requests", listing(server.requests, clears=True), methods=["GET", "DELETE"]),
        Route("/__test__/generations", listing(server.scheduler.generations, asdict), methods=["GET"]),
        Route("/__test__/state", state, methods=["GET"]),
        Route("/__test__/faults", faults, methods=["POST"]),
    ]
