"""A stand-in server that speaks TGI's HTTP protocol, serving a real GGUF model.

No TGI can run on these machines, so tests talk to this instead. It serves a
real model (llama-cpp-python, in process, one generation at a time in a
worker thread) and answers in exactly the schemas of TGI's OpenAPI spec:
every response body and every SSE event is checked with
`servers.tgi_protocol.contract` before it is sent. A mismatch is still sent (so the
client sees what a broken server would send) but recorded, and listed at
GET /__contract__/violations, so tests can assert the server kept the contract.

    python -m servers.tgi_protocol --host 127.0.0.1 --port 8080 --model M.gguf \
        [--max-concurrent 128] [--max-input-tokens 1024 --max-total-tokens 2048]

Behaviour copied from TGI's router (3.x):
- `/generate_stream`, `/` with `"stream": true` and streaming
  `/v1/chat/completions` always answer 200; a validation error, "Model is
  overloaded" or a failure during generation arrives as an SSE event
  `{"error", "error_type"}` (TGI decides to stream before it validates).
  The spec lists these error bodies under 422/424/429/500, so that is the
  schema each error event is checked against. Non-streaming routes answer
  with the HTTP status itself.
- Validation, in TGI's order and with its messages: `temperature`,
  `top_p`, `max_new_tokens`, input longer than --max-input-tokens, input plus
  `max_new_tokens` over --max-total-tokens, ...
- More than --max-concurrent requests in flight (queued or generating):
  "Model is overloaded".
- One SSE event per generated token, the last one carrying `details`; the
  end-of-sequence token is an event too (`special: true`), counted in
  `generated_tokens` and left out of `generated_text`. The Messages API sends
  one chunk per token (empty content for a special token), the
  `finish_reason` on the last, then a usage chunk with no choices when
  `stream_options.include_usage` is set, then `data: [DONE]`.
- `model` other than "tgi" on the Messages API, or `parameters.adapter_id`,
  names a LoRA adapter. This server has no adapter weights: like TGI with an
  adapter it did not load, it generates with the base model. The request log
  shows which adapter was asked for.
- Generation stops when the client disconnects.
- GET /metrics answers in Prometheus' text format with TGI's own metric names,
  written the way TGI's exporter writes them (counters without `_total`):
  `tgi_request_count`, `tgi_request_success`, `tgi_request_failure{err=...}`,
  the gauges `tgi_queue_size` (generations waiting for the engine) and
  `tgi_batch_current_size` (generations running: 0 or 1 on the llama.cpp
  engine, as many as are streaming on the paced one), and the histograms
  `tgi_request_mean_time_per_token_duration`, `tgi_request_queue_duration`
  and `tgi_request_generated_tokens`, observed when a request succeeds, with
  TGI's buckets.
- GET /v1/models answers a single `ModelInfo`, as the spec declares (TGI
  itself wraps it in a list; the spec is the contract here).

Test-only routes (not part of TGI):
- GET /__contract__/violations: contract violations so far (DELETE clears).
- GET /__test__/requests: every request (path, JSON body, whether an
  Authorization header came); DELETE clears.
- GET /__test__/generations: each generation's status
  ("queued" | "running" | "completed" | "cancelled" | "failed") and
  generated token count.
- GET /__test__/state: requests in flight.
- POST /__test__/faults: `{"fail_after_tokens": N, "error_type": "generation"}`
  makes the next generation fail after N tokens with an in-stream error;
  `{"http_status": 429}` (or 422, 424, 500) answers the next streaming request
  with that HTTP status and TGI's error body instead of a stream;
  `"retry_after": "7"` beside it adds that `Retry-After` header;
  `{"corrupt_next_event": {"drop": "token"}}` (or `{"set": {"token.id": "5"}}`)
  breaks the next SSE event of a stream, so a test sees the contract check
  record it; `{"unhealthy": true}` makes /health answer 503;
  `{"hold_after_tokens": N}` makes the next generation pause after its N-th
  token (its record says `held`) until `{"release_holds": true}` is posted or
  its client goes away, so a test can find a generation still running (or
  still queued behind it) however fast the machine is; a hold ends by itself
  after HOLD_LIMIT_S, so a forgotten one cannot hang a run.
- Each generation records when its first and last token events were handed
  to the transport (`time.time()`), and each request the client's port (to
  see whether a client kept its connection).

With `--paced-rate R` the server loads no model: it streams ` w1 w2 ...` at
exactly R tokens/s (see PacedEngine), for tests and benchmarks of the
measurement itself.
"""

from __future__ import annotations

import argparse
import asyncio
import codecs
import itertools
import json
import random
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, AsyncIterator, Callable

import numpy as np
import uvicorn
from llama_cpp import Llama, llama_cpp
from llama_cpp.llama_chat_format import Jinja2ChatFormatter
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from servers.tgi_protocol import contract

DEFAULT_GENERATION_LENGTH = 1024  # TGI's default max_new_tokens cap
MAX_STOP_SEQUENCES = 4
MAX_BEST_OF = 2
MAX_TOP_N_TOKENS = 5
MAX_CLIENT_BATCH_SIZE = 4
ROUTER_NAME = "tgi-protocol-test-server"


# ---------------------------------------------------------------- errors


class InferError(Exception):
    """An error TGI reports as `{"error", "error_type"}` with an HTTP status."""

    def __init__(self, message: str, error_type: str, status: int) -> None:
        super().__init__(message)
        self.message = message
        self.error_type = error_type
        self.status = status
        self.headers: dict[str, str] = {}  # e.g. Retry-After, when a test fault asks for one

    def body(self) -> dict[str, str]:
        return {"error": self.message, "error_type": self.error_type}


def validation_error(detail: str) -> InferError:
    return InferError(f"Input validation error: {detail}", "validation", 422)


