"""What a typed message must be before it goes to a backend: pure checks, no Chainlit.

`check_message` decides, for any value that arrived as a message's text (the
composer, a forged `client_message`, a retry):

- not text, or empty / only whitespace -> refused, nothing is sent;
- NUL and the other C0 control characters except tab, newline and carriage
  return -> removed, with a notice saying how many (PostgreSQL cannot store
  NUL in text, and no model needs them);
- unpaired UTF-16 surrogates (a JSON string can carry "\\ud800"; UTF-8 cannot
  encode it, so the request would fail) -> replaced with U+FFFD, with a notice;
- longer than `MAX_MESSAGE_CHARS` after that -> refused, saying the length and
  the limit (the message stays in the chat, where the person can copy it);
- everything else (emoji, right-to-left text, CJK, mixed scripts, markup)
  passes unchanged, character for character.

A message that fits the limit can still be longer than a backend's context:
`core.history.fit_to_context` trims the history and the backend's own error
says how long the prompt was.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from core.notices import Notice

# ~8-10k tokens of English (fewer characters per token in Chinese): more than the
# context of the small models a classroom runs, far below socket.io's 1,000,000-
# character frame limit, and a size a person still means to send. Longer is a
# mistaken paste (a log, a file).
MAX_MESSAGE_CHARS = 32_000
# C0 controls except \t \n \r. DEL and the C1 range are left alone: harmless to
# every backend and to both databases.
_CONTROL_CHARACTERS = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f]")
_LONE_SURROGATES = re.compile("[\ud800-\udfff]")
REPLACEMENT_CHARACTER = "\ufffd"


@dataclass(frozen=True)
class Checked:
    """The outcome: `text_to_send` (None when refused), notices to show first, or the refusal."""

    text_to_send: str | None
    notices: tuple[Notice, ...] = ()
    refusal: Notice | None = None

    @property
    def refused(self) -> bool:
        return self.refusal is not None


def remove_control_characters(text: str) -> tuple[str, int]:
    """`text` without C0 control characters (tab, newline, carriage return kept), and how many went."""
    cleaned, removed = _CONTROL_CHARACTERS.subn("", text)
    return cleaned, removed


def check_message(text: object, limit_chars: int = MAX_MESSAGE_CHARS) -> Checked:
    """Refuse, clean or pass one message's text (see the module docstring)."""
    if text is None:
        text = ""
    if not isinstance(text, str):
        return Checked(None, refusal=Notice("input_not_text", {"kind": type(text).__name__}))
    notices = []
    text, removed = remove_control_characters(text)
    if removed:
        notices.append(Notice("input_controls_removed", {"count": removed}))
    text, replaced = _LONE_SURROGATES.subn(REPLACEMENT_CHARACTER, text)
    if replaced:
        notices.append(Notice("input_surrogates_replaced", {"count": replaced}))
    if not text.strip():
        return Checked(None, refusal=Notice("input_empty"))
    if len(text) > limit_chars:
        return Checked(None, refusal=Notice("input_too_long", {"length": len(text), "limit": limit_chars}))
    return Checked(text, tuple(notices))
