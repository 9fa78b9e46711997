"""Text Generation Inference (TGI), on either of its two routes.

Written against TGI's own OpenAPI spec. One pooled `httpx.AsyncClient` per
backend carries every request (streams, /info, /health, /chat_tokenize), so
a measured request never pays for building a client or opening a
connection: a kept connection is reused, and one that idled long enough for
the server to drop it is reopened in `prepare()`, before the clock starts.
Server-sent events are read with `httpx-sse`; each event is parsed into
huggingface_hub's typed TGI outputs (`TextGenerationStreamOutput`,
`ChatCompletionStreamOutput`) and turned into chunks by pure functions.
Closing the stream (the user's Stop) closes its HTTP response, so TGI
cancels the generation.

- route "messages" (default): `POST /v1/chat/completions` with
  `stream_options.include_usage`; TGI applies the model's chat template.
  A LoRA adapter is selected by sending its id as `model` ("tgi" = none).
  Chunks carry no token counts of their own: the closing usage is the final,
  exact count (until it arrives the count is marked estimated).
- route "generate": TGI's native `POST /generate_stream` with `details`.
  The prompt is the server's own templating of the conversation
  (`/chat_tokenize` -> `templated_text`, looked up in `prepare()`, never
  inside the measured time), or a Jinja chat template from configuration
  rendered here. A LoRA adapter goes in `parameters.adapter_id`. One event
  = one token (the end-of-sequence token included, with `special: true`;
  its text is not shown).

TGI answers a streaming request with 200 and reports later problems as an
event `{"error", "error_type"}`; a proxy or an older server may answer with
the HTTP status instead. Both become the same typed errors (a 429/503 with
`Retry-After` says when to send again). A stream must end with its final
event (native: `details`; Messages API: a `finish_reason` or `[DONE]`); one
that breaks off is `ConnectionLost` ("lost mid-reply") or `GenerationFailed`,
never a short reply shown as complete. Error answers go through the status
table every HTTP kind shares (`backends.errors.error_for_status`). TGI reports its
timing headers (x-queue-time, x-inference-time, x-time-per-token) only on
non-streaming responses; they are read whenever a response carries them.
"""

from __future__ import annotations

import json
import time
from contextlib import aclosing
from pathlib import Path
from typing import Any, AsyncIterator, Mapping, Sequence

import httpx
from httpx_sse import EventSource, SSEError
from huggingface_hub import ChatCompletionStreamOutput, TextGenerationStreamOutput
from jinja2 import TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment

from backends.base import (
    BackendInfo,
    ChatMessage,
    GenerationParams,
    IgnoredSetting,
    PreparedRequest,
    ServerFigures,
    StreamChunk,
    StreamLimits,
    ignore_unsupported,
)
from backends.engine_metrics import TGI_SOURCE, EngineSnapshot, parse_tgi_metrics
from backends.offloop import trace_requests
from backends.warmth import IdleWarmth
from backends.errors import (
    BackendError,
    BackendTimeout,
    BackendUnavailable,
    ConfigurationError,
    ConnectionLost,
    GenerationFailed,
    InputRejected,
    error_for_status,
    parse_retry_after,
    register_secret,
)
from backends.kinds import Kind, Variable, one_of
from config import BackendConfig