def overloaded_error() -> InferError:
    return InferError("Model is overloaded", "overloaded", 429)


def injected_error(error_type: str, after_tokens: int) -> InferError:
    if error_type == "incomplete_generation":
        return InferError("Incomplete generation stream", "incomplete_generation", 500)
    return InferError(
        f"Request failed during generation: Server error: injected test failure after {after_tokens} tokens",
        "generation", 424,
    )


# ---------------------------------------------------------------- requests


@dataclass
class GenerateParameters:
    """TGI's GenerateParameters, with its defaults."""

    max_new_tokens: int | None = None
    do_sample: bool = False
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    typical_p: float | None = None
    repetition_penalty: float | None = None
    frequency_penalty: float | None = None
    seed: int | None = None
    stop: list[str] = field(default_factory=list)
    details: bool = False
    decoder_input_details: bool = False
    return_full_text: bool | None = None
    best_of: int | None = None
    top_n_tokens: int | None = None
    truncate: int | None = None
    adapter_id: str | None = None

    @classmethod
    def from_json(cls, raw: Any) -> "GenerateParameters":
        if raw is None:
            return cls()
        if not isinstance(raw, dict):
            raise validation_error("`parameters` must be an object")
        known = {name for name in cls.__dataclass_fields__}
        values = {key: value for key, value in raw.items() if key in known and value is not None}
        if not isinstance(values.get("stop", []), list):
            raise validation_error("`stop` must be a list of strings")
        return cls(**values)


@dataclass
class ValidRequest:
    """A request that passed validation: token ids and resolved sampling settings."""

    inputs: str
    input_ids: list[int]
    max_new_tokens: int
    sampling: bool
    temperature: float
    top_p: float
    top_k: int
    typical_p: float
    repetition_penalty: float
    frequency_penalty: float
    seed: int
    stop: list[str]
    details: bool
    adapter_id: str | None

    @property
    def input_length(self) -> int:
        return len(self.input_ids)


@dataclass
class Limits:
    max_input_tokens: int
    max_total_tokens: int
    max_concurrent: int


# ---------------------------------------------------------------- the model


@dataclass
class TokenOut:
    """One generated token, as TGI's `Token` schema has it."""

    id: int
    text: str
    logprob: float
    special: bool

    def as_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class GenerationRecord:
    """What a test can see about one generation."""

    id: int
    path: str
    status: str = "queued"
    generated_tokens: int = 0
    max_new_tokens: int = 0
    adapter_id: str | None = None
    # Wall-clock (time.time()) when the first and the last token event were handed to the transport.
    first_token_sent_at_s: float | None = None
    last_token_sent_at_s: float | None = None
    tokens_sent: int = 0
    held: bool = False  # paused by the hold_after_tokens fault right now


# The longest a hold_after_tokens fault pauses a generation nobody releases.
HOLD_LIMIT_S = 120.0


@dataclass
class Job:
    request: ValidRequest
    record: GenerationRecord
    cancelled: threading.Event = field(default_factory=threading.Event)
    fail_after_tokens: int | None = None
    fail_error_type: str = "generation"
    # time.monotonic() when it was queued and when a worker took it: TGI's queue and inference times.
    queued_at_s: float = field(default_factory=time.monotonic)
    running_at_s: float | None = None
    hold_after_tokens: int | None = None
    released: threading.Event = field(default_factory=threading.Event)

    def hold_if_due(self, count: int) -> float:
        """The hold_after_tokens fault: after token `count`, wait for a release or the client leaving.
        Returns the seconds held."""
        if count != self.hold_after_tokens:
            return 0.0
        started = time.monotonic()
        self.record.held = True
        try:
            deadline = started + HOLD_LIMIT_S
            while not (self.released.is_set() or self.cancelled.is_set()) and time.monotonic() < deadline:
                self.released.wait(0.02)
        finally:
            self.record.held = False
        return time.monotonic() - started


