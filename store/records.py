"""What the app stores and reads back: frozen dataclasses, times in UTC.

A `StoredReply` is one streamed answer with its figures; a `CompareRound`
is a compare or blind round (which backend ran in which column); a `Vote`
is the user's verdict on a round. `check_vote` holds the rules a vote must
follow and `names_in_comment` finds a comment that names a backend; both are
pure so the rules can be tested without a database.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Iterable

from vocabulary import (JUDGEMENTS, REPLY_MODES, REPLY_STATUSES, REVEALS, ROUND_MODES, RUN_ORDERS_TAKEN as RUN_ORDERS,
                        VOTE_OUTCOMES)
from store.errors import VoteRejected

# Why a vote is kept but not rated. A comment that names a backend shows the voter knew (or
# guessed) who answered, so the vote is not blind any more (Chatbot Arena drops such votes too).
UNRATED_COMMENT_NAMES_BACKEND = "comment_names_backend"
# Its voter chose, before voting, to see something that could tell which column is which backend (a
# reply from one of its backends, the engine panel, /status...: core/disclosure.py): not blind any more.
UNRATED_SHOWN_BEFORE_VOTE = "shown_before_vote"
# A teacher closed the class's open blind rounds (e.g. after a rehearsal): they hold nobody any more.
UNRATED_CLOSED_BY_TEACHER = "closed_by_teacher"
UNRATED_REASONS = (UNRATED_COMMENT_NAMES_BACKEND, UNRATED_SHOWN_BEFORE_VOTE, UNRATED_CLOSED_BY_TEACHER)


def utc_now() -> datetime:
    return datetime.now(timezone.utc)


def _require_choice(owner: str, name: str, value: str, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ValueError(f"{owner}.{name} is {value!r}; expected one of {', '.join(choices)}")


def _require_aware(owner: str, value: datetime) -> None:
    if value.tzinfo is None:
        raise ValueError(f"{owner}.created_at {value!r} has no time zone; use datetime.now(timezone.utc)")


@dataclass(frozen=True)
class StoredReply:
    """One reply as it finished: who answered, what was sent, and every figure measured."""

    id: str  # the Chainlit step id of the reply message
    thread_id: str | None
    user_identifier: str | None
    created_at: datetime
    backend: str  # the configured backend name
    backend_label: str
    model: str
    mode: str  # chat | compare | blind | replay
    round_id: str | None
    column_label: str | None  # "A".."D" in a compare or blind round
    prompt: str
    reply_text: str
    status: str  # completed | stopped | error
    first_token_s: float | None
    decode_tokens_per_s: float | None
    output_tokens: int
    total_s: float
    ms_per_output_token: float | None
    settings_sent: dict[str, Any]  # what was sent to the engine
    record: dict[str, Any]  # the full measurement, including the timeline of chunk times
    error: str | None = None

    def __post_init__(self) -> None:
        _require_choice("StoredReply", "mode", self.mode, REPLY_MODES)
        _require_choice("StoredReply", "status", self.status, REPLY_STATUSES)
        _require_aware("StoredReply", self.created_at)


@dataclass(frozen=True)
class RoundColumn:
    """One column of a round: its label, the backend that ran there, and its reply once saved."""

    label: str
    backend: str
    reply_id: str | None = None


@dataclass(frozen=True)
class CompareRound:
    """One prompt sent to several backends side by side (`compare`) or anonymously (`blind`)."""

    id: str
    thread_id: str | None
    user_identifier: str | None
    created_at: datetime
    prompt: str
    mode: str  # compare | blind
    run_order: str  # sequential | concurrent
    columns: tuple[RoundColumn, ...]
    # A blind round's reveal (finished | pace): whether its text showed at some engine's pace
    # before the vote. None for a compare round (names and figures were shown) and older rounds.
    reveal: str | None = None
    # Whose blind rule holds it until the vote (core/disclosure.py person keys); None for older rounds.
    person: str | None = None
    # Stopped before every column ended, its partial texts shown at once: its vote saw speed.
    speed_seen: bool | None = None
    # Its person chose to see what could name its columns before voting (one of UNRATED_REASONS).
    not_blind_reason: str | None = None

    def __post_init__(self) -> None:
        _require_choice("CompareRound", "mode", self.mode, ROUND_MODES)
        _require_choice("CompareRound", "run_order", self.run_order, RUN_ORDERS)
        if self.reveal is not None:
            _require_choice("CompareRound", "reveal", self.reveal, REVEALS)
        if self.not_blind_reason is not None:
            _require_choice("CompareRound", "not_blind_reason", self.not_blind_reason, UNRATED_REASONS)
        _require_aware("CompareRound", self.created_at)
        object.__setattr__(self, "columns", tuple(self.columns))
        labels = self.labels
        if len(labels) < 2 or len(set(labels)) != len(labels):
            raise ValueError(f"CompareRound.columns need two or more distinct labels, got {list(labels)}")

    @property
    def labels(self) -> tuple[str, ...]:
        return tuple(column.label for column in self.columns)

    def column(self, label: str) -> RoundColumn | None:
        return next((column for column in self.columns if column.label == label), None)


@dataclass(frozen=True)
class Vote:
    """The user's verdict on a round: a winner, a tie, or both bad, with optional per-column judgements."""

    round_id: str
    outcome: str  # win | tie | both_bad
    winner_label: str | None = None
    judgements: dict[str, str] = field(default_factory=dict)  # label -> good | bad
    comment: str = ""
    user_identifier: str | None = None
    created_at: datetime = field(default_factory=utc_now)
    unrated_reason: str | None = None  # kept but not rated (one of UNRATED_REASONS), else None

    def __post_init__(self) -> None:
        _require_aware("Vote", self.created_at)
        if self.unrated_reason is not None:
            _require_choice("Vote", "unrated_reason", self.unrated_reason, UNRATED_REASONS)


