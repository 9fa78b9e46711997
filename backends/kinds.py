"""What a backend kind is, declared by the kind itself; configuration parsed through it.

Each kind module (backends/llamacpp.py, openai_compat.py, tgi.py, ...) ends with
a `Kind`: its name, the label and aliases, its default URL, the variables only
it reads (default, help, parser), whether it runs in this process, where its
engine figures come from, which optional sampling settings it honours, and the
class that serves it. backends/registry.py lists the kinds, one line each.

Every kind reads the common variables (`LABEL` and the two stream limits);
a kind that talks HTTP also reads the HTTP basics (`BASE_URL`, `API_KEY` and
the transport's timeouts). They fill `BackendConfig`'s own fields; a kind's
own variables go to `BackendConfig.options` by their name in lower case.

Nothing outside a kind module asks "which kind is this?": callers ask the
backend (`in_process`) or the kind (`Kind.process_state`, `Kind.sampling`).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Callable, Mapping, Sequence

from config import BackendConfig, ConfigurationError, env_prefix, parse_number, parse_seconds

if TYPE_CHECKING:
    from backends.base import Backend

# A parser: (the full variable name, its raw text) -> the value; raises ConfigurationError naming the variable.
Parser = Callable[[str, str], object]


def text(variable: str, raw: str) -> str:
    """Any text, stripped."""
    return raw.strip()


def url(variable: str, raw: str) -> str:
    """A URL, without a trailing slash."""
    return raw.strip().rstrip("/")


def whole_number(minimum: int = 0) -> Parser:
    """A whole number >= minimum."""
    def parse(variable: str, raw: str) -> int:
        value = parse_number(variable, raw.strip())
        if value != int(value) or value < minimum:
            raise ConfigurationError(f"{variable}={raw!r} must be a whole number >= {minimum}.")
        return int(value)
    return parse


def one_of(*choices: str) -> Parser:
    """One of `choices` (case-insensitive)."""
    def parse(variable: str, raw: str) -> str:
        value = raw.strip().lower()
        if value not in choices:
            raise ConfigurationError(f"{variable}={value!r}: use one of {', '.join(repr(c) for c in choices)}.")
        return value
    return parse


def seconds(variable: str, raw: str) -> float:
    return parse_seconds(variable, raw.strip())


@dataclass(frozen=True)
class Variable:
    """One per-backend variable `N_<name>`: its default as written in .env, what it does, its parser.

    `field` names the `BackendConfig` field a common variable sets; a kind's own
    variable (field None) is an option under `name.lower()`.
    """

    name: str
    default: str
    help: str
    parse: Parser = text
    field: str | None = None

    @property
    def option(self) -> str:
        return self.name.lower()


def _common_variables(label: str) -> tuple[Variable, ...]:
    return (
        Variable("LABEL", label, "Name shown in the UI.", field="label"),
        Variable("FIRST_TOKEN_TIMEOUT_S", "60", "Seconds from the request to the first text.",
                 seconds, field="first_token_timeout_s"),
        Variable("STALL_TIMEOUT_S", "30", "The longest pause, in seconds, between chunks once text flows.",
                 seconds, field="stall_timeout_s"),
    )


def _http_variables(default_url: str) -> tuple[Variable, ...]:
    return (
        Variable("BASE_URL", default_url, "The server's URL.", url, field="base_url"),
        Variable("API_KEY", "", "API key if the server needs one.", field="api_key"),
        Variable("CONNECT_TIMEOUT_S", "3", "Seconds to wait for a connection.", seconds, field="connect_timeout_s"),
        Variable("TIMEOUT_S", "120", "The transport's read timeout: the longest wait for any bytes.",
                 seconds, field="timeout_s"),
    )


@dataclass(frozen=True)
class Kind:
    """A backend kind, as its module declares it.

    - `create`: makes the backend from its configuration (usually the class).
    - `aliases`: backend names that imply this kind without `N_KIND` (the kind's name does too).
    - `http`: it reads the HTTP basics; `default_url` is its BASE_URL default.
    - `in_process`: the engine runs inside the app's process (it shares this machine, its memory
      is the app's own).
    - `metrics_source`: where its engine-panel figures come from (the snapshots' `source`), or
      None when it reports none.
    - `sampling`: the optional settings (GenerationParams' top_k, min_p, repetition_penalty, seed)
      it can honour; the others are reported as ignored beside the reply.
    - `start_command`: how a person starts a local server of this kind (named when it is down).
    - `process_state`: for an in-process kind, its engines' counts in this process (GET /lab/state),
      and `worker_threads`, the name prefix of their threads.
    """

    name: str
    label: str
    create: Callable[[BackendConfig], "Backend"]
    aliases: tuple[str, ...] = ()
    http: bool = True
    default_url: str = ""
    variables: tuple[Variable, ...] = ()
    in_process: bool = False
    metrics_source: str | None = None
    sampling: tuple[str, ...] = ()
    start_command: str = ""
    process_state: Callable[[], Mapping[str, Mapping[str, object]]] | None = None
    worker_threads: str | None = None

    @property
    def declared_variables(self) -> tuple[Variable, ...]:
        """Every variable a backend of this kind reads (after its `N_` prefix), `KIND` aside."""
        common = _common_variables(self.label)
        return common + (_http_variables(self.default_url) if self.http else ()) + self.variables

    def names(self) -> tuple[str, ...]:
        """The kind's name and its aliases: each, as a backend name, implies this kind."""
        return (self.name, *self.aliases)

    def options_of(self, config: BackendConfig) -> dict[str, object]:
        """This kind's own options for `config`: given values checked by their parsers, defaults filled.

        Raises ConfigurationError for an option this kind does not declare (a typo must not pass
        as "use the default") or a value its parser refuses, naming the variable.
        """
        declared = {variable.option: variable for variable in self.variables}
        unknown = sorted(set(config.options) - set(declared))
        if unknown:
            raise ConfigurationError(
                f"Backend {config.name!r} (kind {self.name}) has no option {', '.join(unknown)}; "
                f"its options: {', '.join(declared) or 'none'}."
            )
        return {
            key: variable.parse(config.env_prefix + variable.name, str(config.options.get(key, variable.default)))
            for key, variable in declared.items()
        }


def kinds_by_name(kinds: Sequence[Kind]) -> dict[str, Kind]:
    """Every name and alias -> its kind."""
    return {name: kind for kind in kinds for name in kind.names()}


def parse_backend_config(name: str, env: Mapping[str, str], kinds: Sequence[Kind]) -> BackendConfig:
    """The configuration of backend `name` from `env`, through its kind's declared variables.

    The kind is `N_KIND` (a kind's name or alias), else implied by the backend's name (a kind's
    name or alias, e.g. llama_cpp); otherwise a ConfigurationError lists the known kinds.
    A variable set but empty takes its default.
    """
    prefix = env_prefix(name)
    by_name = kinds_by_name(kinds)
    given = env.get(prefix + "KIND", "").strip().lower()
    kind = by_name.get(given or name.lower())
    if kind is None:
        known = ", ".join(k.name for k in kinds)
        what = f"kind {given!r}" if given else "no kind"
        raise ConfigurationError(f"Backend {name!r} has {what}; set {prefix}KIND to one of: {known}.")
    # The kind's own label only for a backend named after it; any other name labels itself.
    named_after_kind = name.lower() in kind.names()
    values: dict[str, object] = {}
    options: dict[str, object] = {}
    for variable in kind.declared_variables:
        default = variable.default
        if variable.field == "label" and not named_after_kind:
            default = name
        raw = env.get(prefix + variable.name, "").strip() or default  # empty means the default
        if variable.field is None:
            options[variable.option] = raw
        else:
            values[variable.field] = variable.parse(prefix + variable.name, raw)
    config = BackendConfig(name=name, kind=kind.name, **values, options=options)
    return replace(config, options=kind.options_of(config))