ROUTES = ("messages", "generate")
ROUTE_PATHS = {"messages": "/v1/chat/completions", "generate": "/generate_stream"}
NO_ADAPTER_MODEL = "tgi"  # the Messages API's `model` meaning "the base model, no LoRA adapter"
# TGI's vocabularies: native `details.finish_reason`, and the OpenAI-style one the UI shows.
FINISH_REASONS = {"eos_token": "stop", "stop_sequence": "stop", "length": "length", "stop": "stop"}
EVENT_QUOTE_LIMIT = 200  # characters of a malformed event quoted in a message
# /info's `router` of the TGI-protocol stand-in (servers/tgi_protocol): its numbers are a stand-in's, not TGI's.
TEST_SERVER_ROUTER = "tgi-protocol-test-server"
WARM_AFTER_IDLE_S = 3.0  # a connection idle longer than this is reopened before the clock starts
# The optional settings each route can send (GenerationParams names); the kind honours their union.
ROUTE_SAMPLING = {"messages": ("seed",), "generate": ("top_k", "repetition_penalty", "seed")}
# TGI's timing headers (milliseconds) -> ServerFigures fields.
TIMING_HEADERS = {
    "x-queue-time": "queue_s",
    "x-inference-time": "inference_s",
    "x-time-per-token": "time_per_output_token_s",
}


# ---------------------------------------------------------------- pure functions


def finish_reason_of(reason: str | None) -> str | None:
    """TGI's finish reason in the OpenAI vocabulary the UI shows."""
    if not reason:
        return None
    return FINISH_REASONS.get(reason, reason)


def generate_event_chunk(event: TextGenerationStreamOutput) -> StreamChunk:
    """One native /generate_stream event: exactly one token (a special token shows no text)."""
    token = event.token
    text = "" if token.special else token.text
    details = event.details
    if details is None:
        return StreamChunk(text=text, token_count=1)
    return StreamChunk(
        text=text,
        token_count=1,
        finish_reason=finish_reason_of(details.finish_reason),
        server_figures=ServerFigures(
            source="TGI details",
            output_tokens=details.generated_tokens,
            input_tokens=details.input_length,
            finish_reason=details.finish_reason,
        ),
    )


def chat_event_chunks(event: ChatCompletionStreamOutput) -> list[StreamChunk]:
    """One Messages API chunk. Its choices carry text but no token count (counted by the
    closing usage); a role-only or finish-only chunk is an empty server event."""
    chunks = [
        StreamChunk(
            text=choice.delta.content or "",
            token_count=None if choice.delta.content else 0,
            finish_reason=finish_reason_of(choice.finish_reason),
        )
        for choice in event.choices
    ]
    if event.usage is not None:
        chunks.append(StreamChunk(
            token_count=0,
            server_figures=ServerFigures(
                source="TGI usage",
                output_tokens=event.usage.completion_tokens,
                input_tokens=event.usage.prompt_tokens,
            ),
        ))
    return chunks


def header_figures(headers: Mapping[str, str]) -> ServerFigures | None:
    """TGI's timing headers (milliseconds), where a response carries them."""
    values: dict[str, float] = {}
    for header, field_name in TIMING_HEADERS.items():
        raw = headers.get(header)
        try:
            values[field_name] = float(raw) / 1000.0
        except (TypeError, ValueError):
            continue
    if not values:
        return None
    return ServerFigures(source="TGI timing headers", **values)


def top_p_to_send(top_p: float) -> float | None:
    """TGI accepts top_p only strictly between 0 and 1; 1.0 means "no nucleus filter", so omit it."""
    return top_p if 0.0 < top_p < 1.0 else None


# Reasons shown next to the reply, read as "<setting> <reason>: ignored".
GREEDY_REASON = "is not sent (greedy decoding at temperature 0)"
TOP_P_ONE_REASON = "1.0 is not sent (TGI refuses 1.0; without it no top-p filter applies, the same)"


def dropped_settings(params: GenerationParams, route: str) -> tuple[IgnoredSetting, ...]:
    """The panel's settings this route supports but does not send, and why (shown next to the reply).

    At temperature 0 TGI decodes greedily: top-p, and top-k and seed where the
    panel set them, are left out (on the native route any of them would switch
    sampling back on). While sampling, top-p 1.0 is left out (TGI refuses it).
    """
    if params.greedy:
        names = ["top_p"] + [name for name in ("top_k", "seed")
                             if getattr(params, name) is not None and name in ROUTE_SAMPLING[route]]
        return tuple(IgnoredSetting(name, GREEDY_REASON) for name in names)
    if top_p_to_send(params.top_p) is None:
        return (IgnoredSetting("top_p", TOP_P_ONE_REASON),)
    return ()


