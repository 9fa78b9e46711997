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


# ---------------------------------------------------------------- a message step as the browser sends it

# Chainlit stores the step a browser sends (`client_message`) before the app's handler sees it:
# whatever a page (or a script speaking its protocol) put there reached the database, up to the
# socket's 4,000,000 characters. So the step is checked where it arrives (ui/socket_guard.py):
# each field Chainlit reads is typed and bounded, everything else dropped, and a text the handler
# would refuse is not stored at all (the refusal travels to the handler in the step's metadata,
# under REFUSAL_KEY, which only this check can set).
REFUSAL_KEY = "lab_input_refused"
MAX_NAME_CHARS = 200
MAX_FIELD_CHARS = 100  # ids, a command, a language, a mode's name and value
MAX_PAGE_URL_CHARS = 2_000
MAX_MODES = 20
USER_MESSAGE = "user_message"


@dataclass(frozen=True)
class CheckedStep:
    """A browser's message step as it may be stored and handled (None: not a message at all, dropped)."""

    step: dict | None
    refusal: Notice | None = None


def check_client_step(step: object, limit_chars: int = MAX_MESSAGE_CHARS) -> CheckedStep:
    """The step with every field typed and bounded (see REFUSAL_KEY's comment). A step that is not a
    dict or has no uuid4 id is not a message (Chainlit itself would fail on it); a text
    `check_message` refuses is replaced by "" and its refusal kept for the handler."""
    if not isinstance(step, dict) or not _uuid4(step.get("id")):
        return CheckedStep(None)
    checked: dict = {"id": step["id"], "type": USER_MESSAGE, "threadId": _short(step.get("threadId")) or "",
                     "createdAt": _short(step.get("createdAt")) or ""}
    for field_name, limit in (("name", MAX_NAME_CHARS), ("parentId", MAX_FIELD_CHARS),
                              ("command", MAX_FIELD_CHARS), ("language", MAX_FIELD_CHARS)):
        value = _short(step.get(field_name), limit)
        if value is not None:
            checked[field_name] = value
    modes = _modes(step.get("modes"))
    if modes is not None:
        checked["modes"] = modes
    metadata = step.get("metadata")
    location = _short(metadata.get("location"), MAX_PAGE_URL_CHARS) if isinstance(metadata, dict) else None
    checked["metadata"] = {"location": location} if location is not None else {}
    text = step.get("output")
    verdict = check_message(text, limit_chars)
    if verdict.refused:
        checked["output"] = ""
        checked["metadata"][REFUSAL_KEY] = {"key": verdict.refusal.key, "values": dict(verdict.refusal.values)}
        return CheckedStep(checked, verdict.refusal)
    checked["output"] = text  # the handler cleans it and says what it removed (`check_message` again)
    return CheckedStep(checked)


def refusal_of(metadata: object) -> Notice | None:
    """The refusal `check_client_step` put in a step's metadata, if any."""
    refused = metadata.get(REFUSAL_KEY) if isinstance(metadata, dict) else None
    if isinstance(refused, dict) and isinstance(refused.get("key"), str) and isinstance(refused.get("values"), dict):
        return Notice(refused["key"], refused["values"])
    return None


def _uuid4(value: object) -> bool:
    import uuid

    if not isinstance(value, str) or len(value) > MAX_FIELD_CHARS:
        return False
    try:
        return uuid.UUID(value).version == 4
    except ValueError:
        return False


def _short(value: object, limit: int = MAX_FIELD_CHARS) -> str | None:
    """`value` if it is text of at most `limit` characters, cleaned of control characters; else None."""
    if not isinstance(value, str) or len(value) > limit:
        return None
    cleaned, _ = remove_control_characters(value)
    return _LONE_SURROGATES.sub(REPLACEMENT_CHARACTER, cleaned)


def _modes(value: object) -> dict[str, str] | None:
    if not isinstance(value, dict) or len(value) > MAX_MODES:
        return None
    modes = {_short(key): _short(item) for key, item in value.items()}
    return None if None in modes or None in modes.values() else modes
