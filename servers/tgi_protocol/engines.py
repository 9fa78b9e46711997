"""What generates the stand-in's tokens: a real GGUF model through llama.cpp, or a paced engine.

Both run one `Job` at a time on their own worker thread(s) and report each
token through an `emit` callback; the HTTP side (routes.py) never knows which
one it has. `LlamaCppEngine` serves a real model in process; `PacedEngine`
loads nothing and streams ` w1 w2 ...` at an exact rate, for measuring the
measurement.
"""

from __future__ import annotations

import codecs
import itertools
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Protocol

import numpy as np
from llama_cpp import Llama, llama_cpp
from llama_cpp.llama_chat_format import Jinja2ChatFormatter

from servers.tgi_protocol.errors import injected_error, template_error
from servers.tgi_protocol.validation import ValidRequest

# The longest a hold_after_tokens fault pauses a generation nobody releases.
HOLD_LIMIT_S = 120.0


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
    status: str = "queued"  # "queued" | "running" | "completed" | "cancelled" | "failed"
    generated_tokens: int = 0
    max_new_tokens: int = 0
    adapter_id: str | None = None
    # Wall-clock (time.time()) when the first and the last token event were handed to the transport.
    first_token_sent_at_s: float | None = None
    last_token_sent_at_s: float | None = None
    tokens_sent: int = 0
    held: bool = False  # paused by the hold_after_tokens fault right now


@dataclass
class Job:
    """One generation handed to an engine, with the test faults armed for it."""

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


Emit = Callable[[tuple], None]
"""How an engine reports: ("token", TokenOut, finish_reason | None, generated_text | None) per token,
("error", InferError) on a failure, ("cancelled",) when the client went away."""


class Engine(Protocol):
    """What the HTTP side needs of an engine."""

    model_path: Path
    executor: ThreadPoolExecutor

    def tokenize(self, text: str, add_special_tokens: bool) -> list[int]: ...

    def simple_tokens(self, text: str, add_special_tokens: bool) -> list[dict[str, Any]]: ...

    def apply_chat_template(self, messages: list[dict[str, Any]]) -> str: ...

    def run(self, job: Job, emit: Emit) -> None: ...


def message_text(content: Any) -> str:
    """A chat message's content as text (a list of parts gives its text parts)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(chunk.get("text", "") for chunk in content if isinstance(chunk, dict))
    return ""


class LlamaCppEngine:
    """A real GGUF model. Generation runs in one worker thread, one request at a time, in arrival order.

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
            raise template_error("template not found")
        flat = [{"role": m.get("role", "user"), "content": message_text(m.get("content"))} for m in messages]
        try:
            return self.chat_formatter(messages=flat).prompt
        except ValueError as error:  # the template's raise_exception()
            raise template_error(str(error)) from None

    def is_end_of_generation(self, token_id: int) -> bool:
        return bool(llama_cpp.llama_vocab_is_eog(self.llm._model.vocab, token_id))

    def run(self, job: Job, emit: Emit) -> None:
        """Generate in the worker thread, stepping `Llama.generate` one token at a time."""
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
        turns = "".join(f"<|im_start|>{m.get('role', 'user')}\n{message_text(m.get('content'))}<|im_end|>\n"
                        for m in messages)
        return turns + "<|im_start|>assistant\n"

    def run(self, job: Job, emit: Emit) -> None:
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
