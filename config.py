"""Configuration from the environment (`.env` via python-dotenv).

Two things live here:
- `ChatDefaults`: the per-session generation settings, their defaults and
  bounds. The settings widgets are built from it.
- `BackendConfig`: one entry per configured backend. `BACKENDS` lists the
  names; each name N reads variables prefixed `N_` (upper-cased, with
  non-alphanumerics turned into `_`). Which variables, their defaults and
  parsers are declared by each backend kind (backends/kinds.py parses them;
  backends/registry.py lists the kinds). See `.env.example` for every variable.

Nothing here names a backend kind.

Backend URLs and keys come only from here, never from the chat UI.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping

from vocabulary import MAX_COLUMNS, MIN_COLUMNS, MODES, REVEALS, RUN_ORDERS


REPO = Path(__file__).resolve().parent  # the repository root: the app, prompts/, .data/, .env


class ConfigurationError(ValueError):
    """A configuration value (from .env) that cannot work, with the variable to fix."""


# Backend names, not kinds: each name implies its kind through the kinds' aliases (backends/kinds.py).
DEFAULT_BACKENDS = "llama_cpp,vllm,tgi"
GLOBAL_VARIABLES = ("BACKENDS", "DEFAULT_BACKEND", "DEFAULT_TEMPERATURE", "DEFAULT_TOP_P",
                    "DEFAULT_MAX_NEW_TOKENS", "DEFAULT_TOP_K", "DEFAULT_MIN_P", "DEFAULT_REPETITION_PENALTY",
                    "DEFAULT_SEED", "DEFAULT_SYSTEM_PROMPT", "DEFAULT_MODE", "DEFAULT_COMPARE_BACKENDS",
                    "DEFAULT_RUN_ORDER", "DEFAULT_REVEAL", "DATABASE_URL", "AUTH_USERS", "TEACHERS", "VOTES_PER_DAY",
                    "LAB_MAX_CHATS_PER_PERSON", "LAB_MAX_REPLIES_PER_PERSON",
                    "CHAINLIT_AUTH_SECRET", "LOGIN_FREE_FAILURES", "LOGIN_MAX_DELAY_S", "LOGIN_ADDRESS_FREE_FAILURES",
                    "LOGIN_ADDRESS_MAX_DELAY_S", "LAB_REPLICA_ID", "LAB_IMAGE_ORIGINS", "LAB_MAX_BODY_MB", "BLIND_OPEN_S", "CAPACITY_SLO", "CAPACITY_PERCENTILE",
                    "LAB_TEST_EMBEDDED_HOLD_FILE", "LAB_TEST_EMBEDDED_HOLD_AFTER_TOKENS", "LAB_TEST_EMBEDDED_REQUEST_LOG", "DATABASE_CONNECT_TIMEOUT_S",
                    "DATABASE_STATEMENT_TIMEOUT_S", "LAB_OUTBOX_DIR", "LAB_OUTBOX_MAX_ROWS", "LAB_OUTBOX_MAX_BYTES",
                    "CACHE_LESSON_BACKENDS")
# Tests only, off when unset: while the file it names exists, the embedded model holds each
# generation before its first token (backends/llamacpp.py), so a browser test can build a
# queue behind it on any machine instead of racing the model's speed.
TEST_HOLD_FILE_VARIABLE = "LAB_TEST_EMBEDDED_HOLD_FILE"
# With it, the hold comes after this many tokens of each generation instead of before the first.
TEST_HOLD_AFTER_TOKENS_VARIABLE = "LAB_TEST_EMBEDDED_HOLD_AFTER_TOKENS"
# Tests only, off when unset: the embedded model appends what each generation was asked (messages,
# sampling, max tokens, seed) as one JSON line to this file, its request log (a server has its own).
TEST_REQUEST_LOG_VARIABLE = "LAB_TEST_EMBEDDED_REQUEST_LOG"


def load_env(path: str | os.PathLike | None = None) -> None:
    """Load `.env` next to the app (never overriding variables already set)."""
    from dotenv import load_dotenv

    load_dotenv(path or REPO / ".env", override=False)


@dataclass(frozen=True)
class Bound:
    """Default and bounds of one numeric setting."""

    default: float
    minimum: float
    maximum: float
    step: float


@dataclass(frozen=True)
class OptionalBound:
    """An optional numeric setting: empty (None) means "not sent"; otherwise within bounds."""

    default: float | None
    minimum: float
    maximum: float
    integer: bool = False


@dataclass(frozen=True)
class ChatDefaults:
    """Per-session generation settings: defaults and bounds for the settings panel."""

    backend: str
    temperature: Bound = Bound(0.7, 0.0, 2.0, 0.05)
    top_p: Bound = Bound(0.95, 0.05, 1.0, 0.05)
    max_new_tokens: Bound = Bound(256, 16, 4096, 16)
    # Empty by default: not sent, so each engine's own default applies (docs/engineers/figures.md lists them).
    top_k: OptionalBound = OptionalBound(None, 1, 1000, integer=True)
    min_p: OptionalBound = OptionalBound(None, 0.0, 1.0)
    repetition_penalty: OptionalBound = OptionalBound(None, 0.01, 10.0)
    # llama.cpp takes a 32-bit seed and reads 2^32-1 as "random".
    seed: OptionalBound = OptionalBound(None, 0, 2**32 - 2, integer=True)
    system_prompt_preset: str = "helpful"
    # Compare and blind rounds (the settings panel changes them per session).
    mode: str = "chat"
    compare_backends: tuple[str, ...] = ()
    run_order: str = "auto"
    reveal: str = "finished"

    @classmethod
    def from_env(cls, env: Mapping[str, str], backend_names: list[str]) -> "ChatDefaults":
        backend = env.get("DEFAULT_BACKEND", backend_names[0] if backend_names else "")
        if backend_names and backend not in backend_names:
            raise ConfigurationError(
                f"DEFAULT_BACKEND={backend!r} is not one of BACKENDS ({', '.join(backend_names)})."
            )
        base = cls(backend=backend)
        return cls(
            backend=backend,
            temperature=_bound(env, "DEFAULT_TEMPERATURE", base.temperature),
            top_p=_bound(env, "DEFAULT_TOP_P", base.top_p),
            max_new_tokens=_bound(env, "DEFAULT_MAX_NEW_TOKENS", base.max_new_tokens),
            top_k=_optional_bound(env, "DEFAULT_TOP_K", base.top_k),
            min_p=_optional_bound(env, "DEFAULT_MIN_P", base.min_p),
            repetition_penalty=_optional_bound(env, "DEFAULT_REPETITION_PENALTY", base.repetition_penalty),
            seed=_optional_bound(env, "DEFAULT_SEED", base.seed),
            system_prompt_preset=env.get("DEFAULT_SYSTEM_PROMPT", base.system_prompt_preset),
            mode=_one_of(env, "DEFAULT_MODE", MODES),
            compare_backends=_compare_backends(env, backend_names),
            run_order=_one_of(env, "DEFAULT_RUN_ORDER", RUN_ORDERS),
            reveal=_one_of(env, "DEFAULT_REVEAL", REVEALS),
        )


def _bound(env: Mapping[str, str], variable: str, bound: Bound) -> Bound:
    raw = env.get(variable)
    if raw is None or raw == "":
        return bound
    value = parse_number(variable, raw)
    if not bound.minimum <= value <= bound.maximum:
        raise ConfigurationError(
            f"{variable}={raw} is outside {bound.minimum}..{bound.maximum}."
        )
    return Bound(value, bound.minimum, bound.maximum, bound.step)


def _one_of(env: Mapping[str, str], variable: str, choices: tuple[str, ...]) -> str:
    value = (env.get(variable) or choices[0]).strip()
    if value not in choices:
        raise ConfigurationError(f"{variable}={value!r}: use one of {', '.join(choices)}.")
    return value


def _compare_backends(env: Mapping[str, str], backend_names: list[str]) -> tuple[str, ...]:
    raw = env.get("DEFAULT_COMPARE_BACKENDS") or ""
    names = tuple(name.strip() for name in raw.split(",") if name.strip())
    if not names:
        return tuple(backend_names[:2])
    unknown = [name for name in names if name not in backend_names]
    if unknown or not MIN_COLUMNS <= len(names) <= MAX_COLUMNS or len(set(names)) != len(names):
        raise ConfigurationError(
            f"DEFAULT_COMPARE_BACKENDS={raw!r}: name 2 to 4 different backends of BACKENDS ({', '.join(backend_names)})."
        )
    return names


def _optional_bound(env: Mapping[str, str], variable: str, bound: OptionalBound) -> OptionalBound:
    raw = (env.get(variable) or "").strip()
    if not raw:
        return bound
    value = parse_number(variable, raw)
    if not bound.minimum <= value <= bound.maximum or (bound.integer and value != int(value)):
        kind = "a whole number" if bound.integer else "a number"
        raise ConfigurationError(
            f"{variable}={raw} must be {kind} in {bound.minimum:g}..{bound.maximum:g}, or empty (not sent)."
        )
    return OptionalBound(int(value) if bound.integer else value, bound.minimum, bound.maximum, bound.integer)


def parse_seconds(variable: str, raw: str) -> float:
    """A time limit: a positive number of seconds."""
    value = parse_number(variable, raw)
    if not value > 0 or value == float("inf"):
        raise ConfigurationError(f"{variable}={raw} must be a positive number of seconds.")
    return value


def parse_number(variable: str, raw: str) -> float:
    try:
        return float(raw)
    except ValueError:
        raise ConfigurationError(f"{variable}={raw!r} is not a number.") from None


@dataclass(frozen=True)
class BackendConfig:
    """Server-side settings of one named backend: what every kind has, plus its kind's own options.

    `options` holds the values of the variables only its kind declares (e.g. TGI's route, the
    embedded model's file), by the variable's name in lower case, parsed by the kind's spec
    (backends/kinds.py); a backend reads them through `Kind.options_of`, which fills defaults.
    The HTTP fields are unused by a kind that runs in this process.
    """

    name: str
    kind: str
    label: str
    base_url: str = ""
    api_key: str = ""
    # The transport's read timeout: the longest wait for any bytes (a last resort; the
    # watchdog's first-token and stall limits below normally fire first).
    timeout_s: float = 120.0
    connect_timeout_s: float = 3.0
    # Request sent -> first text (an in-process engine's own queue does not count).
    first_token_timeout_s: float = 60.0
    # The longest gap between chunks once text flows.
    stall_timeout_s: float = 30.0
    options: Mapping[str, object] = field(default_factory=dict)

    @property
    def env_prefix(self) -> str:
        return env_prefix(self.name)


def env_prefix(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9]", "_", name).upper() + "_"


def backend_names(env: Mapping[str, str]) -> list[str]:
    names = [n.strip() for n in env.get("BACKENDS", DEFAULT_BACKENDS).split(",") if n.strip()]
    if len(set(names)) != len(names):
        raise ConfigurationError(f"BACKENDS lists a name twice: {env.get('BACKENDS')!r}.")
    return names


def cache_lesson_backends(env: Mapping[str, str], backend_names: tuple[str, ...] | list[str]) -> tuple[str, str] | None:
    """CACHE_LESSON_BACKENDS: two configured backends of one engine, its prefix cache on then off (e.g. a
    vLLM started with --enable-prefix-caching and one with --no-enable-prefix-caching), for the engine
    panel's prefix-cache lesson; None when unset (the lesson is not offered)."""
    raw = (env.get("CACHE_LESSON_BACKENDS") or "").strip()
    if not raw:
        return None
    names = tuple(name.strip() for name in raw.split(",") if name.strip())
    if len(names) != 2 or names[0] == names[1] or any(name not in backend_names for name in names):
        raise ConfigurationError(f"CACHE_LESSON_BACKENDS={raw!r}: name two different backends of BACKENDS "
                                 f"({', '.join(backend_names)}), the one with prefix caching on first.")
    return names[0], names[1]