class Engine:
    """The model. Generation runs in one worker thread, one request at a time, in arrival order.

    A second, vocabulary-only instance tokenizes for validation and
    /tokenize, the way TGI's router tokenizes apart from its model shards.
    """

    def __init__(self, model_path: Path, n_ctx: int, threads: int) -> None:
        self.model_path = model_path
        self.llm = Llama(model_path=str(model_path), n_ctx=n_ctx, n_threads=threads, verbose=False)
        self.vocab = Llama(model_path=str(model_path), vocab_only=True, verbose=False)
        metadata = self.llm.metadata
        self.add_bos = metadata.get("tokenizer.ggml.add_bos_token", "true") == "true"
        eos_id, bos_id = self.llm.token_eos(), self.llm.token_bos()
        template = metadata.get("tokenizer.chat_template")
        self.chat_formatter = None
        if template:
            self.chat_formatter = Jinja2ChatFormatter(
                template=template,
                eos_token=self.llm._model.token_get_text(eos_id) if eos_id != -1 else "",
                bos_token=self.llm._model.token_get_text(bos_id) if bos_id != -1 else "",
                add_generation_prompt=True,
            )
        self.executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="generation")

    def tokenize(self, text: str, add_special_tokens: bool) -> list[int]:
        return self.vocab.tokenize(text.encode("utf-8"), add_bos=add_special_tokens and self.add_bos, special=True)

    def simple_tokens(self, text: str, add_special_tokens: bool) -> list[dict[str, Any]]:
        """TGI's TokenizeResponse: id, text and character offsets of each token."""
        tokens = []
        seen = b""
        for token_id in self.tokenize(text, add_special_tokens):
            start = len(seen.decode("utf-8", errors="ignore"))
            seen += self.vocab.detokenize([token_id], special=True)
            stop = len(seen.decode("utf-8", errors="ignore"))
            tokens.append({"id": token_id, "text": text[start:stop], "start": start, "stop": stop})
        return tokens

    def apply_chat_template(self, messages: list[dict[str, Any]]) -> str:
        if self.chat_formatter is None:
            raise InferError("Template error: template not found", "template_error", 422)
        flat = [{"role": m.get("role", "user"), "content": _message_text(m.get("content"))} for m in messages]
        try:
            return self.chat_formatter(messages=flat).prompt
        except ValueError as error:  # the template's raise_exception()
            raise InferError(f"Template error: {error}", "template_error", 422) from None

    def is_end_of_generation(self, token_id: int) -> bool:
        return bool(llama_cpp.llama_vocab_is_eog(self.llm._model.vocab, token_id))

    def run(self, job: Job, emit: Callable[[tuple], None]) -> None:
        """Generate in the worker thread; report each token through `emit`.

        Emits ("token", TokenOut, finish_reason | None, generated_text | None)
        per token, then nothing; ("error", InferError) on a failure;
        ("cancelled",) when the client went away.
        """
        record = job.record
        if job.cancelled.is_set():
            record.status = "cancelled"
            emit(("cancelled",))
            return
        record.status = "running"
        request = job.request
        llm = self.llm
        llm.set_seed(request.seed)
        sampling = request.sampling
        tokens = llm.generate(
            request.input_ids,
            temp=request.temperature if sampling else 0.0,
            top_p=request.top_p,
            top_k=request.top_k,
            typical_p=request.typical_p,
            min_p=0.0,
            repeat_penalty=request.repetition_penalty,
            frequency_penalty=request.frequency_penalty,
            reset=True,
        )
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        generated_ids: list[int] = []
        text_parts: list[str] = []
        for count in itertools.count(1):
            if job.fail_after_tokens is not None and count > job.fail_after_tokens:
                record.status = "failed"
                emit(("error", injected_error(job.fail_error_type, job.fail_after_tokens)))
                return
            token_id = next(tokens)
            if job.cancelled.is_set():
                record.status = "cancelled"
                emit(("cancelled",))
                return
            logits = np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(llm.ctx, -1), shape=(llm.n_vocab(),))
            peak = float(logits.max())
            logprob = float(logits[token_id] - peak - np.log(np.exp(logits - peak).sum()))
            special = self.is_end_of_generation(token_id)
            if special:
                text = llm.detokenize([token_id], special=True).decode("utf-8", errors="replace")
            else:
                text = decoder.decode(llm.detokenize([token_id], prev_tokens=generated_ids or None))
                text_parts.append(text)
            generated_ids.append(token_id)
            record.generated_tokens = count
            finish_reason = None
            if special:
                finish_reason = "eos_token"
            elif count >= request.max_new_tokens:
                finish_reason = "length"
            elif any("".join(text_parts).endswith(stop) for stop in request.stop if stop):
                finish_reason = "stop_sequence"
            generated_text = None
            if finish_reason is not None:
                text_parts.append(decoder.decode(b"", final=True))
                generated_text = "".join(text_parts)
                record.status = "completed"
            emit(("token", TokenOut(token_id, text, logprob, special), finish_reason, generated_text))
            if finish_reason is not None:
                return
            job.hold_if_due(count)


class PacedEngine:
    """A stand-in model that streams at an exact, known pace, for measuring the measurement.

    Token i of a generation is emitted at start + first_token_s + i / rate
    (an absolute schedule: one late token does not delay the rest), with text
    ` w1 ... wN`. Tokenizing is by whitespace and the chat template is ChatML,
    so no model is loaded and the server starts in a second. Everything else
    (validation, routes, the contract checks) is the same server.
    """

    model_path = Path("paced-test-model")

    def __init__(self, rate_tokens_per_s: float, tokens: int, first_token_s: float) -> None:
        self.rate_tokens_per_s = rate_tokens_per_s
        self.tokens = tokens
        self.first_token_s = first_token_s
        self.executor = ThreadPoolExecutor(max_workers=8, thread_name_prefix="paced")

    def tokenize(self, text: str, add_special_tokens: bool) -> list[int]:
        return [index + 1 for index, _ in enumerate(text.split())]

    def simple_tokens(self, text: str, add_special_tokens: bool) -> list[dict[str, Any]]:
        tokens, position = [], 0
        for index, word in enumerate(text.split()):
            start = text.index(word, position)
            position = start + len(word)
            tokens.append({"id": index + 1, "text": word, "start": start, "stop": position})
        return tokens

    def apply_chat_template(self, messages: list[dict[str, Any]]) -> str:
        turns = "".join(f"<|im_start|>{m.get('role', 'user')}\n{_message_text(m.get('content'))}<|im_end|>\n"
                        for m in messages)
        return turns + "<|im_start|>assistant\n"

    def is_end_of_generation(self, token_id: int) -> bool:
        return False

    def run(self, job: Job, emit: Callable[[tuple], None]) -> None:
        record = job.record
        record.status = "running"
        count = min(self.tokens, job.request.max_new_tokens)
        start = time.monotonic() + self.first_token_s
        parts: list[str] = []
        for index in range(count):
            delay = start + index / self.rate_tokens_per_s - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            if job.cancelled.is_set():
                record.status = "cancelled"
                emit(("cancelled",))
                return
            text = f" w{index + 1}"
            parts.append(text)
            record.generated_tokens = index + 1
            last = index == count - 1
            if last:
                record.status = "completed"
            emit(("token", TokenOut(index + 1, text, 0.0, False), "length" if last else None,
                  "".join(parts) if last else None))
            if not last:
                start += job.hold_if_due(index + 1)  # later tokens move by as long as the hold lasted


# ---------------------------------------------------------------- metrics


def tgi_duration_buckets() -> list[float]:
    """The buckets TGI's router gives every `*_duration` histogram: 35 steps of x1.5 above 0.1 ms."""
    return [0.0001 * 1.5 ** step for step in range(1, 36)]


