"""Per-session settings: the panel's widgets and the validated values behind them."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

from backends.base import GenerationParams
from backends.errors import UnknownBackend
from chat.i18n import text
from config import Bound, ChatDefaults

PROMPTS_DIR = Path(__file__).resolve().parent.parent / "prompts"
NO_SYSTEM_PROMPT = "none"


def load_presets(directory: Path = PROMPTS_DIR) -> dict[str, str]:
    """id -> system prompt, from prompts/*.md (README.md excluded), plus 'none'."""
    presets = {
        path.stem: path.read_text(encoding="utf-8").strip()
        for path in sorted(directory.glob("*.md"))
        if path.name.lower() != "readme.md"
    }
    presets[NO_SYSTEM_PROMPT] = ""
    return presets


@dataclass(frozen=True)
class SessionSettings:
    """What the settings panel chose for this session."""

    backend: str
    temperature: float
    top_p: float
    max_new_tokens: int
    system_preset: str
    system_custom: str = ""

    def system_prompt(self, presets: Mapping[str, str]) -> str:
        return self.system_custom.strip() or presets.get(self.system_preset, "")

    def params(self) -> GenerationParams:
        return GenerationParams(
            temperature=self.temperature, top_p=self.top_p, max_new_tokens=self.max_new_tokens
        )

    @classmethod
    def initial(cls, defaults: ChatDefaults, presets: Mapping[str, str]) -> "SessionSettings":
        preset = defaults.system_prompt_preset if defaults.system_prompt_preset in presets else NO_SYSTEM_PROMPT
        return cls(
            backend=defaults.backend,
            temperature=defaults.temperature.default,
            top_p=defaults.top_p.default,
            max_new_tokens=int(defaults.max_new_tokens.default),
            system_preset=preset,
        )

    @classmethod
    def from_form(
        cls, values: Mapping[str, object], defaults: ChatDefaults, backends: list[str],
        presets: Mapping[str, str],
    ) -> "SessionSettings":
        """Validate what the panel sent; numbers are clamped to their bounds."""
        backend = str(values.get("backend", defaults.backend))
        if backend not in backends:
            raise UnknownBackend(backend, backends)
        preset = str(values.get("system_preset") or NO_SYSTEM_PROMPT)
        if preset not in presets:
            preset = NO_SYSTEM_PROMPT
        return cls(
            backend=backend,
            temperature=_clamp(values.get("temperature"), defaults.temperature),
            top_p=_clamp(values.get("top_p"), defaults.top_p),
            max_new_tokens=int(_clamp(values.get("max_new_tokens"), defaults.max_new_tokens)),
            system_preset=preset,
            system_custom=str(values.get("system_custom") or ""),
        )


def _clamp(value: object, bound: Bound) -> float:
    try:
        number = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return bound.default
    return min(max(number, bound.minimum), bound.maximum)


def settings_widgets(
    current: SessionSettings,
    defaults: ChatDefaults,
    backend_labels: Mapping[str, str],
    presets: Mapping[str, str],
    lang: str,
) -> list:
    """The Chainlit widgets, with defaults and bounds taken from ChatDefaults."""
    from chainlit.input_widget import Select, Slider, TextInput

    def slider(widget_id: str, bound: Bound, value: float) -> Slider:
        return Slider(id=widget_id, label=text(widget_id, lang), initial=value,
                      min=bound.minimum, max=bound.maximum, step=bound.step)

    return [
        Select(
            id="backend", label=text("backend", lang), description=text("backend_help", lang),
            items={label: name for name, label in backend_labels.items()},
            initial_value=current.backend,
        ),
        slider("temperature", defaults.temperature, current.temperature),
        slider("top_p", defaults.top_p, current.top_p),
        slider("max_new_tokens", defaults.max_new_tokens, current.max_new_tokens),
        Select(
            id="system_preset", label=text("system_preset", lang),
            description=text("system_preset_help", lang),
            values=list(presets), initial_value=current.system_preset,
        ),
        TextInput(
            id="system_custom", label=text("system_custom", lang), initial=current.system_custom,
            placeholder=text("system_custom_placeholder", lang), multiline=True,
        ),
    ]
