"""llama.cpp's own server (`llama-server`): the OpenAI protocol plus what only it says.

It speaks the OpenAI protocol, so this is `OpenAICompatBackend` with four
differences, all measured on llama-server b11312 (scripts/llama_server_launch.py
notes its answers; recordings in tests/recordings/llama-server-b11312-*):

- Sampling: every setting is sent explicitly, so "the same settings" sample the
  same way here as on the other engines. A setting the panel left empty goes as
  its neutral value (top-k 0, min-p 0, repeat penalty 1: filter off), the same
  values the embedded llama.cpp gets (`backends.llamacpp.sampling_arguments`),
  never llama-server's own defaults (top-k 40, min-p 0.05). Its name for the
  repetition penalty is `repeat_penalty` (vLLM's `repetition_penalty` would be
  silently ignored). The seed goes only when set (else the server picks one).
- Counts: with `timings_per_token` every chunk carries the server's cumulative
  `timings.predicted_n`, read as a running count (as vLLM's continuous usage),
  so each chunk's token count is exact, also where one chunk holds several
  tokens (multi-byte text); the closing `choices: []` chunk brings `usage` and
  the request's `timings` (prompt and predicted ms per token) as its figures.
  Its usage counts the end-of-generation token, which no chunk carries: the
  closing chunk holds that difference, so a reply's count equals its usage and
  the change in its `llamacpp:tokens_predicted_total` (vLLM's finish chunk does
  the same with its continuous usage).
- Its own reports: the context size from `/props`
  (`default_generation_settings.n_ctx`), the engine's state from `/metrics`
  (`llamacpp:*`, the server started with `--metrics`) and `/slots`, read with
  prometheus_client like vLLM's and TGI's.
- A down server names how to start one: `bash scripts/llama_server.sh`.

Stop closes the HTTP stream; llama-server then ends the generation within
~50 ms and its slot is idle again. Errors go through the shared status table
(a prompt longer than the context is HTTP 400 `exceed_context_size_error`,
even for a stream: `InputRejected`).
"""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Any, Mapping, Sequence

import openai

from backends.base import BackendInfo, ChatMessage, GenerationParams, StreamChunk
from backends.engine_metrics import (
    EngineFigure,
    EngineSnapshot,
    as_int,
    counter_total,
    gauge_sum,
    metric_families,
)
from backends.errors import ConfigurationError
from backends.kinds import Kind
from backends.llamacpp import sampling_arguments
from backends.openai_compat import OpenAICompatBackend, RequestShape
from config import BackendConfig

START_COMMAND = "bash scripts/llama_server.sh"
METRICS_SOURCE = "llama.cpp server /metrics + /slots"
# The server's own names for what `GenerationParams` calls temperature and max_new_tokens.
WIRE_NAMES = {"temp": "temperature"}


def sampling_fields(params: GenerationParams) -> dict[str, Any]:
    """Every sampling field llama-server receives: the panel's values, neutral where it set none."""
    fields = {WIRE_NAMES.get(name, name): value for name, value in sampling_arguments(params).items()}
    fields["max_tokens"] = params.max_new_tokens
    if params.seed is not None:
        fields["seed"] = params.seed
    if params.ignore_eos:
        fields["ignore_eos"] = True
    return fields


def running_count(data: Mapping[str, Any]) -> Mapping[str, Any]:
    """A content chunk's `timings.predicted_n` (cumulative, `timings_per_token`) as a running usage,
    the shape `parse_chunk` counts exactly; its partial timings are not the request's figures.
    Any other chunk (role, finish, the closing usage with the request's timings) is left as it is."""
    timings = data.get("timings")
    choices = data.get("choices")
    if not choices or not isinstance(timings, Mapping) or not isinstance(timings.get("predicted_n"), int):
        return data
    shaped = {key: value for key, value in data.items() if key != "timings"}
    shaped["usage"] = {"completion_tokens": timings["predicted_n"]}
    return shaped


def with_unsent_tokens(chunk: StreamChunk | None, data: Mapping[str, Any],
                       so_far: int | None) -> tuple[StreamChunk | None, int | None]:
    """The closing usage chunk (`choices: []`) of a stream counted chunk by chunk holds the tokens its
    usage counts beyond the chunks (the end-of-generation token); anything else is left as it is."""
    usage = data.get("usage")
    if chunk is None or data.get("choices") or so_far is None or not isinstance(usage, Mapping):
        return chunk, so_far
    total = usage.get("completion_tokens")
    if not isinstance(total, int) or total <= so_far:
        return chunk, so_far
    return replace(chunk, token_count=total - so_far), total


def engine_snapshot_of(metrics_text: str | None, slots: object, taken_at_s: float) -> EngineSnapshot:
    """An `EngineSnapshot` from llama-server's `/metrics` text and `/slots` list (either None when
    the server was started without it). Raises MetricsFormatError for text that is not Prometheus'.

    Requests processing and deferred are its running and waiting requests. Its token counter
    `tokens_predicted_total` grows only when a request ends, so it is shown as such, with
    `n_decode_total` (llama_decode calls, live) beside it; busy and idle slots come from /slots.
    """
    more: list[EngineFigure] = []
    running = waiting = None
    prompt_tokens = None
    if metrics_text is not None:
        families = metric_families(metrics_text, METRICS_SOURCE)
        running = as_int(gauge_sum(families, "llamacpp:requests_processing"))
        waiting = as_int(gauge_sum(families, "llamacpp:requests_deferred"))
        prompt_tokens = counter_total(families, "llamacpp:prompt_tokens")
        predicted = counter_total(families, "llamacpp:tokens_predicted")
        predicted_s = counter_total(families, "llamacpp:tokens_predicted_seconds")
        decodes = counter_total(families, "llamacpp:n_decode")
        if predicted is not None:
            more.append(EngineFigure("tokens_predicted", "tokens generated (counted as each request ends)",
                                     predicted, "{:.0f}", counter=True))
        if decodes is not None:
            more.append(EngineFigure("decode_calls", "llama_decode calls", decodes, "{:.0f}", counter=True))
        if predicted and predicted_s is not None:
            more.append(EngineFigure("ms_per_token", "generation time per token (since start)",
                                     predicted_s / predicted * 1000, "{:.1f} ms"))
    if isinstance(slots, list):
        busy = sum(1 for slot in slots if isinstance(slot, Mapping) and slot.get("is_processing"))
        more.append(EngineFigure("slots", "slots busy / idle", busy, f"{{:.0f}} busy / {len(slots) - busy} idle"))
    return EngineSnapshot(source=METRICS_SOURCE, taken_at_s=taken_at_s, running_requests=running,
                          waiting_requests=waiting, prompt_tokens_total=prompt_tokens, more=tuple(more))