# TGI's `err` label of tgi_request_failure, where it differs from the error_type it sends.
FAILURE_REASONS = {"incomplete_generation": "incomplete"}


class Histogram:
    """A Prometheus histogram: cumulative bucket counts, sum and count."""

    def __init__(self, name: str, buckets: list[float]) -> None:
        self.name = name
        self.buckets = buckets
        self.bucket_counts = [0] * len(buckets)
        self.sum = 0.0
        self.count = 0

    def observe(self, value: float) -> None:
        for index, upper_bound in enumerate(self.buckets):
            if value <= upper_bound:
                self.bucket_counts[index] += 1
        self.sum += value
        self.count += 1

    def lines(self) -> list[str]:
        lines = [f"# TYPE {self.name} histogram"]
        lines += [f'{self.name}_bucket{{le="{upper_bound}"}} {count}'
                  for upper_bound, count in zip(self.buckets, self.bucket_counts)]
        return lines + [f'{self.name}_bucket{{le="+Inf"}} {self.count}',
                        f"{self.name}_sum {self.sum}", f"{self.name}_count {self.count}"]


class ServerMetrics:
    """The figures GET /metrics reports, kept as TGI's router keeps them (3.x)."""

    def __init__(self, max_total_tokens: int) -> None:
        self.request_count = 0
        self.request_success = 0
        self.request_failure_by_reason: dict[str, int] = {}
        self.mean_time_per_token = Histogram("tgi_request_mean_time_per_token_duration", tgi_duration_buckets())
        self.queue_duration = Histogram("tgi_request_queue_duration", tgi_duration_buckets())
        self.generated_tokens = Histogram(
            "tgi_request_generated_tokens", [max_total_tokens / 100 * step for step in range(1, 101)])

    def failed(self, error: InferError) -> None:
        reason = FAILURE_REASONS.get(error.error_type, error.error_type)
        self.request_failure_by_reason[reason] = self.request_failure_by_reason.get(reason, 0) + 1

    def succeeded(self, job: Job, generated_tokens: int) -> None:
        """At the end of a successful request, as TGI does: time per token is the time since a worker
        took the request (prefill included) divided by the tokens generated."""
        finished_at_s = time.monotonic()
        running_at_s = job.running_at_s if job.running_at_s is not None else job.queued_at_s
        self.request_success += 1
        self.mean_time_per_token.observe((finished_at_s - running_at_s) / generated_tokens)
        self.queue_duration.observe(running_at_s - job.queued_at_s)
        self.generated_tokens.observe(generated_tokens)

    def render(self, queue_size: int, batch_size: int) -> str:
        """Prometheus text, written as TGI's exporter (metrics-exporter-prometheus) writes it."""
        blocks = [
            ["# TYPE tgi_request_count counter", f"tgi_request_count {self.request_count}"],
            ["# TYPE tgi_request_success counter", f"tgi_request_success {self.request_success}"],
            ["# TYPE tgi_queue_size gauge", f"tgi_queue_size {queue_size}"],
            ["# TYPE tgi_batch_current_size gauge", f"tgi_batch_current_size {batch_size}"],
        ]
        if self.request_failure_by_reason:
            blocks.append(["# TYPE tgi_request_failure counter"] + [
                f'tgi_request_failure{{err="{reason}"}} {count}'
                for reason, count in sorted(self.request_failure_by_reason.items())])
        blocks += [self.mean_time_per_token.lines(), self.queue_duration.lines(), self.generated_tokens.lines()]
        return "\n\n".join("\n".join(block) for block in blocks) + "\n"


def corrupted(payload: Any, fault: dict[str, Any]) -> Any:
    """A copy of `payload` broken the way a test fault asks, to show that the contract check
    catches it: `{"drop": "token"}` removes a field, `{"set": {"token.id": "5"}}` replaces one
    (dotted paths; a number steps into a list, e.g. "choices.0.delta.content")."""
    broken = json.loads(json.dumps(payload))

    def parent_of(dotted: str) -> tuple[Any, Any]:
        *steps, last = dotted.split(".")
        target = broken
        for step in steps:
            target = target[int(step)] if isinstance(target, list) else target[step]
        return target, int(last) if isinstance(target, list) else last

    if fault.get("drop"):
        target, key = parent_of(fault["drop"])
        del target[key]
    for dotted, value in (fault.get("set") or {}).items():
        target, key = parent_of(dotted)
        target[key] = value
    return broken


def _message_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(chunk.get("text", "") for chunk in content if isinstance(chunk, dict))
    return ""


# ---------------------------------------------------------------- the server


