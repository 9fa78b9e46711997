"""Per-session settings: the panel's widgets and the validated values behind them."""

from __future__ import annotations

import math
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Mapping, Sequence

from backends.base import SETTING_LABELS, GenerationParams
from backends.errors import UnknownBackend
from core.input import remove_control_characters
from config import REPO, Bound, ChatDefaults, OptionalBound
from vocabulary import MODES, REVEALS, RUN_ORDERS

PROMPTS_DIR = REPO / "prompts"
NO_SYSTEM_PROMPT = "none"
MAX_SYSTEM_PROMPT_CHARS = 20_000


def load_presets(directory: Path = PROMPTS_DIR) -> dict[str, str]:
    """id -> system prompt, from prompts/*.md (README.md excluded), plus 'none'."""
    presets = {
        path.stem: path.read_text(encoding="utf-8").strip()
        for path in sorted(directory.glob("*.md"))
        if path.name.lower() != "readme.md"
    }
    presets[NO_SYSTEM_PROMPT] = ""
    return presets


class SettingsRejected(ValueError):
    """The panel (or something posing as it) sent values that cannot be used; nothing was applied."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = problems
        super().__init__("; ".join(problems))


# A settings change's fields the panel does not have, by name only: ui/socket_guard.py drops their
# values before Chainlit keeps them in the session, and names them here so the person is told.
DROPPED_FIELDS = "dropped_fields"
MAX_DROPPED_NAMES = 5

@dataclass(frozen=True)
class SessionSettings:
    """What the settings panel chose for this session."""

    backend: str
    temperature: float
    top_p: float
    max_new_tokens: int
    system_preset: str
    system_custom: str = ""
    top_k: int | None = None
    min_p: float | None = None
    repetition_penalty: float | None = None
    seed: int | None = None
    # Compare and blind rounds: 2-4 configured backends, how they run, how blind text appears.
    mode: str = "chat"
    compare_backends: tuple[str, ...] = ()
    run_order: str = "auto"
    reveal: str = "finished"

    def system_prompt(self, presets: Mapping[str, str]) -> str:
        return self.system_custom.strip() or presets.get(self.system_preset, "")

    def params(self) -> GenerationParams:
        return GenerationParams(
            temperature=self.temperature, top_p=self.top_p, max_new_tokens=self.max_new_tokens,
            top_k=self.top_k, min_p=self.min_p, repetition_penalty=self.repetition_penalty, seed=self.seed,
        )

    def for_backend(self, name: str) -> "SessionSettings":
        """The same settings, answered by `name` (each column of a round)."""
        return replace(self, backend=name)

    @classmethod
    def initial(cls, defaults: ChatDefaults, presets: Mapping[str, str],
                backends: Sequence[str] = ()) -> "SessionSettings":
        preset = defaults.system_prompt_preset if defaults.system_prompt_preset in presets else NO_SYSTEM_PROMPT
        return cls(
            backend=defaults.backend,
            temperature=defaults.temperature.default,
            top_p=defaults.top_p.default,
            max_new_tokens=int(defaults.max_new_tokens.default),
            system_preset=preset,
            top_k=defaults.top_k.default,
            min_p=defaults.min_p.default,
            repetition_penalty=defaults.repetition_penalty.default,
            seed=defaults.seed.default,
            mode=defaults.mode,
            compare_backends=defaults.compare_backends or tuple(backends[:2]),
            run_order=defaults.run_order,
            reveal=defaults.reveal,
        )

    @classmethod
    def from_form(
        cls, values: Mapping[str, object], defaults: ChatDefaults, backends: list[str],
        presets: Mapping[str, str],
    ) -> "SessionSettings":
        """Validate what the panel sent. Anything out of bounds is refused, not clamped:
        the panel cannot send it, so it was typed wrong or forged, and the person is told."""
        backend = str(values.get("backend", defaults.backend))
        if backend not in backends:
            raise UnknownBackend(_quoted(backend), backends)
        problems: list[str] = []
        dropped = values.get(DROPPED_FIELDS)  # named where they arrived, their values never kept
        unknown = sorted((set(values) - {setting.name for setting in fields(cls)} - {DROPPED_FIELDS})
                         | {str(name) for name in (dropped if isinstance(dropped, list) else [])})
        if unknown:
            problems.append(f"unknown setting(s) {', '.join(_quoted(str(name)) for name in unknown[:5])}: the panel "
                            "has no such field (backend addresses and keys come only from the server's configuration)")
        preset = str(values.get("system_preset") or NO_SYSTEM_PROMPT)
        if preset not in presets:
            problems.append(f"system prompt preset {_quoted(preset)!r} does not exist "
                            f"(choose one of: {', '.join(presets)})")
        custom = values.get("system_custom") or ""
        if not isinstance(custom, str):
            problems.append("the custom system prompt must be text")
            custom = ""
        elif len(custom) > MAX_SYSTEM_PROMPT_CHARS:
            problems.append(f"the custom system prompt is {len(custom):,} characters; "
                            f"the limit is {MAX_SYSTEM_PROMPT_CHARS:,}")
        elif controls := remove_control_characters(custom)[1]:
            problems.append(f"the custom system prompt contains {controls} control character(s) such as NUL "
                            "(only tab, newline and carriage return may be used)")
        settings = dict(
            backend=backend,
            temperature=_required(values, "temperature", defaults.temperature, problems),
            top_p=_required(values, "top_p", defaults.top_p, problems),
            max_new_tokens=int(_required(values, "max_new_tokens", defaults.max_new_tokens, problems)),
            system_preset=preset,
            system_custom=custom,
            top_k=_optional(values, "top_k", defaults.top_k, problems),
            min_p=_optional(values, "min_p", defaults.min_p, problems),
            repetition_penalty=_optional(values, "repetition_penalty", defaults.repetition_penalty, problems),
            seed=_optional(values, "seed", defaults.seed, problems),
            mode=_choice(values, "mode", MODES, problems),
            compare_backends=_backend_list(values.get("compare_backends"), backends, problems),
            run_order=_choice(values, "run_order", RUN_ORDERS, problems),
            reveal=_choice(values, "reveal", REVEALS, problems),
        )
        if settings["mode"] != "chat" and not 2 <= len(settings["compare_backends"]) <= 4:
            problems.append(f"compare and blind rounds need 2 to 4 backends "
                            f"({len(settings['compare_backends'])} chosen)")
        if problems:
            raise SettingsRejected(problems)
        return cls(**settings)


def _quoted(raw: str, limit_chars: int = 60) -> str:
    """A forged value as it is quoted back: short (a 1 MB "backend name" is not echoed)."""
    return raw if len(raw) <= limit_chars else raw[:limit_chars] + "…"


def _choice(values: Mapping[str, object], name: str, choices: tuple[str, ...], problems: list[str]) -> str:
    raw = values.get(name)
    if raw is None:
        return choices[0]
    if raw not in choices:
        problems.append(f"{name.replace('_', ' ')} {str(raw)[:40]!r} is not one of {', '.join(choices)}")
        return choices[0]
    return str(raw)


def _backend_list(raw: object, backends: list[str], problems: list[str]) -> tuple[str, ...]:
    if raw is None:
        return ()
    if not isinstance(raw, (list, tuple)) or not all(isinstance(name, str) for name in raw):
        problems.append("the backends to compare must be a list of backend names")
        return ()
    unknown = [name for name in raw if name not in backends]
    if unknown:
        problems.append(f"unknown backend(s) to compare: {', '.join(n[:40] for n in unknown)} "
                        f"(configured: {', '.join(backends)})")
        return ()
    if len(set(raw)) != len(raw):
        problems.append("a backend was chosen twice to compare")
        return ()
    return tuple(raw)


def _number(raw: object) -> float | None:
    """A finite number from a widget value (a number, or text typed into a field), else None."""
    if isinstance(raw, bool):
        return None
    try:
        value = float(str(raw).strip()) if isinstance(raw, str) else float(raw)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None
    return value if math.isfinite(value) else None


def _required(values: Mapping[str, object], name: str, bound: Bound, problems: list[str]) -> float:
    raw = values.get(name)
    if raw is None:
        return bound.default
    value = _number(raw)
    if value is None or not bound.minimum <= value <= bound.maximum:
        problems.append(f"{SETTING_LABELS[name]} {str(raw)[:40]!r} must be a number in "
                        f"{bound.minimum:g}..{bound.maximum:g}")
        return bound.default
    return value


def _optional(values: Mapping[str, object], name: str, bound: OptionalBound, problems: list[str]):
    raw = values.get(name)
    if raw is None or (isinstance(raw, str) and not raw.strip()):
        return None
    value = _number(raw)
    whole = value is not None and value == int(value)
    if value is None or not bound.minimum <= value <= bound.maximum or (bound.integer and not whole):
        kind = "a whole number" if bound.integer else "a number"
        problems.append(f"{SETTING_LABELS[name]} {str(raw)[:40]!r} must be {kind} in "
                        f"{bound.minimum:g}..{bound.maximum:g}, or empty (not sent)")
        return None
    return int(value) if bound.integer else value


def shown_value(value: float | None) -> str:
    if value is None:
        return ""
    return str(int(value)) if float(value).is_integer() else str(value)