def _sampling_fields(params: GenerationParams, fields: dict[str, Any]) -> None:
    """top-p and seed when sampling, the same on both routes (see `dropped_settings` for what is left out)."""
    top_p = top_p_to_send(params.top_p)
    if top_p is not None:
        fields["top_p"] = top_p
    if params.seed is not None:
        fields["seed"] = params.seed


def native_parameters(params: GenerationParams, adapter_id: str | None) -> tuple[dict[str, Any], list[str]]:
    """GenerateParameters for /generate_stream (only what the panel set) and notes on translations."""
    notes: list[str] = []
    parameters: dict[str, Any] = {"max_new_tokens": params.max_new_tokens, "details": True}
    if params.greedy:
        # TGI refuses temperature 0 here; greedy decoding is do_sample=false with no warpers
        # (a top-k, top-p or seed would switch sampling back on).
        parameters["do_sample"] = False
        notes.append("temperature 0: greedy, sent as do_sample=false (TGI refuses temperature 0 on this route)")
    else:
        parameters["do_sample"] = True
        parameters["temperature"] = params.temperature
        _sampling_fields(params, parameters)
        if params.top_k is not None:
            parameters["top_k"] = params.top_k
    if params.repetition_penalty is not None:
        parameters["repetition_penalty"] = params.repetition_penalty
    if adapter_id:
        parameters["adapter_id"] = adapter_id
    return parameters, notes


def messages_fields(params: GenerationParams) -> tuple[dict[str, Any], list[str]]:
    """ChatRequest sampling fields for the Messages API (only what the panel set) and notes."""
    notes: list[str] = []
    fields: dict[str, Any] = {"max_tokens": params.max_new_tokens, "temperature": params.temperature}
    if params.greedy:
        notes.append("temperature 0: TGI decodes greedily")
    else:
        _sampling_fields(params, fields)
    return fields, notes


# ---------------------------------------------------------------- backend


