"""The settings panel's widgets (Chainlit), built from the session's settings and their bounds
(core/settings.py holds the settings, their checks and defaults)."""

from __future__ import annotations

from typing import Mapping, Sequence

from chainlit.input_widget import MultiSelect, Select, Slider, TextInput

from config import Bound, ChatDefaults, OptionalBound
from core.settings import MODES, REVEALS, RUN_ORDERS, SessionSettings, shown_value
from core.texts import text


# The panel's fields, by widget id: what a `chat_settings_change` may set (ui/socket_guard.py drops the rest).
PANEL_FIELDS = frozenset({
    "mode", "backend", "compare_backends", "run_order", "reveal", "temperature", "top_p", "max_new_tokens",
    "top_k", "min_p", "repetition_penalty", "seed", "system_preset", "system_custom",
})


def settings_widgets(
    current: SessionSettings,
    defaults: ChatDefaults,
    backend_labels: Mapping[str, str],
    presets: Mapping[str, str],
    lang: str,
) -> list:
    """The Chainlit widgets, with defaults and bounds taken from ChatDefaults."""
    def slider(widget_id: str, bound: Bound, value: float) -> Slider:
        return Slider(id=widget_id, label=text(widget_id, lang), initial=value,
                      min=bound.minimum, max=bound.maximum, step=bound.step)

    def optional(widget_id: str, bound: OptionalBound, value: float | None) -> TextInput:
        return TextInput(
            id=widget_id, label=text(widget_id, lang), initial=shown_value(value),
            placeholder=text("optional_placeholder", lang),
            description=text("optional_help", lang, minimum=f"{bound.minimum:g}", maximum=f"{bound.maximum:g}"),
        )

    def choice(widget_id: str, options: Sequence[str], value: str) -> Select:
        return Select(id=widget_id, label=text(widget_id, lang), description=text(f"{widget_id}_help", lang),
                      items={text(f"{widget_id}_{option}", lang): option for option in options},
                      initial_value=value)

    return [
        choice("mode", MODES, current.mode),
        Select(
            id="backend", label=text("backend", lang), description=text("backend_help", lang),
            items={label: name for name, label in backend_labels.items()},
            initial_value=current.backend,
        ),
        MultiSelect(
            id="compare_backends", label=text("compare_backends", lang),
            description=text("compare_backends_help", lang),
            items={label: name for name, label in backend_labels.items()},
            initial=list(current.compare_backends),
        ),
        choice("run_order", RUN_ORDERS, current.run_order),
        choice("reveal", REVEALS, current.reveal),
        slider("temperature", defaults.temperature, current.temperature),
        slider("top_p", defaults.top_p, current.top_p),
        slider("max_new_tokens", defaults.max_new_tokens, current.max_new_tokens),
        optional("top_k", defaults.top_k, current.top_k),
        optional("min_p", defaults.min_p, current.min_p),
        optional("repetition_penalty", defaults.repetition_penalty, current.repetition_penalty),
        optional("seed", defaults.seed, current.seed),
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
