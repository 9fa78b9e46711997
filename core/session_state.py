"""Everything the app keeps for one chat session, in one object.

Chainlit writes a session's JSON-able values into the chat thread's metadata
when the tab disconnects, and sends that metadata to the browser with the
thread (the history sidebar, a resumed chat). So the app keeps nothing of its
own in Chainlit's session as JSON: one `LabSession` object, which Chainlit
cannot serialise and stores as null. Backend names of a blind round, each
backend's thread of the conversation and the person's pending text stay on
the server. A resumed chat rebuilds it from the database. What may be disclosed belongs to the
person, not the session: `disclosure` is the person's rule, shared with their other sessions.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from backends.base import ChatMessage
from core.disclosure import Disclosure
from core.history import Conversation
from core.settings import SessionSettings


@dataclass(eq=False)
class LabSession:
    """One chat session's state: its settings, conversation, rounds and what may be disclosed."""

    settings: SessionSettings
    conversation: Conversation = field(default_factory=Conversation)
    user_prompts: list[str] = field(default_factory=list)  # this chat's prompts, for /replay
    pending: str | None = None  # a message that failed, kept for Retry
    shown_down: set[str] | None = None  # backends the settings panel marks unavailable
    rounds: dict[str, Any] = field(default_factory=dict)  # round id -> core.round_flow.Round (the newest)
    round_elements: dict[str, tuple[str, str | None]] = field(default_factory=dict)  # round id -> its element, message
    engine_panel: Any = None  # the open engine panel (ui.engines_view)
    # Whose blind rule this session follows (core.disclosure.person_key) and that rule: the one
    # object every session of the person in this process shares (AppState.disclosures).
    person: str = ""
    disclosure: Disclosure = field(default_factory=Disclosure)

    @property
    def history(self) -> list[ChatMessage]:
        """The single-backend chat."""
        return self.conversation.history

    @property
    def threads(self) -> dict[str, list[ChatMessage]]:
        """Each backend's own thread in compare and blind rounds."""
        return self.conversation.threads
