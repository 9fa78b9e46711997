"""vLLM and any other OpenAI-compatible server, through the `openai` package.

Kind "vllm" asks for `continuous_usage_stats`, so every streamed chunk carries
the cumulative completion-token count and each chunk's exact token count is
the difference to the previous one. Kind "openai" (llama.cpp's server, other
engines) asks only for `include_usage`: chunks carry no counts (the
measurement marks its count estimated) and the closing usage, where the
server sends one, becomes the server's figures.

The server's own timings are kept where it sends them: vLLM's per-request
`metrics` on the closing usage chunk (servers started with
`--enable-per-request-metrics`, as `scripts/vllm_server.sh` does) and
llama.cpp server's `timings` on whichever chunk carries them. Usage on a
chunk with a `finish_reason` is the final usage: older llama.cpp servers
send it there (with `timings`) instead of on a separate `choices: []` chunk.

Sampling: kind "vllm" sends top-k, min-p, repetition penalty and seed
(vLLM's extensions of the protocol); kind "openai" sends only what the
OpenAI API defines (temperature, top-p, max tokens, seed) and reports the
others as ignored (each kind's `sampling`). Settings left empty are not sent.

Error answers become typed errors through the one status table every HTTP
kind shares (`backends.errors.error_for_status`).

`prepare()` resolves the served model id (cached) and, after the connection
sat idle long enough for the server to close it, opens a fresh one, so the
measured request never pays for either.

The parsing of chunks and errors is in small pure functions below, tested on
chunks recorded from a real vLLM server (tests/test_openai_parsing.py).

A stream must end with a `finish_reason`: one that ends without it, breaks
off, or carries a line that is not JSON or a chunk of another shape is a
`GenerationFailed` that says so (the text so far is kept), never a short
reply shown as complete. A connection that breaks once the reply has started
is `ConnectionLost` ("lost mid-reply"), not "not reachable".
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field, replace
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any

import httpx2  # the openai package's own transport: its exceptions are the causes of openai's
import openai

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
from backends.engine_metrics import VLLM_SOURCE, EngineSnapshot, MetricsFormatError, parse_vllm_metrics
from backends.keepalive import RetryClosedKeepAlive
from backends.offloop import trace_requests
from backends.warmth import IdleWarmth
from backends.errors import (
    BackendError,
    BackendTimeout,
    BackendUnavailable,
    ConfigurationError,
    ConnectionLost,
    GenerationFailed,
    error_for_status,
    parse_retry_after,
    register_secret,
)
from backends.kinds import Kind, Variable
from config import BackendConfig

VLLM_START_COMMAND = "bash scripts/vllm_server.sh"
# Sent when no key is configured: the client library insists on one, servers started without
# --api-key ignore it.
PLACEHOLDER_API_KEY = "not-needed"
# Servers close idle keep-alive connections (uvicorn, so vLLM: after 5 s); a connection idle
# longer than this is reopened in prepare() rather than inside the measured request.
WARM_AFTER_IDLE_S = 3.0
# The SDK's own pool limits, but a pooled connection is dropped after WARM_AFTER_IDLE_S idle, before the
# server's keep-alive (uvicorn's 5 s) can close it under a request: a class sending again 5 s after its
# last replies had 3 of 30 requests fail "Server disconnected without sending a response".
POOL_LIMITS = {"max_connections": 1000, "max_keepalive_connections": 100, "keepalive_expiry": WARM_AFTER_IDLE_S}
QUOTE_LIMIT = 200  # characters of a malformed line or chunk quoted in an error
_CHAT_PATH = "/chat/completions"
# The SDK's stream (SSE decoding, `[DONE]`, in-band errors, timeouts as its exceptions) yielding each
# chunk's JSON as is: no pydantic model per chunk.
_RAW_STREAM = openai.AsyncStream[object]


class MalformedChunk(ValueError):
    """A streamed chunk that is not a `chat.completion.chunk` this app can read; says what is wrong."""


def quote(value: object, limit: int = QUOTE_LIMIT) -> str:
    """A short, printable excerpt of what the server sent."""
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str)
    return repr(text[:limit] + ("..." if len(text) > limit else ""))


# ---------------------------------------------------------------- pure parsing


def parse_chunk(
    data: Mapping[str, Any], completion_tokens_so_far: int | None, *, usage_source: str
) -> tuple[StreamChunk | None, int | None]:
    """Turn one `chat.completion.chunk` (as JSON) into a StreamChunk.

    `completion_tokens_so_far` is the cumulative completion-token count seen
    on earlier chunks, or None while no chunk has carried a running count
    (start a stream with None). Returns the chunk to pass on (None only for
    a chunk that carries nothing at all) and the new cumulative count.

    - A chunk with a running `usage` (vLLM `continuous_usage_stats`) holds
      exactly `usage.completion_tokens - completion_tokens_so_far` tokens,
      even when its text is empty (vLLM holds back partial UTF-8 characters)
      or when it carries several tokens at once.
    - A chunk without usage: token_count None (the protocol does not say).
    - The empty role chunk becomes an empty chunk: it is the server's first
      byte in the timeline, with no text and no tokens.
    - The closing usage chunk (`choices == []`) carries no text or tokens, only
      the server's own figures (and vLLM's per-request `metrics` if enabled).
    - Usage on the chunk with the `finish_reason` is the final usage as well
      (the server's figures). Older llama.cpp servers send it there, after
      chunks that carried no counts: it then adds no tokens of its own (the
      server's count replaces the estimate). vLLM's continuous usage on that
      chunk is cumulative, so it still counts its difference.
    - llama.cpp's server `timings` are kept from whichever chunk carries them.

    Raises MalformedChunk (naming the problem, quoting the chunk) for anything
    else: not an object, `choices` not a list, a choice or delta that is not
    an object, text that is not a string, a usage count that is not a number.
    """
    check_chunk_shape(data)
    usage = data.get("usage") or None
    choices = data.get("choices") or []
    figures = server_figures(data, usage_source)
    if not choices:
        if figures is None:
            return None, completion_tokens_so_far
        return StreamChunk(text="", token_count=0, server_figures=figures), completion_tokens_so_far
    choice = choices[0]
    delta = choice.get("delta") or {}
    text = delta.get("content") or ""
    finish_reason = choice.get("finish_reason")
    token_count: int | None = None
    counted = usage is not None and usage.get("completion_tokens") is not None
    running = counted and (completion_tokens_so_far is not None or finish_reason is None)
    if running:
        cumulative = int(usage["completion_tokens"])
        so_far = completion_tokens_so_far or 0
        token_count = max(0, cumulative - so_far)
        completion_tokens_so_far = max(cumulative, so_far)
    elif not text:
        token_count = 0  # a role-only or finish-only chunk carries no token we can see
    chunk = StreamChunk(text=text, token_count=token_count, finish_reason=finish_reason, server_figures=figures)
    return chunk, completion_tokens_so_far


def check_chunk_shape(data: object) -> None:
    """Raise MalformedChunk unless `data` has the shape `parse_chunk` reads."""

    def problem(what: str) -> MalformedChunk:
        return MalformedChunk(f"{what}: {quote(data)}")

    def kind(value: object) -> str:
        return type(value).__name__

    if not isinstance(data, Mapping):
        raise problem(f"the chunk is a JSON {kind(data)}, not an object")
    choices = data.get("choices")
    if choices is not None and not isinstance(choices, list):
        raise problem(f'"choices" is a {kind(choices)}, not a list')
    for choice in choices or []:
        if not isinstance(choice, Mapping):
            raise problem(f"a choice is a {kind(choice)}, not an object")
        delta = choice.get("delta")
        if delta is not None and not isinstance(delta, Mapping):
            raise problem(f'"delta" is a {kind(delta)}, not an object')
        content = (delta or {}).get("content")
        if content is not None and not isinstance(content, str):
            raise problem(f'"delta.content" is a {kind(content)}, not text')
        finish = choice.get("finish_reason")
        if finish is not None and not isinstance(finish, str):
            raise problem(f'"finish_reason" is a {kind(finish)}, not text')
    usage = data.get("usage")
    if usage is not None and not isinstance(usage, Mapping):
        raise problem(f'"usage" is a {kind(usage)}, not an object')
    for name in ("completion_tokens", "prompt_tokens"):
        count = (usage or {}).get(name)
        if count is not None and (isinstance(count, bool) or not isinstance(count, int)):
            raise problem(f'"usage.{name}" is a {kind(count)}, not a whole number')
    details = (usage or {}).get("prompt_tokens_details")
    if details is not None and not isinstance(details, Mapping):
        raise problem(f'"usage.prompt_tokens_details" is a {kind(details)}, not an object')
    cached = (details or {}).get("cached_tokens")
    if cached is not None and (isinstance(cached, bool) or not isinstance(cached, int)):
        raise problem(f'"usage.prompt_tokens_details.cached_tokens" is a {kind(cached)}, not a whole number')


def server_figures(data: Mapping[str, Any], usage_source: str) -> ServerFigures | None:
    """The server's own report on a chunk: final usage, vLLM `metrics`, llama.cpp `timings`."""
    usage = data.get("usage") or None
    choices = data.get("choices") or []
    finishing = any(choice.get("finish_reason") for choice in choices)
    figures: ServerFigures | None = None
    # Usage on a chunk mid-stream is a running count (vLLM continuous usage), not the server's report.
    if usage is not None and (not choices or finishing):
        details = usage.get("prompt_tokens_details") or {}
        figures = ServerFigures(
            source=usage_source,
            output_tokens=usage.get("completion_tokens"),
            input_tokens=usage.get("prompt_tokens"),
            cached_prompt_tokens=details.get("cached_tokens"),
        )
    metrics = data.get("metrics")
    if isinstance(metrics, Mapping):
        reported = vllm_request_metrics(metrics)
        figures = reported if figures is None else figures.merged(reported)
    timings = data.get("timings")
    if isinstance(timings, Mapping):
        reported = llamacpp_server_timings(timings)
        figures = reported if figures is None else figures.merged(reported)
    return None if figures is None else with_prefill_rate(figures)


def with_prefill_rate(figures: ServerFigures) -> ServerFigures:
    """vLLM reports no prefill time of its own, but its per-request `time_to_first_token_ms` runs from
    the request's scheduling to its first token: the prefill (and one sampling step). Its prefill
    speed is then the prompt tokens it computed (all but the cached ones) over that time. An engine
    that reports its own prompt rate (llama.cpp's `prompt_per_second`) keeps it."""
    if figures.prompt_tokens_per_s is not None or figures.first_token_s is None or figures.first_token_s <= 0:
        return figures
    computed = figures.computed_prompt_tokens
    if computed is None or computed <= 0:
        return figures
    return replace(figures, prompt_tokens_per_s=computed / figures.first_token_s)


def _ms(value: Any) -> float | None:
    return float(value) / 1000.0 if isinstance(value, (int, float)) else None


def vllm_request_metrics(metrics: Mapping[str, Any]) -> ServerFigures:
    """vLLM's per-request `metrics` (`--enable-per-request-metrics`).

    Its `time_to_first_token_ms` counts from when the request was scheduled
    (queue excluded: `queue_time_ms`); `generation_time_ms` is first to last
    output token; `mean_itl_ms` = generation time / (tokens - 1);
    `tokens_per_second` = output tokens over scheduling-to-last-token (prefill
    included), so it is not a decode rate.
    """
    return ServerFigures(
        source="vLLM per-request metrics",
        queue_s=_ms(metrics.get("queue_time_ms")),
        first_token_s=_ms(metrics.get("time_to_first_token_ms")),
        decode_s=_ms(metrics.get("generation_time_ms")),
        time_per_output_token_s=_ms(metrics.get("mean_itl_ms")),
        output_tokens_per_s=metrics.get("tokens_per_second"),
    )


def llamacpp_server_timings(timings: Mapping[str, Any]) -> ServerFigures:
    """llama.cpp server's `timings` (prompt_n/prompt_ms, predicted_n/predicted_ms, rates).

    `cache_n` is the prompt tokens it reused from the slot's cache, `prompt_n` the ones it
    evaluated (its `prompt_per_second` is over those), so the prompt is their sum."""
    prompt_s = _ms(timings.get("prompt_ms"))
    decode_s = _ms(timings.get("predicted_ms"))
    cached, evaluated = timings.get("cache_n"), timings.get("prompt_n")
    whole = isinstance(cached, int) and isinstance(evaluated, int)
    return ServerFigures(
        source="llama.cpp server timings",
        input_tokens=cached + evaluated if whole else None,
        cached_prompt_tokens=cached if isinstance(cached, int) else None,
        output_tokens=timings.get("predicted_n"),
        prompt_s=prompt_s,
        decode_s=decode_s,
        inference_s=prompt_s + decode_s if prompt_s is not None and decode_s is not None else None,
        time_per_output_token_s=_ms(timings.get("predicted_per_token_ms")),
        decode_tokens_per_s=timings.get("predicted_per_second"),
        prompt_tokens_per_s=timings.get("prompt_per_second"),
    )


def error_message(body: object, fallback: str = "") -> str:
    """The human message inside an error body, whatever shape the server used.

    Handles OpenAI/vLLM `{"error": {"message": ...}}`, the inner
    `{"message": ...}` (what the openai package keeps as `.body`), older vLLM
    `{"object": "error", "message": ...}`, FastAPI `{"detail": ...}` and
    plain strings.
    """
    if isinstance(body, Mapping):
        if "error" in body and body["error"]:
            return error_message(body["error"], fallback)
        for key in ("message", "detail", "msg"):
            value = body.get(key)
            if isinstance(value, str) and value:
                return value
            if isinstance(value, list) and value:
                return "; ".join(error_message(item, str(item)) for item in value)
        return fallback
    if isinstance(body, str) and body.strip():
        return body.strip()
    return fallback


def server_root(base_url: str) -> str:
    """The server's root URL (where vLLM serves /health, /version, /tokenize) from its /v1 base URL."""
    root = base_url.rstrip("/")
    return root[: -len("/v1")] if root.endswith("/v1") else root


# ---------------------------------------------------------------- the SDK's first call, before any clock

# A short streamed reply as a vLLM server sends it (role chunk, text with running usage, finish,
# closing usage, [DONE]): what the rehearsal below feeds the SDK instead of a server.
_REHEARSAL_CHUNKS = (
    {"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}]},
    {"choices": [{"index": 0, "delta": {"content": "hi"}, "finish_reason": None}],
     "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}},
    {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]},
    {"choices": [], "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}},
)
_REHEARSAL_STREAM = ("".join(
    "data: " + json.dumps({"id": "rehearsal", "object": "chat.completion.chunk", "created": 0, "model": "rehearsal",
                           **chunk}) + "\n\n" for chunk in _REHEARSAL_CHUNKS) + "data: [DONE]\n\n").encode()
_rehearsed = False


async def rehearse_sdk() -> None:
    """Run the openai SDK's whole streaming path once per process, on a recorded reply served from
    memory (no server, no network): the SDK sets up its request options, headers and stream
    decoding on first use (~20 ms measured), which would otherwise fall inside the first measured
    request of the process. Every backend of the openai kinds calls it from `warm_up`, before any clock."""
    global _rehearsed
    if _rehearsed:
        return
    transport = httpx2.MockTransport(lambda request: httpx2.Response(
        200, headers={"content-type": "text/event-stream"}, content=_REHEARSAL_STREAM))
    async with httpx2.AsyncClient(transport=transport) as http:
        client = openai.AsyncOpenAI(base_url="http://rehearsal.invalid/v1", api_key=PLACEHOLDER_API_KEY,
                                    max_retries=0, http_client=http)
        stream = await client.post(_CHAT_PATH, cast_to=object, stream=True, stream_cls=_RAW_STREAM, body={
            "model": "rehearsal", "messages": [{"role": "user", "content": "hi"}], "stream": True, "max_tokens": 1,
            "temperature": 0.7, "top_p": 0.9, "seed": 1, "top_k": 1,
            "stream_options": {"include_usage": True, "continuous_usage_stats": True}})
        tokens = None
        async for data in stream:
            _, tokens = parse_chunk(data, tokens, usage_source="rehearsal")
        await stream.close()
    _rehearsed = True


# ---------------------------------------------------------------- backend


@dataclass(frozen=True)
class RequestShape:
    """What one request sends besides the model and the messages, and what a person reads about it.

    `sent` holds the sampling settings as they go on the wire; those also in `extra_body` are not
    the OpenAI API's and travel as extra body fields (with any other field there, e.g. a server's
    own switches). `ignored` and `notes` are shown beside the reply.
    """

    sent: dict[str, Any]
    extra_body: dict[str, Any] = field(default_factory=dict)
    stream_options: dict[str, Any] = field(default_factory=lambda: {"include_usage": True})
    ignored: tuple[IgnoredSetting, ...] = ()
    notes: tuple[str, ...] = ()


class OpenAICompatBackend:
    """A backend for vLLM (kind "vllm") or any OpenAI-compatible server (kind "openai")."""

    def __init__(self, config: BackendConfig) -> None:
        self.spec = self.kind_of(config)
        self.name = config.name
        self.kind = config.kind
        self.in_process = self.spec.in_process
        self.label = config.label
        self.url = config.base_url
        self.stream_limits = StreamLimits.of(config)
        self._config = config
        self._configured_model = str(self.spec.options_of(config).get("model", ""))
        register_secret(config.api_key)
        self._root_url = server_root(config.base_url)
        # One client per backend, kept for the life of the process: its connection pool
        # is warm for every request (a client per request would add its set-up to TTFT).
        self._client = openai.AsyncOpenAI(
            base_url=config.base_url,
            api_key=config.api_key or PLACEHOLDER_API_KEY,
            max_retries=0,
            timeout=openai.Timeout(config.timeout_s, connect=config.connect_timeout_s),
            # The SDK's own defaults, with each request's sending traced (when it left: backends/offloop.py)
            # and sent once more if a kept-alive connection was closed under it (backends/keepalive.py).
            http_client=openai.DefaultAsyncHttpxClient(
                event_hooks={"request": [trace_requests]},
                transport=RetryClosedKeepAlive(limits=httpx2.Limits(**POOL_LIMITS))),
        )
        self._served_models: list[dict[str, Any]] | None = None
        self._warmth = IdleWarmth(lambda: self.warm_up(), WARM_AFTER_IDLE_S)

    @classmethod
    def kind_of(cls, config: BackendConfig) -> Kind:
        """The kind (of this module's) that `config` names."""
        served = {kind.name: kind for kind in (VLLM_KIND, OPENAI_KIND)}
        if config.kind not in served:
            raise ConfigurationError(f"{cls.__name__} serves the kinds {', '.join(served)}, not {config.kind!r}.")
        return served[config.kind]

    @property
    def is_vllm(self) -> bool:
        return self.spec is VLLM_KIND

    @property
    def _usage_source(self) -> str:
        return "vLLM usage" if self.is_vllm else f"{self.label} usage"

    # ------------------------------------------------------------ streaming

    async def prepare(self, messages: Sequence[ChatMessage], params: GenerationParams) -> PreparedRequest:
        """Resolve the model, warm the connection if it idled, and shape the request (not measured)."""
        started = time.perf_counter()
        model = await self.model_id()
        await self._warmth.ensure()
        shape = self.shape(params)
        # The JSON body exactly as it goes on the wire (vLLM's extensions beside the OpenAI fields).
        request: dict[str, Any] = {
            "model": model,
            "messages": [message.as_dict() for message in messages],
            "stream": True,
            "stream_options": shape.stream_options,
            **shape.sent,
            **shape.extra_body,
        }
        return PreparedRequest(
            messages=tuple(messages), params=params, model=model, sent=shape.sent,
            ignored=shape.ignored, notes=shape.notes,
            prepare_s=time.perf_counter() - started, body=request,
        )

    def shape(self, params: GenerationParams) -> RequestShape:
        """The sampling fields, stream options and notes of one request: what only the kind decides.

        vLLM gets the optional settings the panel set (its protocol extensions) and continuous
        usage; kind openai only what the OpenAI API defines. Settings left empty are not sent.
        """
        supported = self.spec.sampling
        stream_options: dict[str, Any] = {"include_usage": True}
        if self.is_vllm:
            stream_options["continuous_usage_stats"] = True
        sent: dict[str, Any] = {
            "temperature": params.temperature,
            "top_p": params.top_p,
            "max_tokens": params.max_new_tokens,
        }
        extensions: dict[str, Any] = {}
        for name in ("top_k", "min_p", "repetition_penalty"):
            if name in supported and getattr(params, name) is not None:
                sent[name] = extensions[name] = getattr(params, name)
        if params.seed is not None:
            sent["seed"] = params.seed
        if params.ignore_eos and self.is_vllm:
            sent["ignore_eos"] = extensions["ignore_eos"] = True
        reason = "is not part of the OpenAI API (kind openai)" if not self.is_vllm else "is not supported"
        notes = ["settings left empty are not sent: the server's own defaults apply"]
        if self.is_vllm:
            notes.append("vLLM fills unsent settings from the model's generation_config.json (its default)")
        return RequestShape(sent=sent, extra_body=extensions, stream_options=stream_options,
                            ignored=ignore_unsupported(params, supported, reason), notes=tuple(notes))

    def parse(self, data: Mapping[str, Any], completion_tokens_so_far: int | None) -> tuple[StreamChunk | None, int | None]:
        """One streamed chunk (as JSON) -> the chunk to pass on and the running count (`parse_chunk`)."""
        return parse_chunk(data, completion_tokens_so_far, usage_source=self._usage_source)

    async def stream(self, request: PreparedRequest) -> AsyncIterator[StreamChunk]:
        """Send the prepared request; closing this generator closes the HTTP stream (vLLM then aborts).

        The post returns once the response headers arrived: every failure after that is
        mid-reply (the connection lost, the read timeout, a malformed or unfinished stream).
        """
        self._warmth.used()
        try:
            # The SDK's transport, SSE decoding and errors, but each chunk as plain JSON: typed
            # `create()` builds a pydantic model per chunk (then turned back into a dict), ~0.2 ms
            # each, inside the measured time of every stream the loop serves (`_RAW_STREAM`).
            response_stream = await self._client.post(_CHAT_PATH, body=request.body, cast_to=object,
                                                      stream=True, stream_cls=_RAW_STREAM)
        except openai.APIError as error:
            raise self._translate(error) from None
        completion_tokens_so_far: int | None = None
        chunks = 0
        finished = False
        try:
            async for data in response_stream:
                chunks += 1
                chunk, completion_tokens_so_far = self.parse(data, completion_tokens_so_far)
                if chunk is not None:
                    finished = finished or chunk.finish_reason is not None
                    yield chunk
        except openai.APITimeoutError:
            raise self._read_timeout(mid_reply_after=chunks) from None
        except openai.APIConnectionError as error:
            raise ConnectionLost(
                self.label, self.url,
                f"the connection was lost mid-reply (after {chunks} chunks: {_cause_text(error)}).",
                hint="The server may have crashed or restarted; the text so far is kept. "
                     "Send again once it is back (/status shows it).",
            ) from None
        except openai.APIError as error:
            raise self._translate(error) from None
        except json.JSONDecodeError as error:
            raise GenerationFailed(
                self.label, self.url,
                f"the server sent a stream line that is not JSON after {chunks} chunks ({error.msg}): "
                f"{quote(error.doc)}",
                hint="The text so far is kept. Check that the URL points at an OpenAI-compatible server.",
            ) from None
        except MalformedChunk as problem:
            raise GenerationFailed(
                self.label, self.url, f"the server sent a chunk of an unexpected shape ({problem}).",
                hint="The text so far is kept. Check that the URL points at an OpenAI-compatible server.",
            ) from None
        finally:
            self._warmth.used()
            await response_stream.close()
        if not finished:
            raise GenerationFailed(
                self.label, self.url,
                f"the server closed the stream before the reply finished (after {chunks} chunks, "
                f"no finish_reason).",
                hint="The text so far is kept; send again. If it keeps happening, check the server's log.",
            )

    def start_up(self) -> None:
        """Nothing to do before the first page: the connection and the client's first call are
        paid in `prepare` (warm_up), before any clock."""

    def pending_warm_up(self) -> str | None:
        return None

    async def engine_snapshot(self) -> EngineSnapshot | None:
        """vLLM's /metrics (at the server's root). Another OpenAI-compatible server: its /metrics
        when it has one in vLLM's names, else None (it reports nothing this app reads)."""
        taken_at_s = time.monotonic()
        try:
            text = await self._client.get(f"{self._root_url}/metrics", cast_to=str)
        except openai.NotFoundError:
            return None
        except openai.APIError as error:
            raise self._translate(error) from None
        try:
            snapshot = parse_vllm_metrics(text, taken_at_s)
        except MetricsFormatError:
            if self.is_vllm:
                raise
            return None
        return None if snapshot.is_empty and not self.is_vllm else snapshot

    async def warm_up(self) -> None:
        """Open (or refresh) a pooled connection with a cheap request, outside any measurement; the
        first time in this process, also run the SDK's streaming path once (`rehearse_sdk`)."""
        await rehearse_sdk()
        await self.health()

    # ------------------------------------------------------------ metadata

    async def _models(self) -> list[dict[str, Any]]:
        """The server's `/v1/models` entries (cached once they list at least one)."""
        if self._served_models is None:
            try:
                listing = await self._client.get("/models", cast_to=object)
            except openai.APIError as error:
                raise self._translate(error) from None
            models = list(listing.get("data") or []) if isinstance(listing, Mapping) else []
            if not models:
                raise BackendUnavailable(
                    self.label, self.url, "the server lists no model at /v1/models.",
                    hint="Wait until it has loaded its model, or check the server's log.",
                )
            self._served_models = models
        return self._served_models

    async def model_id(self) -> str:
        """The configured model, else the first one the server lists."""
        if self._configured_model:
            return self._configured_model
        return str((await self._models())[0]["id"])

    async def info(self) -> BackendInfo:
        model = await self.model_id()
        entry = next((m for m in await self._models() if m.get("id") == model), {})
        context_length = entry.get("max_model_len")
        server_version = None
        if self.is_vllm:
            version = await self._optional_json("/version")
            if isinstance(version, Mapping) and version.get("version"):
                server_version = f"vLLM {version['version']}"
        details = {"owned_by": str(entry["owned_by"])} if entry.get("owned_by") else {}
        return BackendInfo(
            model_id=model,
            context_length=int(context_length) if context_length else None,
            server_version=server_version,
            details=details,
        )

    async def health(self) -> None:
        try:
            if self.is_vllm:
                await self._client.get(f"{self._root_url}/health", cast_to=str)
            else:
                await self._client.get("/models", cast_to=object)
        except openai.APIError as error:
            raise self._translate(error) from None
        self._warmth.used()  # the pool now holds a fresh connection

    async def count_prompt_tokens(self, messages: Sequence[ChatMessage]) -> int | None:
        """vLLM's `/tokenize` with the chat template applied; None where the server has no such route."""
        if not self.is_vllm:
            return None
        body = {
            "model": await self.model_id(),
            "messages": [message.as_dict() for message in messages],
            "add_generation_prompt": True,
        }
        try:
            result = await self._client.post(f"{self._root_url}/tokenize", body=body, cast_to=object)
        except openai.NotFoundError:
            return None
        except openai.APIError as error:
            raise self._translate(error) from None
        count = result.get("count") if isinstance(result, Mapping) else None
        return int(count) if count is not None else None

    async def aclose(self) -> None:
        await self._client.close()

    async def _optional_json(self, path: str) -> object | None:
        """GET a root path that not every server has; None when it is missing."""
        try:
            return await self._client.get(f"{self._root_url}{path}", cast_to=object)
        except openai.NotFoundError:
            return None
        except openai.APIError as error:
            raise self._translate(error) from None

    # ------------------------------------------------------------ errors

    def _start_hint(self) -> str:
        command = self.spec.start_command
        start = f"Start it with `{command}`" if command else "Start the server"
        return f"{start}, or check {self._config.env_prefix}BASE_URL in .env."

    def _read_timeout(self, mid_reply_after: int | None = None) -> BackendTimeout:
        variable = f"{self._config.env_prefix}TIMEOUT_S"
        when = "" if mid_reply_after is None else f" mid-reply (after {mid_reply_after} chunks)"
        return BackendTimeout(
            self.label, self.url,
            f"no data from the server for {self._config.timeout_s:g} s{when} ({variable}, the read timeout).",
            limit="read", hint=f"It may be overloaded; raise {variable} in .env to wait longer.",
        )

    def _translate(self, error: openai.APIError) -> BackendError:
        """Map an `openai` exception (before the reply started) to the typed error a person can act on."""
        prefix = self._config.env_prefix
        where = (self.label, self.url)
        if isinstance(error, openai.APITimeoutError):
            if isinstance(error.__cause__, httpx2.ConnectTimeout):
                return BackendTimeout(
                    *where, f"could not connect within {self._config.connect_timeout_s:g} s "
                            f"({prefix}CONNECT_TIMEOUT_S).",
                    limit="connect", hint=f"The server may be down or unreachable from here. {self._start_hint()}",
                )
            return self._read_timeout()
        if isinstance(error, openai.APIConnectionError):
            return BackendUnavailable(
                *where, f"the server is not reachable ({_cause_text(error)}).", hint=self._start_hint(),
            )
        message = error_message(error.body, fallback=error.message)
        status = error.status_code if isinstance(error, openai.APIStatusError) else None
        retry_after_s = (parse_retry_after(error.response.headers.get("retry-after"))
                         if isinstance(error, openai.APIStatusError) else None)
        # None: an error event inside a stream that had already started (`data: {"error": ...}`).
        return error_for_status(status, message, backend=self.label, url=self.url, prefix=prefix,
                                retry_after_s=retry_after_s, error_type=error_type(error.body),
                                model=self._configured_model, path=_request_path(error))


def error_type(body: object) -> str | None:
    """The server's error type in an OpenAI-style error body (`{"error": {"type"}}` or the inner object)."""
    if isinstance(body, Mapping):
        inner = body.get("error")
        if isinstance(inner, Mapping):
            return error_type(inner)
        value = body.get("type")
        return value if isinstance(value, str) else None
    return None


def _request_path(error: openai.APIError) -> str:
    """The route the failed request asked for (e.g. /v1/chat/completions), where the error knows it."""
    request = getattr(error, "request", None)
    return request.url.path if request is not None else ""


def _cause_text(error: openai.APIError) -> str:
    """What the transport said (e.g. 'All connection attempts failed'), else the error's class."""
    cause = error.__cause__
    if cause is None:
        return "connection refused or dropped"
    return str(cause) or type(cause).__name__


_MODEL = Variable("MODEL", "", "Served model name. Empty = the first model listed by /v1/models.")
VLLM_KIND = Kind(
    name="vllm",
    label="vLLM",
    create=OpenAICompatBackend,
    default_url="http://127.0.0.1:8001/v1",  # 8000 is Chainlit's
    variables=(_MODEL,),
    metrics_source=VLLM_SOURCE,
    sampling=("top_k", "min_p", "repetition_penalty", "seed"),
    start_command=VLLM_START_COMMAND,
)
OPENAI_KIND = Kind(
    name="openai",
    label="OpenAI-compatible",
    create=OpenAICompatBackend,
    default_url="http://127.0.0.1:8001/v1",
    variables=(_MODEL,),
    metrics_source=VLLM_SOURCE,  # where the server has a /metrics in vLLM's names
    sampling=("seed",),
)