class TGIBackend:
    """A TGI server (or anything speaking its protocol) on one of its two routes."""

    def __init__(self, config: BackendConfig) -> None:
        options = KIND.options_of(config)  # ConfigurationError naming the variable for a bad route
        if not config.base_url:
            raise ConfigurationError(f"Set {config.env_prefix}BASE_URL to the TGI server's URL.")
        self.config = config
        self.name = config.name
        self.kind = KIND.name
        self.in_process = KIND.in_process
        self.label = config.label
        self.url = config.base_url.rstrip("/")
        self.route = options["route"]
        self.adapter_id = options["adapter_id"] or None
        self.stream_limits = StreamLimits.of(config)
        register_secret(config.api_key)
        # Only the configured key is ever sent (never a locally stored Hugging Face token).
        headers = {"authorization": f"Bearer {config.api_key}"} if config.api_key else {}
        # Kept for the life of the process and shared by all sessions: warm, pooled connections.
        self._http = httpx.AsyncClient(
            base_url=self.url,
            timeout=httpx.Timeout(config.timeout_s, connect=config.connect_timeout_s),
            headers=headers,
            event_hooks={"request": [trace_requests]},  # when each request left (backends/offloop.py)
            # Dropped after WARM_AFTER_IDLE_S idle, before the server's keep-alive can close one under a request.
            limits=httpx.Limits(max_connections=1000, max_keepalive_connections=100, keepalive_expiry=WARM_AFTER_IDLE_S),
        )
        self._template = _compile_template(options["chat_template"], config) if options["chat_template"] else None
        self._warmth = IdleWarmth(lambda: self.warm_up(), WARM_AFTER_IDLE_S)

    # ------------------------------------------------------------ streaming

    async def prepare(self, messages: Sequence[ChatMessage], params: GenerationParams) -> PreparedRequest:
        """Template (native route), warm the connection if it idled, shape the body. Not measured."""
        started = time.perf_counter()
        notes: list[str] = []
        if self.route == "generate":
            prompt = await self.build_prompt(messages)
            parameters, notes = native_parameters(params, self.adapter_id)
            body: dict[str, Any] = {"inputs": prompt, "parameters": parameters}
            sent = {k: v for k, v in parameters.items() if k not in ("details", "adapter_id")}
            reason = "is not supported by TGI"
            if self._template is None:
                notes.append("prompt templated by the server's /chat_tokenize before the clock started")
        else:
            fields, notes = messages_fields(params)
            body = {
                "model": self.adapter_id or NO_ADAPTER_MODEL,
                "messages": [message.as_dict() for message in messages],
                "stream": True,
                "stream_options": {"include_usage": True},
                **fields,
            }
            sent = dict(fields)
            reason = "is not supported by TGI's Messages API (TGI_ROUTE=generate sends top-k and repetition penalty)"
        await self._warmth.ensure()
        notes.append("settings left empty are not sent: TGI's own defaults apply")
        return PreparedRequest(
            messages=tuple(messages), params=params, model=self.adapter_id or NO_ADAPTER_MODEL, sent=sent,
            ignored=ignore_unsupported(params, ROUTE_SAMPLING[self.route], reason)
            + dropped_settings(params, self.route),
            notes=tuple(notes), prepare_s=time.perf_counter() - started, body=body,
        )

    async def stream(self, request: PreparedRequest) -> AsyncIterator[StreamChunk]:
        """Send the prepared request on the kept client; the HTTP stream is closed when this ends or is closed."""
        path = ROUTE_PATHS[self.route]
        self._warmth.used()
        events: int | None = None  # None until the response headers arrived: errors before are not mid-reply
        finished = False
        try:
            async with self._http.stream("POST", path, json=request.body,
                                         headers={"accept": "text/event-stream"}) as response:
                if response.status_code != 200:
                    await response.aread()
                    self._raise_for_status(response, path)
                events = 0
                figures = header_figures(response.headers)
                # Closed here, not by the garbage collector in some other task, when an error
                # event or the consumer's Stop ends the loop early.
                async with aclosing(EventSource(response).aiter_sse()) as sse:
                    async for event in sse:
                        events += 1
                        # Read on past [DONE] to the end of the body: a response read to its end
                        # hands its connection back to the pool; one left unread would be closed.
                        if event.data.strip() == "[DONE]":
                            finished = True
                            continue
                        for chunk in self._event_chunks(event.data, path):
                            finished = finished or chunk.finish_reason is not None
                            yield chunk
                if figures is not None:
                    yield StreamChunk(token_count=0, server_figures=figures)
        except SSEError as error:
            raise GenerationFailed(
                self.label, self.url, f"{path} did not answer with an event stream ({error}).",
                hint=f"Check that {self.config.env_prefix}BASE_URL points at TGI.",
            ) from None
        except httpx.HTTPError as error:
            raise self.translate_error(error, path, mid_reply_after=events) from error
        finally:
            self._warmth.used()
        if not finished:
            final = "its final event (details)" if self.route == "generate" else "a finish_reason or [DONE]"
            raise GenerationFailed(
                self.label, self.url,
                f"the server closed the stream before the reply finished (after {events} events, "
                f"without {final}).",
                hint="The text so far is kept; send again. If it keeps happening, check the TGI server's log.",
            )

    def _event_chunks(self, data: str, path: str) -> list[StreamChunk]:
        """One SSE event's chunks; an error event raises the typed error."""
        try:
            payload = json.loads(data)
        except json.JSONDecodeError:
            raise GenerationFailed(
                self.label, self.url, f"{path} sent an event that is not JSON: {_quote(data)}",
                hint="The text so far is kept. Check that the URL points at TGI.",
            ) from None
        if not isinstance(payload, dict):
            raise GenerationFailed(self.label, self.url, f"{path} sent an unexpected event: {_quote(data)}")
        if payload.get("error"):
            raise self.event_error(payload, path)
        try:
            if self.route == "generate":
                return [generate_event_chunk(TextGenerationStreamOutput.parse_obj_as_instance(payload))]
            return chat_event_chunks(ChatCompletionStreamOutput.parse_obj_as_instance(payload))
        except (KeyError, TypeError, ValueError, AttributeError) as error:
            raise GenerationFailed(
                self.label, self.url,
                f"{path} sent an event outside TGI's schema ({error}): {_quote(data)}",
                hint="The text so far is kept. Check that the URL points at TGI.",
            ) from None

    def start_up(self) -> None:
        """Nothing to do before the first page: the connection and the client's first call are
        paid in `prepare` (warm_up), before any clock."""

    def pending_warm_up(self) -> str | None:
        return None

    async def warm_up(self) -> None:
        """Open (or refresh) a pooled connection with a cheap request, outside any measurement."""
        await self.health()

    async def engine_snapshot(self) -> EngineSnapshot | None:
        """TGI's /metrics: queue size, current batch size, mean time per token."""
        taken_at_s = time.monotonic()
        response = await self._request("GET", "/metrics")
        if response.status_code == 404:
            return None
        self._raise_for_status(response, "/metrics")
        return parse_tgi_metrics(response.text, taken_at_s)

    # ------------------------------------------------------------ prompt

    async def build_prompt(self, messages: Sequence[ChatMessage]) -> str:
        """The text the native route sends: the configured template, else the server's own templating."""
        if self._template is not None:
            try:
                return self._template.render(
                    messages=[message.as_dict() for message in messages],
                    add_generation_prompt=True,
                    bos_token="",
                    eos_token="",
                )
            except TemplateError as error:
                raise InputRejected(
                    self.label, self.url, f"the configured chat template failed on this conversation: {error}",
                    hint=f"Fix {self.config.env_prefix}CHAT_TEMPLATE, or unset it to let TGI template the chat.",
                ) from None
        tokenized = await self._chat_tokenize(messages)
        if tokenized is None:
            raise BackendUnavailable(
                self.label, self.url, "the server cannot template the chat (/chat_tokenize answered 404).",
                hint=f"Set {self.config.env_prefix}CHAT_TEMPLATE to the model's chat template, "
                     f"or use {self.config.env_prefix}ROUTE=messages.",
            )
        return tokenized["templated_text"]

    async def _chat_tokenize(self, messages: Sequence[ChatMessage]) -> dict[str, Any] | None:
        """TGI's ChatTokenizeResponse for this conversation, or None when the server cannot template."""
        body = {"model": self.adapter_id or NO_ADAPTER_MODEL, "messages": [m.as_dict() for m in messages]}
        response = await self._request("POST", "/chat_tokenize", json=body)
        if response.status_code == 404:
            return None
        self._raise_for_status(response, "/chat_tokenize")
        return response.json()

    async def count_prompt_tokens(self, messages: Sequence[ChatMessage]) -> int | None:
        """Prompt tokens as the server counts them (/chat_tokenize, or /tokenize of the local template)."""
        if self._template is not None:
            prompt = await self.build_prompt(messages)
            response = await self._request("POST", "/tokenize", json={"inputs": prompt})
            if response.status_code == 404:
                return None
            self._raise_for_status(response, "/tokenize")
            return len(response.json())
        tokenized = await self._chat_tokenize(messages)
        return None if tokenized is None else len(tokenized["tokenize_response"])

    # ------------------------------------------------------------ health and info

    async def health(self) -> None:
        """Return if GET /health answers 200; raise BackendUnavailable with the server's reason otherwise."""
        response = await self._request("GET", "/health")
        if response.status_code == 200:
            self._warmth.used()  # the pool now holds a fresh connection
            return
        if response.status_code != 503:
            self._raise_for_status(response, "/health")
        reason = _server_text(response) or "HTTP 503"
        raise BackendUnavailable(
            self.label, self.url, f"TGI reports it is not healthy ({reason}).",
            hint="Wait for the model to finish loading, or check the TGI server's log.",
        )

    async def info(self) -> BackendInfo:
        """Model id, token limits and version from GET /info."""
        response = await self._request("GET", "/info")
        self._raise_for_status(response, "/info")
        data = response.json()
        details = {"route": self.route, "router": str(data.get("router", ""))}
        if self.adapter_id:
            details["adapter_id"] = self.adapter_id
        if data.get("max_concurrent_requests") is not None:
            details["max_concurrent_requests"] = str(data["max_concurrent_requests"])
        stand_in = None
        if data.get("router") == TEST_SERVER_ROUTER:
            stand_in = "TGI-protocol test server (llama.cpp behind TGI's API), not TGI itself"
        return BackendInfo(
            model_id=str(data.get("model_id", "")),
            context_length=data.get("max_total_tokens"),
            server_version=data.get("version"),
            max_input_tokens=data.get("max_input_tokens"),
            details=details,
            stand_in=stand_in,
        )

    async def aclose(self) -> None:
        await self._http.aclose()

    # ------------------------------------------------------------ errors

    async def _request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        try:
            return await self._http.request(method, path, **kwargs)
        except httpx.HTTPError as error:
            raise self.translate_error(error, path) from error

    def _raise_for_status(self, response: httpx.Response, path: str) -> None:
        if response.is_success:
            return
        payload = _json_or_none(response)
        error_type = payload.get("error_type") if isinstance(payload, dict) else None
        raise self._from_status(response.status_code, error_type, _server_text(response), path=path,
                                retry_after_s=parse_retry_after(response.headers.get("retry-after")))

    def event_error(self, payload: Mapping[str, Any], path: str) -> BackendError:
        """An error event inside a stream: TGI's `{"error", "error_type"}`, or an
        OpenAI-style `{"error": {"message", "http_status_code"}}` from a proxy."""
        error = payload.get("error")
        if isinstance(error, Mapping):
            status = error.get("http_status_code")
            return self._from_status(status if isinstance(status, int) else None, error.get("type"),
                                     str(error.get("message", error)), path=path)
        return self._from_status(None, payload.get("error_type"), str(error), path=path)

    def translate_error(self, error: httpx.HTTPError, path: str, *, mid_reply_after: int | None = None) -> BackendError:
        """One typed error, naming this backend and its URL, for a transport failure.

        `mid_reply_after` is the number of events received when the failure came after the
        response had started (None before its headers arrived)."""
        prefix = self.config.env_prefix
        if isinstance(error, httpx.ConnectTimeout):
            return BackendTimeout(
                self.label, self.url,
                f"could not connect within {self.config.connect_timeout_s:g} s ({prefix}CONNECT_TIMEOUT_S).",
                limit="connect", hint=f"The server may be down or unreachable from here. {self._start_hint()}",
            )
        if isinstance(error, httpx.ReadTimeout):
            when = "" if mid_reply_after is None else f" mid-reply (after {mid_reply_after} events)"
            return BackendTimeout(
                self.label, self.url,
                f"no data from {path} for {self.config.timeout_s:g} s{when} ({prefix}TIMEOUT_S, the read timeout).",
                limit="read", hint=f"The server may be overloaded; raise {prefix}TIMEOUT_S in .env to wait longer.",
            )
        if isinstance(error, httpx.TimeoutException):  # writing the request, or waiting for a pooled connection
            return BackendTimeout(
                self.label, self.url, f"{path} timed out ({type(error).__name__}).", limit="read",
                hint=f"The server may be overloaded; try again, or raise {prefix}TIMEOUT_S in .env.",
            )
        if isinstance(error, httpx.ConnectError):
            return BackendUnavailable(self.label, self.url, "the server is not reachable (connection refused).",
                                      hint=self._start_hint())
        if mid_reply_after is not None and isinstance(error, httpx.TransportError):
            return ConnectionLost(
                self.label, self.url,
                f"the connection was lost mid-reply (after {mid_reply_after} events: "
                f"{error or type(error).__name__}).",
                hint="The server may have crashed or restarted; the text so far is kept. "
                     "Send again once it is back (/status shows it).",
            )
        if isinstance(error, (httpx.RemoteProtocolError, httpx.ReadError)):
            return BackendUnavailable(
                self.label, self.url, f"the connection was dropped during {path} ({error or type(error).__name__}).",
                hint="The server may have restarted or crashed; send again once it is back.",
            )
        return BackendUnavailable(
            self.label, self.url, f"the connection failed during {path}: {error or type(error).__name__}.",
            hint="Check that the server is running and the URL points at TGI.",
        )

    def _from_status(self, status: int | None, error_type: str | None, server_text: str, *,
                     retry_after_s: float | None = None, path: str = "") -> BackendError:
        return error_for_status(status, server_text, backend=self.label, url=self.url,
                                prefix=self.config.env_prefix, retry_after_s=retry_after_s,
                                error_type=error_type, path=path)

    def _start_hint(self) -> str:
        return (f"Start the TGI server, or set {self.config.env_prefix}BASE_URL in .env "
                f"to where it runs (now {self.url}).")


