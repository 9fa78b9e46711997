"""The one interface every serving backend implements.

A request has two steps, so that nothing engine-specific sits inside a
measured time:

1. `prepare(messages, params)` does every lookup, templating and shaping
   (the served model id, TGI's /chat_tokenize, loading the embedded model)
   and returns a `PreparedRequest` that says exactly which sampling settings
   go on the wire and which this engine cannot honour. Not measured.
2. `stream(request)` sends it and yields `StreamChunk`s. The `timing` module
   starts its clock on the first iteration, i.e. just before the request
   leaves, so the chat UI and the benchmark get the same figures.

Backends know nothing about Chainlit or timing.
"""

from __future__ import annotations

from contextvars import ContextVar
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any, AsyncIterator, Literal, Mapping, Protocol, Sequence, runtime_checkable

if TYPE_CHECKING:
    from backends.engine_metrics import EngineSnapshot
    from config import BackendConfig

Role = Literal["system", "user", "assistant"]


@dataclass(frozen=True)
class ChatMessage:
    """One turn of a conversation."""

    role: Role
    content: str

    def as_dict(self) -> dict[str, str]:
        return {"role": self.role, "content": self.content}


@dataclass(frozen=True)
class GenerationParams:
    """Sampling settings for one request, as the settings panel chose them.

    The optional settings are None when the panel left them empty: then they
    are not sent, and the engine's own default applies (which `docs/engineers/figures.md`
    lists per engine). The embedded llama.cpp is the exception: the app calls
    it directly, so "not sent" means the neutral value (filter off), never
    the library's own defaults.
    """

    temperature: float = 0.7
    top_p: float = 0.95
    max_new_tokens: int = 256
    top_k: int | None = None
    min_p: float | None = None
    repetition_penalty: float | None = None
    seed: int | None = None
    # Benchmarks only (a trace replay): keep generating past the end-of-sequence token, so a reply is
    # exactly max_new_tokens long (vLLM's and llama.cpp's `ignore_eos`); never set by the chat.
    ignore_eos: bool = False

    @property
    def greedy(self) -> bool:
        """Temperature 0 means greedy decoding on every engine."""
        return self.temperature <= 0.0

    def chosen(self) -> dict[str, float | int]:
        """The settings the panel set (optional ones only when given), by their names here."""
        return {f.name: getattr(self, f.name) for f in fields(self)
                if getattr(self, f.name) is not None and f.name != "ignore_eos"}


# Names a person reads, for notes such as "top-k not supported by this engine: ignored".
# Whose request a backend serves (a login, a browser, a session: core.disclosure.person_key), where
# the engine queues in this process: the embedded engine serves people in turn, not first come.
# Set by the chat for its reply's task (tasks it starts inherit it); None: nobody in particular.
on_behalf_of: ContextVar[str | None] = ContextVar("serving_lab_on_behalf_of", default=None)

SETTING_LABELS = {
    "temperature": "temperature",
    "top_p": "top-p",
    "max_new_tokens": "max new tokens",
    "top_k": "top-k",
    "min_p": "min-p",
    "repetition_penalty": "repetition penalty",
    "seed": "seed",
}
OPTIONAL_SETTINGS = ("top_k", "min_p", "repetition_penalty", "seed")


@dataclass(frozen=True)
class IgnoredSetting:
    """A setting the panel chose that this engine cannot honour, and why."""

    setting: str  # a GenerationParams field name
    reason: str

    def describe(self) -> str:
        return f"{SETTING_LABELS.get(self.setting, self.setting)} {self.reason}: ignored"


@dataclass(frozen=True)
class PreparedRequest:
    """A request ready to send: looked up, templated and shaped before any clock starts.

    `sent` holds the sampling settings exactly as they go on the wire, under
    the engine's own names (e.g. TGI's `do_sample`, llama.cpp's `temp`), so
    a reply's details can show what each engine really received. `notes`
    explain translations a person might not expect ("temperature 0: greedy,
    sent as do_sample=false"). `body` is the backend's own request.
    """

    messages: tuple[ChatMessage, ...]
    params: GenerationParams
    model: str
    sent: Mapping[str, Any]
    ignored: tuple[IgnoredSetting, ...] = ()
    notes: tuple[str, ...] = ()
    prepare_s: float = 0.0
    body: Any = field(default=None, repr=False, compare=False)


def ignore_unsupported(params: GenerationParams, supported: Sequence[str], reason: str) -> tuple[IgnoredSetting, ...]:
    """The optional settings the panel chose that are not in `supported`."""
    return tuple(
        IgnoredSetting(name, reason)
        for name in OPTIONAL_SETTINGS
        if getattr(params, name) is not None and name not in supported
    )


@dataclass(frozen=True)
class ServerFigures:
    """What the server itself reported about a request, named by its source.

    Every figure is None when the server did not report it ("not reported"
    in the UI). Times are in seconds.

    What a reply's prompt cost: `input_tokens` (the whole prompt, as the engine
    counted it), `cached_prompt_tokens` (the part it took from its cache and did
    not compute again: vLLM's `prompt_tokens_details.cached_tokens`, llama-server's
    `timings.cache_n`, the embedded model's kept prefix) and `prompt_tokens_per_s`
    (prefill speed over the tokens it did compute).
    """

    source: str
    output_tokens: int | None = None
    input_tokens: int | None = None
    cached_prompt_tokens: int | None = None
    finish_reason: str | None = None
    queue_s: float | None = None
    first_token_s: float | None = None  # the server's own TTFT (from scheduling or arrival; see source)
    prompt_s: float | None = None  # prompt processing (prefill)
    decode_s: float | None = None  # first to last output token
    inference_s: float | None = None  # prefill + decode
    time_per_output_token_s: float | None = None
    decode_tokens_per_s: float | None = None
    output_tokens_per_s: float | None = None  # all output tokens over the server's whole inference time
    prompt_tokens_per_s: float | None = None

    def merged(self, later: "ServerFigures") -> "ServerFigures":
        """This report updated with every figure `later` gives (a stream may report in pieces)."""
        values = {f.name: getattr(self, f.name) for f in fields(self)}
        for f in fields(later):
            value = getattr(later, f.name)
            if value is not None:
                values[f.name] = value
        if later.source != self.source and later.source not in self.source:
            values["source"] = f"{self.source} + {later.source}"
        return ServerFigures(**values)

    @property
    def computed_prompt_tokens(self) -> int | None:
        """Prompt tokens the engine computed (prefill) rather than took from its cache."""
        if self.input_tokens is None or self.cached_prompt_tokens is None:
            return None
        return max(self.input_tokens - self.cached_prompt_tokens, 0)