class LlamaServerBackend(OpenAICompatBackend):
    """A llama.cpp server (`llama-server`), through the OpenAI protocol code of `OpenAICompatBackend`."""

    @classmethod
    def kind_of(cls, config: BackendConfig) -> Kind:
        if config.kind != KIND.name:
            raise ConfigurationError(f"{cls.__name__} serves the kind {KIND.name}, not {config.kind!r}.")
        return KIND

    def shape(self, params: GenerationParams) -> RequestShape:
        sent = sampling_fields(params)
        notes = ["settings left empty are sent as off (top-k 0, min-p 0, repeat penalty 1), "
                 "not llama-server's defaults (top-k 40, min-p 0.05)"]
        if params.seed is None:
            notes.append("no seed set: the server picks a random one")
        if params.greedy:
            notes.append("temperature 0: greedy decoding (top-p, top-k, min-p and seed have no effect)")
        standard = ("temperature", "top_p", "max_tokens", "seed", "frequency_penalty", "presence_penalty")
        extra_body = {name: value for name, value in sent.items() if name not in standard}
        extra_body["timings_per_token"] = True  # exact running counts (see the module docstring)
        return RequestShape(sent=sent, extra_body=extra_body, notes=tuple(notes))

    def parse(self, data: Mapping[str, Any], completion_tokens_so_far: int | None) -> tuple[StreamChunk | None, int | None]:
        chunk, so_far = super().parse(running_count(data), completion_tokens_so_far)
        return with_unsent_tokens(chunk, data, so_far)

    async def health(self) -> None:
        """GET /health: 200 once the model is loaded, 503 ("Loading model") before."""
        await self._root_get("/health", str)
        self._warmth.used()  # the pool now holds a fresh connection

    async def info(self) -> BackendInfo:
        """Model id from /v1/models; context size, build and slots from /props."""
        model = await self.model_id()
        props = await self._root_get("/props", object)
        props = props if isinstance(props, Mapping) else {}
        settings = props.get("default_generation_settings") or {}
        n_ctx = settings.get("n_ctx") if isinstance(settings, Mapping) else None
        build = props.get("build_info")
        details = {"slots": str(props["total_slots"])} if props.get("total_slots") is not None else {}
        return BackendInfo(model_id=model, context_length=int(n_ctx) if n_ctx else None,
                           server_version=f"llama.cpp server {build}" if build else None, details=details)

    async def count_prompt_tokens(self, messages: Sequence[ChatMessage]) -> int | None:
        """The server's own chat template (/apply-template), then its tokenizer (/tokenize)."""
        templated = await self._root_post("/apply-template", {"messages": [m.as_dict() for m in messages]})
        prompt = templated.get("prompt") if isinstance(templated, Mapping) else None
        if not isinstance(prompt, str):
            return None
        tokens = await self._root_post("/tokenize", {"content": prompt, "add_special": True, "parse_special": True})
        listed = tokens.get("tokens") if isinstance(tokens, Mapping) else None
        return len(listed) if isinstance(listed, list) else None

    async def engine_snapshot(self) -> EngineSnapshot | None:
        """/metrics and /slots; None when the server was started with neither (--metrics, --slots)."""
        taken_at_s = time.monotonic()
        metrics = await self._root_get("/metrics", str, optional=True)
        slots = await self._root_get("/slots", object, optional=True)
        if metrics is None and slots is None:
            return None
        return engine_snapshot_of(metrics, slots, taken_at_s)

    async def _root_get(self, path: str, cast_to: type, *, optional: bool = False) -> Any:
        """GET a path at the server's root; with `optional`, None where the server has it off
        (llama-server answers 501 for /metrics without --metrics and /slots with --no-slots)."""
        try:
            return await self._client.get(f"{self._root_url}{path}", cast_to=cast_to)
        except openai.APIStatusError as error:
            if optional and error.status_code in (404, 501):
                return None
            raise self._translate(error) from None
        except openai.APIError as error:
            raise self._translate(error) from None

    async def _root_post(self, path: str, body: Mapping[str, Any]) -> Any:
        try:
            return await self._client.post(f"{self._root_url}{path}", body=body, cast_to=object)
        except openai.APIError as error:
            raise self._translate(error) from None


KIND = Kind(
    name="llamacpp_server",
    label="llama.cpp server",
    create=LlamaServerBackend,
    aliases=("llama_server", "llama-server"),
    default_url="http://127.0.0.1:8081/v1",
    metrics_source=METRICS_SOURCE,
    sampling=("top_k", "min_p", "repetition_penalty", "seed"),
    start_command=START_COMMAND,
)