def _quote(data: str) -> str:
    return repr(data[:EVENT_QUOTE_LIMIT] + ("..." if len(data) > EVENT_QUOTE_LIMIT else ""))


def _json_or_none(response: Any) -> Any:
    """The response body as JSON; an error body framed as one SSE event (`data:{...}`), as
    TGI sends on a streaming route, is unwrapped first."""
    try:
        body = response.text.strip()
    except httpx.ResponseNotRead:
        return None
    if body.startswith("data:"):
        body = body[len("data:"):].strip()
    try:
        return json.loads(body)
    except ValueError:
        return None


def _server_text(response: Any) -> str:
    """The server's own error text: TGI's `error` field, else the body."""
    payload = _json_or_none(response)
    if isinstance(payload, dict):
        error = payload.get("error")
        if isinstance(error, dict):
            return str(error.get("message", error))
        if error:
            return str(error)
    try:
        return response.text.strip()
    except httpx.ResponseNotRead:
        return ""


def _compile_template(source: str, config: BackendConfig):
    """The configured chat template: Jinja source, or a path to a file holding it."""
    if "{" not in source and len(source) < 4096 and Path(source).expanduser().is_file():
        source = Path(source).expanduser().read_text(encoding="utf-8")
    # The sandbox Hugging Face uses for chat templates.
    environment = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    environment.globals["raise_exception"] = _raise_template_error
    try:
        return environment.from_string(source)
    except TemplateError as error:
        raise ConfigurationError(f"{config.env_prefix}CHAT_TEMPLATE is not a valid Jinja template: {error}") from None


def _raise_template_error(message: str) -> None:
    raise TemplateError(message)


KIND = Kind(
    name="tgi",
    label="TGI",
    create=TGIBackend,
    default_url="http://127.0.0.1:8080",
    variables=(
        Variable("ROUTE", "messages", "messages = /v1/chat/completions (chat template applied by TGI); "
                                      "generate = native /generate_stream with details.", one_of(*ROUTES)),
        Variable("ADAPTER_ID", "", "LoRA adapter id loaded by the server (LORA_ADAPTERS); empty = base model."),
        Variable("CHAT_TEMPLATE", "", "Native route only: a Jinja chat template (or a file holding one) "
                                      "used instead of /chat_tokenize."),
    ),
    metrics_source=TGI_SOURCE,
    sampling=tuple(sorted({name for names in ROUTE_SAMPLING.values() for name in names})),
)
