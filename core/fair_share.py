"""A fair share of the app for each person in a class: how many chats and replies one may hold.

One student must not be able to slow the others by more than one reply's worth. So, per person
(a login; with login off a browser, whose cookie a script can drop, so these hold for logins):

- a chat has at most one reply in flight: a second message while one streams is refused, as the
  page itself does (it disables sending until the reply ends);
- a person has at most `replies_per_person` replies in flight over all their chats
  (`LAB_MAX_REPLIES_PER_PERSON`, default 2: a reply and a compare round in another tab);
- a person has at most `chats_per_person` chat sockets open (`LAB_MAX_CHATS_PER_PERSON`,
  default 6); the next one is refused with a message that says why;
- the embedded engine serves people in turn (backends/llamacpp.py `TurnQueue`), and a reply whose
  chat was closed is cancelled, its queued work dropped (ui/socket_guard.py).

This module keeps the counts; ui/socket_guard.py applies them where Chainlit's socket events
arrive. Nothing here imports Chainlit.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

from config import ConfigurationError

CHATS_VARIABLE = "LAB_MAX_CHATS_PER_PERSON"
REPLIES_VARIABLE = "LAB_MAX_REPLIES_PER_PERSON"
DEFAULT_CHATS_PER_PERSON = 6
DEFAULT_REPLIES_PER_PERSON = 2


@dataclass(frozen=True)
class ShareLimits:
    chats_per_person: int = DEFAULT_CHATS_PER_PERSON
    replies_per_person: int = DEFAULT_REPLIES_PER_PERSON

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> "ShareLimits":
        return cls(_at_least_one(env, CHATS_VARIABLE, DEFAULT_CHATS_PER_PERSON, "chats open"),
                   _at_least_one(env, REPLIES_VARIABLE, DEFAULT_REPLIES_PER_PERSON, "replies in flight"))


def _at_least_one(env: Mapping[str, str], name: str, default: int, what: str) -> int:
    raw = (env.get(name) or "").strip()
    if not raw:
        return default
    try:
        value = int(raw)
    except ValueError:
        value = 0
    if value < 1:
        raise ConfigurationError(f"{name}={raw!r}: give a whole number of at least 1 ({what} per person); "
                                 f"leave it empty for {default}.")
    return value


@dataclass
class Share:
    """Who holds which chat sockets and which chats have a reply in flight, in this process."""

    limits: ShareLimits = field(default_factory=ShareLimits)
    _sockets: dict[str, set[str]] = field(default_factory=dict)  # person -> open socket ids
    _owner_of_socket: dict[str, str] = field(default_factory=dict)
    _replying: dict[str, set[str]] = field(default_factory=dict)  # person -> chats (sessions) replying

    # Sockets ------------------------------------------------------------------

    def may_open(self, person: str) -> bool:
        return len(self._sockets.get(person, ())) < self.limits.chats_per_person

    def opened(self, person: str, socket_id: str) -> None:
        self._sockets.setdefault(person, set()).add(socket_id)
        self._owner_of_socket[socket_id] = person

    def closed(self, socket_id: str) -> None:
        person = self._owner_of_socket.pop(socket_id, None)
        if person is not None:
            sockets = self._sockets.get(person, set())
            sockets.discard(socket_id)
            if not sockets:
                self._sockets.pop(person, None)

    # Replies ------------------------------------------------------------------

    def refusal(self, person: str, chat: str) -> str | None:
        """Why a new reply in `chat` may not start now (a text key of core.texts), or None."""
        replying = self._replying.get(person, set())
        if chat in replying:
            return "share_one_reply_per_chat"
        if len(replying) >= self.limits.replies_per_person:
            return "share_replies_per_person"
        return None

    def started(self, person: str, chat: str) -> None:
        self._replying.setdefault(person, set()).add(chat)

    def ended(self, person: str, chat: str) -> None:
        replying = self._replying.get(person, set())
        replying.discard(chat)
        if not replying:
            self._replying.pop(person, None)