class SSEResponse(StreamingResponse):
    """An SSE stream that tells its producer when the client goes away.

    Watching `receive()` for http.disconnect notices a client that left even
    while its request waits in the queue (nothing is being sent then), and the
    body iterator is always closed, so generation stops.
    """

    media_type = "text/event-stream"

    def __init__(self, content: AsyncIterator[bytes], on_disconnect: Callable[[], None]) -> None:
        super().__init__(content, headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        self.on_disconnect = on_disconnect

    async def __call__(self, scope, receive, send) -> None:
        async def watch() -> None:
            while True:
                message = await receive()
                if message["type"] == "http.disconnect":
                    self.on_disconnect()
                    return

        watcher = asyncio.create_task(watch())
        try:
            await self.stream_response(send)
        except OSError:
            self.on_disconnect()
        finally:
            watcher.cancel()
            await self.body_iterator.aclose()


class TGIProtocolServer:
    """The HTTP side: routes, validation, the concurrency limit, contract checks."""

    def __init__(self, engine: Engine, limits: Limits, model_id: str) -> None:
        self.engine = engine
        self.limits = limits
        self.model_id = model_id
        self.version = contract.spec_version()
        self.in_flight = 0
        self.violations: list[dict[str, Any]] = []
        self.requests: list[dict[str, Any]] = []
        self.generations: list[GenerationRecord] = []
        self.faults: dict[str, Any] = {}
        self.held_jobs: list[Job] = []  # generations given a hold_after_tokens fault, until released
        self.metrics = ServerMetrics(limits.max_total_tokens)
        self._ids = itertools.count(1)

    # -- contract

    def checked(self, path: str, method: str, status: int, content_type: str | None, payload: Any) -> Any:
        """Check a payload against the spec before it is sent; record a mismatch."""
        problems = contract.violations(path, method, status, content_type, payload)
        if problems:
            self.violations.append({"path": path, "method": method.upper(), "status": status,
                                    "content_type": content_type, "problems": problems, "payload": payload})
        return payload

    def json(self, path: str, method: str, status: int, payload: Any,
             headers: dict[str, str] | None = None) -> JSONResponse:
        return JSONResponse(self.checked(path, method, status, "application/json", payload), status_code=status,
                            headers=headers)

    def sse(self, path: str, status: int, payload: Any) -> bytes:
        fault = self.faults.pop("corrupt_next_event", None) if status == 200 else None
        if fault is not None:
            payload = corrupted(payload, fault)
        self.checked(path, "post", status, "text/event-stream", payload)
        return b"data:" + json.dumps(payload, ensure_ascii=False).encode("utf-8") + b"\n\n"

    def error_event(self, path: str, error: InferError) -> bytes:
        # The spec has no 200 schema for an error event; it lists the body under
        # the error's status, as text/event-stream (generate) or JSON (chat).
        content_type = "text/event-stream" if path == "/generate_stream" else "application/json"
        self.checked(path, "post", error.status, content_type, error.body())
        self.metrics.failed(error)
        return b"data:" + json.dumps(error.body(), ensure_ascii=False).encode("utf-8") + b"\n\n"

    def error_json(self, path: str, error: InferError) -> JSONResponse:
        self.metrics.failed(error)
        return self.json(path, "post", error.status, error.body(), headers=error.headers)

    # -- requests

    async def body(self, request: Request) -> Any:
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
        """TGI's router validation, in its order and with its messages."""
        try:
            return self._validate(inputs, parameters, add_special_tokens)
        except (TypeError, ValueError) as error:
            # TGI's JSON extractor refuses wrongly typed fields before validating.
            raise validation_error(f"Failed to deserialize the JSON body into the target type: {error}") from None

    def _validate(self, inputs: str, parameters: GenerateParameters, add_special_tokens: bool) -> ValidRequest:
        best_of = parameters.best_of or 1
        sampling = (parameters.do_sample or parameters.temperature is not None or parameters.top_k is not None
                    or parameters.top_p is not None or parameters.typical_p is not None)
        if best_of > 1 and not sampling:
            raise validation_error("you must use sampling when `best_of` is > 1")
        temperature = 1.0 if parameters.temperature is None else float(parameters.temperature)
        if temperature <= 0.0:
            raise validation_error("`temperature` must be strictly positive")
        repetition_penalty = 1.0 if parameters.repetition_penalty is None else float(parameters.repetition_penalty)
        if repetition_penalty <= 0.0:
            raise validation_error("`repetition_penalty` must be strictly positive")
        frequency_penalty = 0.0 if parameters.frequency_penalty is None else float(parameters.frequency_penalty)
        if not -2.0 <= frequency_penalty <= 2.0:
            raise validation_error("`frequency_penalty` must be >= -2.0 and <= 2.0")
        top_p = 1.0
        if parameters.top_p is not None:
            top_p = float(parameters.top_p)
            if top_p <= 0.0 or top_p >= 1.0:
                raise validation_error("`top_p` must be > 0.0 and < 1.0")
        typical_p = 1.0
        if parameters.typical_p is not None:
            typical_p = float(parameters.typical_p)
            if typical_p <= 0.0 or typical_p >= 1.0:
                raise validation_error("`typical_p` must be > 0.0 and < 1.0")
        top_k = 0
        if parameters.top_k is not None:
            top_k = int(parameters.top_k)
            if top_k <= 0:
                raise validation_error("`top_k` must be strictly positive")
        if parameters.max_new_tokens == 0:
            raise validation_error("`max_new_tokens` must be strictly positive")
        if len(parameters.stop) > MAX_STOP_SEQUENCES:
            raise validation_error(
                f"`stop` supports up to {MAX_STOP_SEQUENCES} stop sequences. Given: {len(parameters.stop)}")
        seed = parameters.seed if parameters.seed is not None else random.getrandbits(32)
        if parameters.top_n_tokens is not None and parameters.top_n_tokens > MAX_TOP_N_TOKENS:
            raise validation_error(
                f"`top_n_tokens` must be >= 0 and <= {MAX_TOP_N_TOKENS}. Given: {parameters.top_n_tokens}")
        if not inputs:
            raise validation_error("`inputs` cannot be empty")
        input_ids = self.engine.tokenize(inputs, add_special_tokens)
        if parameters.truncate is not None:
            if parameters.truncate == 0 or parameters.truncate > self.limits.max_input_tokens:
                raise validation_error(
                    f"`truncate` must be strictly positive and less than {self.limits.max_input_tokens}. "
                    f"Given: {parameters.truncate}")
            input_ids = input_ids[-parameters.truncate:]
        input_length = len(input_ids)
        if parameters.max_new_tokens is not None:
            max_new_tokens = int(parameters.max_new_tokens)
        else:
            max_new_tokens = min(max(self.limits.max_total_tokens - input_length, 0), DEFAULT_GENERATION_LENGTH)
        if input_length + max_new_tokens > self.limits.max_total_tokens:
            raise validation_error(
                f"`inputs` tokens + `max_new_tokens` must be <= {self.limits.max_total_tokens}. "
                f"Given: {input_length} `inputs` tokens and {max_new_tokens} `max_new_tokens`")
        if input_length > self.limits.max_input_tokens:
            raise validation_error(
                f"`inputs` must have less than {self.limits.max_input_tokens} tokens. Given: {input_length}")
        # TGI samples when asked to, or when any warper changes the distribution.
        sampling = (parameters.do_sample or temperature != 1.0 or top_k != 0 or top_p < 1.0 or typical_p < 1.0)
        return ValidRequest(
            inputs=inputs, input_ids=input_ids, max_new_tokens=max_new_tokens, sampling=sampling,
            temperature=temperature, top_p=top_p, top_k=top_k, typical_p=typical_p,
            repetition_penalty=repetition_penalty, frequency_penalty=frequency_penalty, seed=seed,
            stop=list(parameters.stop), details=parameters.details, adapter_id=parameters.adapter_id,
        )

    def admit(self) -> None:
        """Take a slot, as TGI's router takes a semaphore permit, or refuse with "overloaded"."""
        if self.in_flight >= self.limits.max_concurrent:
            raise overloaded_error()
        self.in_flight += 1

    def release(self) -> None:
        self.in_flight -= 1

    def start(self, path: str, request: ValidRequest) -> tuple[Job, asyncio.Queue]:
        """Queue a generation on the worker thread; its events arrive on the returned queue."""
        record = GenerationRecord(next(self._ids), path, max_new_tokens=request.max_new_tokens,
                                  adapter_id=request.adapter_id)
        self.generations.append(record)
        job = Job(request, record)
        if self.faults.get("fail_after_tokens") is not None:
            job.fail_after_tokens = int(self.faults.pop("fail_after_tokens"))
            job.fail_error_type = self.faults.pop("error_type", "generation")
        if self.faults.get("hold_after_tokens") is not None:
            job.hold_after_tokens = int(self.faults.pop("hold_after_tokens"))
            self.held_jobs.append(job)
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue = asyncio.Queue()

        def emit(item: tuple) -> None:
            if not loop.is_closed():
                loop.call_soon_threadsafe(queue.put_nowait, item)

        def work() -> None:
            job.running_at_s = time.monotonic()
            try:
                self.engine.run(job, emit)
            except (RuntimeError, ValueError, OSError) as error:  # llama.cpp decode failures
                record.status = "failed"
                emit(("error", InferError(f"Request failed during generation: Server error: {error}",
                                          "generation", 424)))

        loop.run_in_executor(self.engine.executor, work)
        return job, queue

    async def tokens(self, queue: asyncio.Queue) -> AsyncIterator[tuple]:
        """The worker's events until the last token, an error or a cancellation."""
        while True:
            item = await queue.get()
            yield item
            if item[0] != "token" or item[2] is not None:
                return

    # -- native routes

    def token_stream(self, path: str, prepare: Callable[[], tuple[ValidRequest, Callable[..., list[bytes]]]],
                     closing: bytes | None = None) -> SSEResponse:
        """One generation as SSE, shared by the native and the chat streaming routes.

        `prepare()` validates the request (raising InferError) and returns the
        ValidRequest and `render(token, finish_reason, generated_text, count)`,
        the events for one token. As in TGI, every error is an in-stream event;
        `closing` (the chat route's `[DONE]`) ends every stream not cancelled.
        """
        job_holder: list[Job] = []

        def on_disconnect() -> None:
            if job_holder:
                job_holder[0].cancelled.set()

        async def events() -> AsyncIterator[bytes]:
            try:
                self.admit()
            except InferError as error:
                yield self.error_event(path, error)
                if closing:
                    yield closing
                return
            try:
                try:
                    valid, render = prepare()
                except InferError as error:
                    yield self.error_event(path, error)
                    if closing:
                        yield closing
                    return
                job, queue = self.start(path, valid)
                job_holder.append(job)
                count = 0
                async for item in self.tokens(queue):
                    if item[0] == "error":
                        yield self.error_event(path, item[1])
                        break
                    if item[0] == "cancelled":
                        return
                    _, token, finish_reason, generated_text = item
                    count += 1
                    rendered = render(token, finish_reason, generated_text, count)
                    if finish_reason is not None:
                        self.metrics.succeeded(job, count)
                    record = job.record
                    sent_at = time.time()
                    if record.first_token_sent_at_s is None:
                        record.first_token_sent_at_s = sent_at
                    record.last_token_sent_at_s = sent_at
                    record.tokens_sent = count
                    for event in rendered:
                        yield event
                if closing:
                    yield closing
            finally:
                if job_holder:
                    job_holder[0].cancelled.set()
                self.release()

        return SSEResponse(events(), on_disconnect)

    # -- native routes

    def stream_response(self, path: str, payload: dict[str, Any], add_special_tokens: bool = True) -> SSEResponse:
        """/generate_stream (and / with stream): StreamResponse events, errors in-stream."""

        def prepare() -> tuple[ValidRequest, Callable[..., list[bytes]]]:
            parameters = GenerateParameters.from_json(payload.get("parameters"))
            if parameters.best_of not in (None, 1):
                raise validation_error("`best_of` != 1 is not supported when streaming tokens")
            if parameters.decoder_input_details:
                raise validation_error("`decoder_input_details` == true is not supported when streaming tokens")
            valid = self.validate(str(payload.get("inputs", "")), parameters, add_special_tokens)

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
                return [self.sse(path, 200, event)]

            return valid, render

        return self.token_stream(path, prepare)

    async def generate_once(self, path: str, valid: ValidRequest, return_full_text: bool) -> dict[str, Any]:
        """Run a whole generation; the GenerateResponse body. Raises InferError."""
        job, queue = self.start(path, valid)
        tokens: list[dict[str, Any]] = []
        try:
            async for item in self.tokens(queue):
                if item[0] == "error":
                    raise item[1]
                if item[0] == "cancelled":
                    raise InferError("Incomplete generation", "incomplete_generation", 500)
                _, token, finish_reason, generated_text = item
                tokens.append(token.as_json())
                if finish_reason is None:
                    continue
                self.metrics.succeeded(job, len(tokens))
                text = (valid.inputs + generated_text) if return_full_text else generated_text
                details = None
                if valid.details:
                    details = {"finish_reason": finish_reason, "generated_tokens": len(tokens),
                               "seed": valid.seed if valid.sampling else None, "prefill": [],
                               "tokens": tokens, "top_tokens": [], "best_of_sequences": None}
                return {"generated_text": text, "details": details}
        finally:
            job.cancelled.set()
        raise InferError("Incomplete generation", "incomplete_generation", 500)

    async def generate_json(self, path: str, payload: dict[str, Any]) -> dict[str, Any]:
        self.admit()
        try:
            parameters = GenerateParameters.from_json(payload.get("parameters"))
            valid = self.validate(str(payload.get("inputs", "")), parameters, True)
            return await self.generate_once(path, valid, bool(parameters.return_full_text))
        finally:
            self.release()

    async def route_generate(self, request: Request) -> Response:
        path = "/generate"
        try:
            payload = await self.body(request)
            return self.json(path, "post", 200, await self.generate_json(path, payload))
        except InferError as error:
            return self.error_json(path, error)

    def injected_status_error(self) -> InferError | None:
        """The armed `http_status` fault: the next streaming request is answered with that HTTP
        status and TGI's error body, as an older TGI or a proxy in front of it would; with
        `retry_after` armed too, the answer carries that `Retry-After` header."""
        status = self.faults.pop("http_status", None)
        if status is None:
            return None
        error = {422: validation_error("injected test rejection"), 429: overloaded_error(),
                 424: injected_error("generation", 0),
                 500: injected_error("incomplete_generation", 0)}[int(status)]
        retry_after = self.faults.pop("retry_after", None)
        if retry_after is not None:
            error.headers["Retry-After"] = str(retry_after)
        return error

    async def route_generate_stream(self, request: Request) -> Response:
        path = "/generate_stream"
        try:
            payload = await self.body(request)
            injected = self.injected_status_error()
            if injected is not None:
                raise injected
        except InferError as error:
            return Response(self.error_event(path, error), status_code=error.status, media_type="text/event-stream",
                            headers=error.headers)
        return self.stream_response(path, payload)

    async def route_compat(self, request: Request) -> Response:
        path = "/"
        try:
            payload = await self.body(request)
            if payload.get("stream"):
                return self.stream_response(path, payload)
            return self.json(path, "post", 200, [await self.generate_json(path, payload)])
        except InferError as error:
            return self.error_json(path, error)

    # -- Messages API

    def chat_request(self, payload: dict[str, Any]) -> tuple[str, GenerateParameters]:
        """TGI's ChatRequest -> (templated prompt, GenerateParameters)."""
        messages = payload.get("messages")
        if not isinstance(messages, list) or not messages:
            raise validation_error("`messages` must be a non-empty list")
        prompt = self.engine.apply_chat_template(messages)
        temperature = payload.get("temperature")
        # The Messages API maps temperature 0 to greedy decoding.
        do_sample, temperature = (False, None) if temperature == 0 else (True, temperature)
        model = payload.get("model")
        parameters = GenerateParameters(
            max_new_tokens=payload.get("max_tokens"), do_sample=do_sample, temperature=temperature,
            top_p=payload.get("top_p"), frequency_penalty=payload.get("frequency_penalty"),
            seed=payload.get("seed"), stop=list(payload.get("stop") or []), details=True,
            adapter_id=model if model and model != "tgi" else None,
        )
        return prompt, parameters

    def chat_chunk(self, choices: list[dict[str, Any]], usage: dict[str, int] | None) -> dict[str, Any]:
        return {"id": "", "created": int(time.time()), "model": self.model_id,
                "system_fingerprint": f"{self.version}-native", "choices": choices, "usage": usage}

    async def route_chat_completions(self, request: Request) -> Response:
        path = "/v1/chat/completions"
        try:
            payload = await self.body(request)
            prompt, parameters = self.chat_request(payload)
        except InferError as error:
            return self.error_json(path, error)
        if payload.get("stream"):
            injected = self.injected_status_error()
            if injected is not None:
                return self.error_json(path, injected)
            return self.chat_stream(path, payload, prompt, parameters)
        try:
            self.admit()
            try:
                valid = self.validate(prompt, parameters, False)
                result = await self.generate_once(path, valid, False)
            finally:
                self.release()
        except InferError as error:
            return self.error_json(path, error)
        details = result["details"]
        finish = "stop" if details["finish_reason"] == "eos_token" else details["finish_reason"]
        usage = {"prompt_tokens": valid.input_length, "completion_tokens": details["generated_tokens"],
                 "total_tokens": valid.input_length + details["generated_tokens"]}
        body = self.chat_chunk([{"index": 0, "message": {"role": "assistant", "content": result["generated_text"]},
                                 "logprobs": None, "finish_reason": finish}], usage)
        return self.json(path, "post", 200, body)

    def chat_stream(self, path: str, payload: dict[str, Any], prompt: str,
                    parameters: GenerateParameters) -> SSEResponse:
        include_usage = bool((payload.get("stream_options") or {}).get("include_usage"))

        def prepare() -> tuple[ValidRequest, Callable[..., list[bytes]]]:
            valid = self.validate(prompt, parameters, False)

            def render(token, finish_reason, _generated_text, generated) -> list[bytes]:
                finish = None
                if finish_reason is not None:
                    finish = "stop" if finish_reason == "eos_token" else finish_reason
                delta = {"role": "assistant", "content": "" if token.special else token.text}
                choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
                events = [self.sse(path, 200, self.chat_chunk([choice], None))]
                if finish_reason is not None and include_usage:
                    usage = {"prompt_tokens": valid.input_length, "completion_tokens": generated,
                             "total_tokens": valid.input_length + generated}
                    events.append(self.sse(path, 200, self.chat_chunk([], usage)))
                return events

            return valid, render

        return self.token_stream(path, prepare, closing=b"data: [DONE]\n\n")

    # -- tokenizer and info routes

    async def route_chat_tokenize(self, request: Request) -> Response:
        path = "/chat_tokenize"
        try:
            payload = await self.body(request)
            prompt, _ = self.chat_request(payload)
        except InferError as error:
            # The spec declares only 404 (with an ErrorResponse) for a failure here.
            return self.json(path, "post", 404, error.body())
        body = {"tokenize_response": self.engine.simple_tokens(prompt, False), "templated_text": prompt}
        return self.json(path, "post", 200, body)

    async def route_tokenize(self, request: Request) -> Response:
        path = "/tokenize"
        try:
            payload = await self.body(request)
        except InferError as error:
            return self.json(path, "post", 404, error.body())
        return self.json(path, "post", 200, self.engine.simple_tokens(str(payload.get("inputs", "")), True))

    async def route_info(self, request: Request) -> Response:
        body = {
            "model_id": self.model_id,
            "model_sha": None,
            "model_pipeline_tag": "text-generation",
            "max_concurrent_requests": self.limits.max_concurrent,
            "max_best_of": MAX_BEST_OF,
            "max_stop_sequences": MAX_STOP_SEQUENCES,
            "max_input_tokens": self.limits.max_input_tokens,
            "max_total_tokens": self.limits.max_total_tokens,
            "validation_workers": 1,
            "max_client_batch_size": MAX_CLIENT_BATCH_SIZE,
            "router": ROUTER_NAME,
            "version": self.version,
            "sha": None,
            "docker_label": None,
        }
        return self.json("/info", "get", 200, body)

    async def route_health(self, request: Request) -> Response:
        if self.faults.get("unhealthy"):
            return self.json("/health", "get", 503, {"error": "unhealthy", "error_type": "healthcheck"})
        self.checked("/health", "get", 200, None, None)
        return Response(status_code=200)

    async def route_models(self, request: Request) -> Response:
        body = {"id": self.model_id, "object": "model", "created": 0, "owned_by": self.model_id}
        return self.json("/v1/models", "get", 200, body)

    def generation_counts(self) -> tuple[int, int]:
        """(waiting for the engine, generating now): TGI's queue size and current batch size."""
        statuses = [record.status for record in self.generations]
        return statuses.count("queued"), statuses.count("running")

    async def route_metrics(self, request: Request) -> Response:
        text = self.metrics.render(*self.generation_counts())
        self.checked("/metrics", "get", 200, "text/plain", text)
        return Response(text, media_type="text/plain")

    # -- test-only routes

    async def test_violations(self, request: Request) -> Response:
        if request.method == "DELETE":
            self.violations.clear()
        return JSONResponse(self.violations)

    async def test_requests(self, request: Request) -> Response:
        if request.method == "DELETE":
            self.requests.clear()
        return JSONResponse(self.requests)

    async def test_generations(self, request: Request) -> Response:
        return JSONResponse([asdict(record) for record in self.generations])

    async def test_state(self, request: Request) -> Response:
        return JSONResponse({"in_flight": self.in_flight})

    async def test_faults(self, request: Request) -> Response:
        payload = await request.json()
        if not isinstance(payload, dict):
            return JSONResponse({"error": "send a JSON object"}, status_code=400)
        if payload.pop("release_holds", False):
            for job in self.held_jobs:
                job.released.set()
            self.held_jobs.clear()
        self.faults.update(payload)
        return JSONResponse(self.faults)

    def app(self) -> Starlette:
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
            Route("/__contract__/violations", self.test_violations, methods=["GET", "DELETE"]),
            Route("/__test__/requests", self.test_requests, methods=["GET", "DELETE"]),
            Route("/__test__/generations", self.test_generations, methods=["GET"]),
            Route("/__test__/state", self.test_state, methods=["GET"]),
            Route("/__test__/faults", self.test_faults, methods=["POST"]),
        ])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--model", type=Path, help="a GGUF file (not needed with --paced-rate)")
    parser.add_argument("--paced-rate", type=float, default=0.0,
                        help="serve no model: stream ` w1 w2 ...` at this many tokens/s (measurement tests)")
    parser.add_argument("--paced-tokens", type=int, default=100, help="tokens per paced reply")
    parser.add_argument("--paced-first-token-s", type=float, default=0.0, help="delay before the first paced token")
    parser.add_argument("--model-id", default="", help="the model id /info reports (default: the file name)")
    parser.add_argument("--max-concurrent", type=int, default=128, help="TGI's --max-concurrent-requests")
    parser.add_argument("--max-input-tokens", type=int, default=1024)
    parser.add_argument("--max-total-tokens", type=int, default=2048)
    parser.add_argument("--threads", type=int, default=1, help="llama.cpp threads")
    args = parser.parse_args(argv)
    if args.max_input_tokens >= args.max_total_tokens:
        parser.error("--max-input-tokens must be lower than --max-total-tokens (as in TGI)")
    if args.paced_rate > 0:
        engine = PacedEngine(args.paced_rate, args.paced_tokens, args.paced_first_token_s)
    elif args.model is None:
        parser.error("give --model (a GGUF file) or --paced-rate")
    else:
        engine = Engine(args.model, n_ctx=args.max_total_tokens, threads=args.threads)
    limits = Limits(args.max_input_tokens, args.max_total_tokens, args.max_concurrent)
    server = TGIProtocolServer(engine, limits, args.model_id or engine.model_path.name)
    uvicorn.run(server.app(), host=args.host, port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
