"""What a browser may receive while a blind round waits for its vote: one rule, for every view.

A blind round hides which backend answered in which column until the person
has voted. Hiding it in the round's own element is not enough: a table of
this chat's replies, a replay, the leaderboard's medians, the engine panel,
a backend's health in /status or in the settings panel, an error text that
names a server, or the chat's thread sent back on resume could each tie a
column to a backend. So every view asks this one Chainlit-free rule:

- `refusal(command)`: while a blind round of this session is unvoted, the
  commands that would show per-backend figures, health or load wait, and
  say why (they work again after the vote);
- `health_shown()`: whether a backend's availability may be shown (the
  settings panel's "unavailable" marks, refreshed after replies);
- `panel_allowed(mode)`: the engine panel stays open only outside blind mode
  and while no blind round waits (it is closed when the session switches);
- `screen(text)`: every text the app itself writes (notices, errors, store
  faults) has any name, label, model id or address of a hidden round's
  backends replaced, as a last guard for texts no view foresaw.

Model replies and the person's own text are never screened: they are the
content being judged. The words to hide come from each column's backend and
its plan (`identifying_words`).

The rule lives in one object per session that is deliberately not JSON
(Chainlit writes a session's JSON-able values into the thread's metadata,
which the browser receives with the thread).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Iterable
from urllib.parse import urlparse

# Commands that show per-backend figures, health or load: they wait while a blind round is unvoted.
WAITING_COMMANDS = ("stats", "replay", "leaderboard", "export_votes", "status", "engines", "bench", "trace")
HIDDEN = "[hidden until the vote]"
SHORTEST_WORD = 3  # shorter words would match inside ordinary text


@dataclass(frozen=True)
class Wait:
    """Why a command waits: a notice key (core.texts) and its values."""

    key: str
    values: dict = field(default_factory=dict)


def identifying_words(*, name: str, label: str, url: str = "", model: str = "",
                      display_label: str = "") -> set[str]:
    """Everything that names one backend: its configured name, its labels, its model id, its URL and
    the URL's host:port (an embedded model's "url" is its file)."""
    words = {name, label, display_label, model, url}
    parsed = urlparse(url) if "://" in url else None
    if parsed is not None and parsed.netloc:
        words.add(parsed.netloc)
        words.add(url.rstrip("/"))
    if url.startswith("in-process: "):
        words.add(url.removeprefix("in-process: "))
    return {word.strip() for word in words if word and len(word.strip()) >= SHORTEST_WORD}


class Disclosure:
    """The rule for one chat session: which blind rounds wait for a vote, and what that hides."""

    def __init__(self) -> None:
        self._hidden: dict[str, frozenset[str]] = {}  # round id -> words that would name a column's backend
        self._pattern: re.Pattern | None = None
        # A reopened chat whose blind rounds could not be read (the database is unavailable, or its
        # rows still wait to be written): it may hold one without a vote, so everything waits.
        self.unsure = False

    def __repr__(self) -> str:  # never the words
        return f"Disclosure({len(self._hidden)} blind round(s) waiting for a vote)"

    # ------------------------------------------------------------ rounds

    def hide(self, round_id: str, words: Iterable[str]) -> None:
        """A blind round started (or learned more of its backends): their words stay hidden until
        `reveal(round_id)`."""
        found = {word.strip() for word in words if word and len(word.strip()) >= SHORTEST_WORD}
        self._hidden[round_id] = self._hidden.get(round_id, frozenset()) | found
        self._pattern = None

    def reveal(self, round_id: str) -> None:
        """The round was voted on: what it hid may be shown."""
        if self._hidden.pop(round_id, None) is not None:
            self._pattern = None

    @property
    def waiting_rounds(self) -> int:
        """Blind rounds of this session that wait for their vote."""
        return len(self._hidden)

    # ------------------------------------------------------------ the rule

    def refusal(self, command: str) -> Wait | None:
        """Why `command` must wait now, or None when it may run."""
        if command not in WAITING_COMMANDS:
            return None
        if self.unsure:
            return Wait("blind_wait_unsure", {"command": command})
        if self._hidden:
            return Wait("blind_wait", {"command": command, "rounds": len(self._hidden)})
        return None

    def health_shown(self) -> bool:
        """Whether backends' availability may be shown (it could name a blind column's failure)."""
        return not self._hidden and not self.unsure

    def panel_allowed(self, mode: str) -> bool:
        """Whether the engine panel may stay open (each engine's load would show which column is which)."""
        return mode != "blind" and not self._hidden and not self.unsure

    def screen(self, text: str) -> str:
        """`text` (written by the app, not a model's reply) with every hidden word replaced."""
        if not self._hidden or not text:
            return text
        if self._pattern is None:
            words = sorted({word for words in self._hidden.values() for word in words}, key=len, reverse=True)
            self._pattern = re.compile("|".join(re.escape(word) for word in words), re.IGNORECASE)
        return self._pattern.sub(HIDDEN, text)
