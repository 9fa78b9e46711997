"""Something the person should be told, as data: a key of core.texts and its values.

The core decides what to say (a reply was trimmed, a message refused, a row not saved); the UI
renders it in the person's language. One type for every view.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

from core.texts import text


@dataclass(frozen=True)
class Notice:
    """A key of core.texts with the values its text needs."""

    key: str
    values: Mapping[str, object] = field(default_factory=dict)

    def render(self, lang: str) -> str:
        return text(self.key, lang, **self.values)
