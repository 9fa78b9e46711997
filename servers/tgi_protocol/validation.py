"""TGI's request parsing and router validation: parameters in, a ValidRequest (or TGI's error) out.

`GenerateParameters.from_json` reads the native routes' `parameters`,
`chat_parameters` turns a Messages API request into the same parameters, and
`validate` applies TGI's router checks in its order and with its messages,
tokenizing with the engine's tokenizer.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any, Callable

from servers.tgi_protocol.errors import validation_error

DEFAULT_GENERATION_LENGTH = 1024  # TGI's default max_new_tokens cap
MAX_STOP_SEQUENCES = 4
MAX_BEST_OF = 2
MAX_TOP_N_TOKENS = 5
MAX_CLIENT_BATCH_SIZE = 4
NO_ADAPTER_MODEL = "tgi"  # the Messages API's `model` meaning "the base model, no LoRA adapter"


@dataclass
class Limits:
    """The server's limits (TGI's launcher flags of the same names)."""

    max_input_tokens: int
    max_total_tokens: int
    max_concurrent: int


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

    def check_streamable(self) -> None:
        """The two settings TGI refuses on its streaming native routes."""
        if self.best_of not in (None, 1):
            raise validation_error("`best_of` != 1 is not supported when streaming tokens")
        if self.decoder_input_details:
            raise validation_error("`decoder_input_details` == true is not supported when streaming tokens")


def chat_parameters(payload: dict[str, Any]) -> GenerateParameters:
    """A Messages API request's settings as TGI maps them onto GenerateParameters."""
    temperature = payload.get("temperature")
    # The Messages API maps temperature 0 to greedy decoding.
    do_sample, temperature = (False, None) if temperature == 0 else (True, temperature)
    model = payload.get("model")
    return GenerateParameters(
        max_new_tokens=payload.get("max_tokens"), do_sample=do_sample, temperature=temperature,
        top_p=payload.get("top_p"), frequency_penalty=payload.get("frequency_penalty"),
        seed=payload.get("seed"), stop=list(payload.get("stop") or []), details=True,
        adapter_id=model if model and model != NO_ADAPTER_MODEL else None,
    )


def chat_messages(payload: dict[str, Any]) -> list[dict[str, Any]]:
    """The Messages API's `messages`, refused as TGI refuses them when missing or empty."""
    messages = payload.get("messages")
    if not isinstance(messages, list) or not messages:
        raise validation_error("`messages` must be a non-empty list")
    return messages


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


def validate(inputs: str, parameters: GenerateParameters, *, tokenize: Callable[[str], list[int]],
             limits: Limits) -> ValidRequest:
    """TGI's router validation, in its order and with its messages. Raises InferError."""
    try:
        return _validate(inputs, parameters, tokenize, limits)
    except (TypeError, ValueError) as error:
        # TGI's JSON extractor refuses wrongly typed fields before validating.
        raise validation_error(f"Failed to deserialize the JSON body into the target type: {error}") from None


def _open_interval(value: float | None, name: str) -> float:
    """A `top_p`/`typical_p`: 1.0 when unset, else strictly between 0 and 1."""
    if value is None:
        return 1.0
    value = float(value)
    if value <= 0.0 or value >= 1.0:
        raise validation_error(f"`{name}` must be > 0.0 and < 1.0")
    return value


def _validate(inputs: str, parameters: GenerateParameters, tokenize: Callable[[str], list[int]],
              limits: Limits) -> ValidRequest:
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
    top_p = _open_interval(parameters.top_p, "top_p")
    typical_p = _open_interval(parameters.typical_p, "typical_p")
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
    input_ids = tokenize(inputs)
    if parameters.truncate is not None:
        if parameters.truncate == 0 or parameters.truncate > limits.max_input_tokens:
            raise validation_error(
                f"`truncate` must be strictly positive and less than {limits.max_input_tokens}. "
                f"Given: {parameters.truncate}")
        input_ids = input_ids[-parameters.truncate:]
    input_length = len(input_ids)
    if parameters.max_new_tokens is not None:
        max_new_tokens = int(parameters.max_new_tokens)
    else:
        max_new_tokens = min(max(limits.max_total_tokens - input_length, 0), DEFAULT_GENERATION_LENGTH)
    if input_length + max_new_tokens > limits.max_total_tokens:
        raise validation_error(
            f"`inputs` tokens + `max_new_tokens` must be <= {limits.max_total_tokens}. "
            f"Given: {input_length} `inputs` tokens and {max_new_tokens} `max_new_tokens`")
    if input_length > limits.max_input_tokens:
        raise validation_error(
            f"`inputs` must have less than {limits.max_input_tokens} tokens. Given: {input_length}")
    # TGI samples when asked to, or when any warper changes the distribution.
    sampling = (parameters.do_sample or temperature != 1.0 or top_k != 0 or top_p < 1.0 or typical_p < 1.0)
    return ValidRequest(
        inputs=inputs, input_ids=input_ids, max_new_tokens=max_new_tokens, sampling=sampling,
        temperature=temperature, top_p=top_p, top_k=top_k, typical_p=typical_p,
        repetition_penalty=repetition_penalty, frequency_penalty=frequency_penalty, seed=seed,
        stop=list(parameters.stop), details=parameters.details, adapter_id=parameters.adapter_id,
    )