@dataclass(frozen=True)
class StreamChunk:
    """A piece of a streamed reply.

    `token_count` is the exact number of generated tokens this chunk carries,
    or None when the protocol does not say (the measurement then marks its
    count as estimated until the server's own count arrives). A chunk with no
    text and no tokens is still a server event: the first one is the
    reply's "first byte" in its timeline. `queue_position` is a local status
    (the embedded model's queue), not a server event. The two times say when
    and where the chunk was seen first (see below).
    """

    text: str = ""
    token_count: int | None = None
    finish_reason: str | None = None
    server_figures: ServerFigures | None = None
    queue_position: int | None = None
    # Where the chunk arrived, stamped there (`time.perf_counter`): the backend loop's thread for a
    # remote backend (backends/offloop.py), the model's thread for the embedded one. core.timing
    # measures by it, so a busy app loop cannot add its delay. None: stamped when the meter sees it.
    arrived_at_s: float | None = None
    # On a stream's first chunk: when its request left, stamped where it left (same clock).
    request_sent_at_s: float | None = None


@dataclass(frozen=True)
class BackendInfo:
    """What a backend says about itself, for the UI and the benchmark table."""

    model_id: str
    context_length: int | None = None
    server_version: str | None = None
    max_input_tokens: int | None = None
    details: dict[str, str] = field(default_factory=dict)
    # Set when the server only stands in for the engine it speaks for (e.g. the TGI-protocol
    # test server): every table and figure that shows its numbers says so.
    stand_in: str | None = None


def display_label(label: str, stand_in: str | None) -> str:
    """A backend's name wherever its numbers are shown: a stand-in says so ("TGI (stand-in)").

    The one place that decides the wording, so the CSV, the charts, the panel and the
    simulation results all say the same thing.
    """
    return f"{label} (stand-in)" if stand_in else label


@dataclass(frozen=True)
class StreamLimits:
    """How long a reply may take to start and how long it may pause once text flows.

    Enforced by one watchdog (backends/watchdog.py) around every backend's
    stream, in the chat and in the load engine alike. `prefix` is the
    backend's variable prefix (e.g. "VLLM_"), so a message can name the
    variable that sets each limit.
    """

    first_token_s: float
    stall_s: float
    prefix: str = ""

    @property
    def first_token_variable(self) -> str:
        return f"{self.prefix}FIRST_TOKEN_TIMEOUT_S"

    @property
    def stall_variable(self) -> str:
        return f"{self.prefix}STALL_TIMEOUT_S"

    @classmethod
    def of(cls, config: "BackendConfig") -> "StreamLimits":
        """The limits a configured backend runs with."""
        return cls(config.first_token_timeout_s, config.stall_timeout_s, config.env_prefix)


@runtime_checkable
class Backend(Protocol):
    """A serving stack the app can talk to.

    Implementations raise only `backends.errors.BackendError` subclasses for
    problems a person can fix (server down, input too long, overloaded).
    """

    name: str
    kind: str  # its kind's name (backends/kinds.py); callers ask the attributes below, never compare it
    label: str
    url: str
    stream_limits: StreamLimits  # first-token and stall limits, enforced around `stream()`
    # The engine runs inside the app's process: it shares this machine, and its memory is the app's.
    in_process: bool

    async def prepare(self, messages: Sequence[ChatMessage], params: GenerationParams) -> PreparedRequest:
        """Everything before sending: lookups, templating, the request body. Not measured."""
        ...

    def stream(self, request: PreparedRequest) -> AsyncIterator[StreamChunk]:
        """Send the prepared request and stream the reply. The request leaves on the
        first iteration; closing the iterator (`aclose()`) ends it on the server."""
        ...

    async def health(self) -> None:
        """Return when the backend can serve; raise BackendUnavailable with the reason otherwise."""
        ...

    async def info(self) -> BackendInfo:
        """Model id, context length and server version, as far as the server says."""
        ...

    async def count_prompt_tokens(self, messages: Sequence[ChatMessage]) -> int | None:
        """Tokens the prompt will take once templated, or None if the backend cannot tell."""
        ...

    def pending_warm_up(self) -> str | None:
        """What a first use would still have to load (e.g. a model file), or None when ready."""
        ...

    async def engine_snapshot(self) -> "EngineSnapshot | None":
        """The engine's own state now (its /metrics, or the embedded model's queue), or None
        when this engine reports none. Raises BackendUnavailable when it cannot be reached."""
        ...

    async def warm_up(self) -> None:
        """Load what `pending_warm_up` names, so that no reply pays for it."""
        ...

    def start_up(self) -> None:
        """At the app's start-up, before it serves a page: pay what a first use would (an engine's
        import; start loading a model in the background) so no reply and no event loop waits on it."""
        ...

    async def aclose(self) -> None:
        """Release connections (and nothing shared with other sessions)."""
        ...