@dataclass(frozen=True)
class ReplySpeed:
    """A stored reply's speed figures alone (the leaderboard's medians), without text or timeline."""

    backend: str
    status: str
    first_token_s: float | None
    decode_tokens_per_s: float | None


@dataclass(frozen=True)
class ColumnReply:
    """What one column of a voted round answered, for the ratings' controls and the vote export:
    the reply's text, figures and settings, without its timeline."""

    backend_label: str
    model: str
    reply_text: str
    status: str
    first_token_s: float | None
    decode_tokens_per_s: float | None
    output_tokens: int
    total_s: float
    settings_sent: dict[str, Any]


@dataclass(frozen=True)
class VoteRecord:
    """A stored vote with its round's columns, in column order: what a leaderboard needs.

    `prompt`, `reveal` and `speed_seen` are the round's; `replies` holds each column's reply (None
    where the column has none) when they were asked for (`Store.votes(with_replies=True)`), else is empty.
    """

    vote: Vote
    mode: str
    columns: tuple[RoundColumn, ...]
    prompt: str = ""
    reveal: str | None = None
    replies: tuple[ColumnReply | None, ...] = ()
    speed_seen: bool = False  # stopped with its partial texts shown: the voter saw speed whatever the reveal

    @property
    def rated(self) -> bool:
        """Whether the ratings count this vote: blind (names hidden while judging) and not set apart."""
        return self.mode == "blind" and self.vote.unrated_reason is None

    @property
    def backends(self) -> tuple[str, ...]:
        """The backend of each column, in column order."""
        return tuple(column.backend for column in self.columns)

    @property
    def verdicts(self) -> tuple[str | None, ...]:
        """Each column's good/bad judgement (None where none was given), in column order."""
        return tuple(self.vote.judgements.get(column.label) for column in self.columns)

    @property
    def winner_backend(self) -> str | None:
        """The winning column's backend name (None for a tie or both bad)."""
        if self.vote.winner_label is None:
            return None
        return next(column.backend for column in self.columns if column.label == self.vote.winner_label)


def check_vote(vote: Vote, round_: CompareRound) -> None:
    """Raise `VoteRejected` unless `vote` is a consistent verdict on `round_`'s columns."""
    labels = round_.labels
    shown = ", ".join(labels)
    if vote.outcome not in VOTE_OUTCOMES:
        raise VoteRejected(f"Vote outcome {vote.outcome!r} is not one of {', '.join(VOTE_OUTCOMES)}.")
    if vote.outcome == "win":
        if vote.winner_label is None:
            raise VoteRejected("A 'win' vote must name the winning column.")
        if vote.winner_label not in labels:
            raise VoteRejected(
                f"Winner {vote.winner_label!r} is not a column of round {round_.id} (its columns: {shown})."
            )
    elif vote.winner_label is not None:
        raise VoteRejected(f"A {vote.outcome!r} vote has no winner, but column {vote.winner_label!r} was named.")
    for label, judgement in vote.judgements.items():
        if label not in labels:
            raise VoteRejected(f"Judgement for {label!r}, which is not a column of round {round_.id} (its columns: {shown}).")
        if judgement not in JUDGEMENTS:
            raise VoteRejected(f"Judgement {judgement!r} for column {label} is not one of {', '.join(JUDGEMENTS)}.")
    if vote.outcome == "win" and vote.judgements.get(vote.winner_label) == "bad":
        raise VoteRejected(f"Column {vote.winner_label} cannot both win and be judged bad.")
    if vote.outcome == "both_bad" and "good" in vote.judgements.values():
        raise VoteRejected("A 'both_bad' vote cannot judge a column good.")


def names_in_comment(comment: str, identities: Iterable[str]) -> tuple[str, ...]:
    """The identities (backend names, labels, model ids) that `comment` names, case-insensitively,
    in the order given (one per spelling that differs only in case).

    A name counts as a whole word: letters or digits right before or after it make it part of a
    longer word ("tgi" is not named by "stgis"), while punctuation and Chinese text around it do
    not ("vLLM很快" names vLLM).
    """
    lowered = comment.casefold()
    named: dict[str, str] = {}  # casefolded -> as first given, so "vllm" and "vLLM" count once
    for identity in (identity.strip() for identity in identities):
        key = identity.casefold()
        if key and key not in named and re.search(rf"(?<![a-z0-9]){re.escape(key)}(?![a-z0-9])", lowered):
            named[key] = identity
    return tuple(named.values())


@dataclass(frozen=True)
class StoredSweep:
    """A capacity sweep run from the engine panel: on what, by whom, its answer, and its figures."""

    id: str
    created_at: datetime
    user_identifier: str | None
    backend: str
    backend_label: str
    model: str
    mode: str  # concurrency | rate
    hardware: str
    settings: dict[str, Any]
    answer_en: str
    answer_zh: str
    summary: dict[str, Any]
    interrupted: bool = False

    def __post_init__(self) -> None:
        _require_choice("StoredSweep", "mode", self.mode, ("concurrency", "rate"))
        _require_aware("StoredSweep", self.created_at)

    def answer(self, lang: str) -> str:
        return self.answer_zh if lang == "zh" else self.answer_en
