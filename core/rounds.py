"""One prompt to several backends side by side, without Chainlit (the Chainlit side: rounds_view.py).

A round has 2-4 columns labelled A-D. In a compare round the labels follow the
order the person chose; in a blind round they are shuffled, and nothing that
identifies a backend (name, model, figures, its own notes or error wording)
goes into what the browser receives until the person has voted.

`RoundRun` prepares and streams every column - all at once ("concurrent":
every column is prepared, then all requests leave together) or one after
another ("sequential", so backends sharing a CPU or GPU do not slow each other
down; each column is prepared just before it runs, so its connection is fresh
and its engine state is read when it starts, not before the earlier columns
ran; the columns run in a random order, `random_run_sequence`, never A-B-C: an
engine seen busy first, or the column that moves first, says nothing of the
labels) - and hands the whole round to one `render` callback at most once per
tick, so several fast columns cost one element update per tick. A column that
fails, times out or is slow never holds up or breaks the others; Stop ends
every column's request and each keeps its partial text.
"""

from __future__ import annotations

import asyncio
import random
from bisect import bisect_right
from dataclasses import dataclass, field
from typing import Awaitable, Callable, Literal, Mapping, Sequence
from urllib.parse import urlparse

from core.concurrency import run_together
from vocabulary import COLUMN_LABELS as LABELS, LOOPBACK_HOSTS, MAX_COLUMNS, MIN_COLUMNS, REVEALS, RUN_ORDERS
from backends.base import Backend
from backends.errors import BackendError
from core.notices import Notice
from core.replies import Refusal, ReplyPlan, empty_reply_notice
from core.texts import text
from core.figures import final_props, live_props
from core.images import configured_image_origins, remote_images_as_links
from core.streaming import StreamOutcome, Stopped, consume
from core.timing import FINAL_STATES, RequestRecord, TimedStream

TICK_S = 0.06  # one element update per tick for the whole round: the last token shows within ~100 ms

ColumnState = Literal["waiting", "streaming", "completed", "stopped", "error"]
# Prepares one column's reply (core.replies.plan_reply for its backend): its plan, or why it cannot run.
Planner = Callable[["Column"], Awaitable["ReplyPlan | Refusal"]]
# How a person reads an error kind when the backend must stay unnamed (blind, before the vote).
BLIND_ERROR_KEYS = {
    "unavailable": "blind_error_unavailable",
    "timeout": "blind_error_timeout",
    "rejected": "blind_error_rejected",
    "overloaded": "blind_error_overloaded",
    "generation": "blind_error_generation",
}


class RoundSettingsError(ValueError):
    """The backends chosen for a round cannot make one (too few, too many, unknown, twice)."""


@dataclass(frozen=True)
class RoundSettings:
    """What the settings panel chose for compare and blind rounds."""

    backends: tuple[str, ...]
    blind: bool = False
    run_order: str = "auto"
    reveal: str = "finished"

    def check(self, configured: Sequence[str]) -> None:
        names = self.backends
        if not MIN_COLUMNS <= len(names) <= MAX_COLUMNS:
            raise RoundSettingsError(f"choose {MIN_COLUMNS} to {MAX_COLUMNS} backends to compare "
                                     f"({len(names)} chosen)")
        unknown = [name for name in names if name not in configured]
        if unknown:
            raise RoundSettingsError(f"unknown backend(s) {', '.join(unknown)}; configured: {', '.join(configured)}")
        if len(set(names)) != len(names):
            raise RoundSettingsError("a backend was chosen twice; to compare one engine with two set-ups, "
                                     "configure it twice under two names in .env")
        if self.run_order not in RUN_ORDERS:
            raise RoundSettingsError(f"run order {self.run_order!r} is not one of {', '.join(RUN_ORDERS)}")
        if self.reveal not in REVEALS:
            raise RoundSettingsError(f"reveal {self.reveal!r} is not one of {', '.join(REVEALS)}")


def runs_on_this_machine(backend: Backend) -> bool:
    """An in-process engine, or a server on a loopback address: it shares this machine's CPU/GPU."""
    if backend.in_process:
        return True
    return (urlparse(backend.url).hostname or "") in LOOPBACK_HOSTS


def run_order_for(settings: RoundSettings, backends: Sequence[Backend]) -> str:
    """The chosen order; "auto" is sequential when two or more chosen backends share this machine."""
    if settings.run_order != "auto":
        return settings.run_order
    return "sequential" if sum(runs_on_this_machine(b) for b in backends) >= 2 else "concurrent"


def random_run_sequence(columns: int, rng: random.Random | None = None) -> tuple[int, ...]:
    """The order a sequential round runs its columns in (indexes): drawn anew for each round, apart
    from the labels' own shuffle, so that which engine works first tells nothing about the labels."""
    order = list(range(columns))
    (rng or random.SystemRandom()).shuffle(order)
    return tuple(order)


def assign_labels(names: Sequence[str], blind: bool, rng: random.Random | None = None) -> tuple[tuple[str, str], ...]:
    """(label, backend name) per column: in the chosen order, or shuffled for a blind round."""
    order = list(names)
    if blind:
        (rng or random.SystemRandom()).shuffle(order)
    return tuple(zip(LABELS, order))


@dataclass
class Column:
    """One column of a round as it streams."""

    label: str
    backend: str  # configured name
    backend_label: str
    plan: ReplyPlan | None = None
    refusal: Refusal | None = None
    state: ColumnState = "waiting"
    parts: list[str] = field(default_factory=list)
    part_tokens: list[int] = field(default_factory=list)  # output tokens received up to the end of each part
    tokens: int = 0  # output tokens received so far (as the figures count them)
    timed: TimedStream | None = None
    record: RequestRecord | None = None
    error: BackendError | None = None

    @property
    def text(self) -> str:
        return "".join(self.parts)

    @property
    def model(self) -> str:
        return self.plan.model if self.plan else ""

    @property
    def finished(self) -> bool:
        return self.state in FINAL_STATES

    def text_up_to(self, tokens: int) -> str:
        """The text of the first `tokens` output tokens, in whole chunks: a chunk that carries
        several tokens shows once all of them fit."""
        return "".join(self.parts[:bisect_right(self.part_tokens, tokens)])

    def error_text(self, lang: str, *, named: bool) -> str | None:
        """The column's error; unnamed (blind, before the vote) it says only what kind of failure."""
        if self.refusal is not None:
            return self.refusal.reason if named else text("blind_error_unavailable", lang)
        if self.error is not None:
            if named:
                return self.error.describe()
            return text(BLIND_ERROR_KEYS.get(self.error.kind, "blind_error_generation"), lang)
        return None

    def notices(self) -> tuple[Notice, ...]:
        return self.plan.notices if self.plan else ()

    def empty_notice(self) -> Notice | None:
        """Set when the column completed without any text (never shown as a normal answer)."""
        return empty_reply_notice(self.record, self.text) if self.record is not None else None


class RoundRun:
    """Prepares and streams a round's columns and renders the whole round at most once per tick."""

    def __init__(self, columns: Sequence[Column], order: str,
                 render: Callable[[], Awaitable[None]], plan: Planner | None = None, tick_s: float = TICK_S,
                 sequence: Sequence[int] | None = None) -> None:
        """`plan` prepares a column that has neither a plan nor a refusal yet (None: every column
        comes prepared). `sequence`: the order a sequential round runs its columns in, as indexes
        (`random_run_sequence`; None: as given)."""
        self.columns = list(columns)
        self.sequence = tuple(range(len(self.columns))) if sequence is None else tuple(sequence)
        if sorted(self.sequence) != list(range(len(self.columns))):
            raise ValueError(f"run sequence {self.sequence} is not an order of {len(self.columns)} columns")
        self.order = order
        self.render = render
        self.plan = plan
        self.tick_s = tick_s
        self.stopped = False
        self._changed = asyncio.Event()
        self._first_text = asyncio.Event()  # a column's first text: drawn at once, not at the next tick

    async def run(self) -> None:
        """Prepare and stream every column to its end, error or Stop (cancellation), then return.

        A cancelled round (the person's Stop) does not raise: every column's
        request is closed and the partial texts and records stay.
        """
        renderer = asyncio.create_task(self._render_loop())
        worker = asyncio.create_task(self._stream_all())
        try:
            await asyncio.shield(worker)
        except asyncio.CancelledError:
            self.stopped = True
            worker.cancel()
            await asyncio.wait([worker])
        finally:
            renderer.cancel()
            await asyncio.wait([renderer])

    async def _stream_all(self) -> None:
        try:
            if self.order == "sequential":
                for column in (self.columns[index] for index in self.sequence):
                    await self._prepare(column)  # just before it runs
                    await self._stream(column)
            else:
                await run_together(self._prepare(column) for column in self.columns)
                await run_together(self._stream(column) for column in self.columns)
        except asyncio.CancelledError:
            for column in self.columns:
                self._stop_unstarted(column)
            raise

    async def _prepare(self, column: Column) -> None:
        if column.plan is not None or column.refusal is not None or self.plan is None:
            return
        outcome = await self.plan(column)
        if isinstance(outcome, Refusal):
            column.refusal = outcome
        else:
            column.plan = outcome
            column.backend_label = outcome.label

    def _stop_unstarted(self, column: Column) -> None:
        if column.state == "waiting":
            column.state = "stopped"

    async def _stream(self, column: Column) -> None:
        """One column: its errors end only its own stream."""
        if column.refusal is not None or column.plan is None:
            column.state = "error"
            self._changed.set()
            return
        timed = column.plan.open_stream()
        column.timed = timed
        column.state = "streaming"
        self._changed.set()

        def take(chunk) -> None:
            column.tokens = timed.meter.output_tokens
            if chunk.text:
                if not column.parts:
                    self._first_text.set()
                column.parts.append(chunk.text)
                column.part_tokens.append(column.tokens)
                self._changed.set()

        try:
            outcome = await consume(timed, on_chunk=take)
        except Stopped as stopped:
            self._end(column, stopped.outcome)
            raise  # Stop ends the round: the columns after this one do not start
        self._end(column, outcome)

    def _end(self, column: Column, outcome: StreamOutcome) -> None:
        column.record, column.error, column.state = outcome.record, outcome.error, outcome.status
        self._changed.set()

    async def _render_loop(self) -> None:
        # Drawn when something changed, then at most once per tick with what came meanwhile, except a
        # column's first text, which is drawn at once (a class sees it when a bare app would show it).
        # While a column streams it is drawn every tick (its live figures move even without text).
        while True:
            await self._changed.wait()
            self._changed.clear()
            self._first_text.clear()
            await self.render()
            try:
                async with asyncio.timeout(self.tick_s):
                    await self._first_text.wait()
            except TimeoutError:
                pass
            if any(c.state == "streaming" for c in self.columns):
                self._changed.set()


# ---------------------------------------------------------------- what the browser receives


@dataclass
class RevealPace:
    """Blind text with reveal "pace": every column shows the same number of tokens, `tokens`.

    `tokens` follows the slowest column still generating (so a fast engine is never shown ahead
    of a slow one) and never goes back. A column that has finished no longer holds the others
    back; one with fewer tokens shows all of its text. In sequential order only one column
    generates at a time, so the columns that have run are shown at the pace of the one running:
    nothing moves while the first column runs alone (its text would show its own speed with
    nothing to pace it against), and a column that starts behind the pace shows nothing until
    it has caught up. Tokens are each engine's own (exact where the engine reports them).
    """

    tokens: int = 0

    def advance(self, columns: Sequence[Column]) -> int:
        """Move the common count on as far as the columns allow; return it."""
        generating = [column.tokens for column in columns if column.state == "streaming"]
        first_alone = (any(column.state == "waiting" for column in columns)
                       and not any(column.finished and column.parts for column in columns))
        if generating and not first_alone:
            self.tokens = max(self.tokens, min(generating))
        return self.tokens

    def shown(self, columns: Sequence[Column]) -> list[str]:
        """Each column's text as far as the common pace allows."""
        if all(column.finished for column in columns):
            return [column.text for column in columns]
        tokens = self.advance(columns)
        return [column.text_up_to(tokens) if column.finished or column.tokens >= tokens else ""
                for column in columns]


def _revealed_text(columns: Sequence[Column], reveal: str, pace: RevealPace | None) -> list[str]:
    """Blind text before the vote: nothing until every column has finished, or at one common pace."""
    if all(column.finished for column in columns) or reveal == "live":
        return [column.text for column in columns]
    if reveal != "pace":
        return ["" for _ in columns]
    return (pace or RevealPace()).shown(columns)


def round_props(
    *,
    round_id: str,
    columns: Sequence[Column],
    blind: bool,
    run_order: str,
    reveal: str,
    lang: str,
    revealed: bool = False,
    vote: Mapping[str, object] | None = None,
    final: bool = False,
    pace: RevealPace | None = None,
    engine_state: bool = True,
) -> dict:
    """Props for the compare grid (public/elements/Metrics.jsx with kind "compare").

    A blind round before its vote carries only labels, text (as the reveal
    setting allows) and unnamed errors: no backend, model, figures, notes or
    timings. Every column's state is "generating" until all have finished,
    so that which one finished first does not give an engine away. `pace`
    keeps the common count of reveal "pace" from one update of the round to
    the next (without it, each call starts from nothing). Without
    `engine_state` (a blind round of the person waits elsewhere:
    core.disclosure) named columns show no engine state at start and no
    queue position.
    """
    anonymous = blind and not revealed
    texts = _revealed_text(columns, reveal, pace) if anonymous else [column.text for column in columns]
    # Every column's whole text goes out at each refresh: images from elsewhere become links (after
    # the reveal cut, so the cut is the same for every column).
    texts = [remote_images_as_links(shown, configured_image_origins(), lang) for shown in texts]
    all_finished = all(column.finished for column in columns)
    props_columns = []
    for column, shown_text in zip(columns, texts):
        entry: dict[str, object] = {"label": column.label, "text": shown_text}
        if anonymous:
            entry["state"] = ("error" if column.state == "error" else "completed") if all_finished else "generating"
            entry["error"] = column.error_text(lang, named=False) if all_finished else None
            # Without figures: a token count could tell the engines apart before the vote.
            entry["notes"] = [text("empty_reply_blind", lang)] if all_finished and column.empty_notice() else []
        else:
            entry.update(_named_column(column, lang, engine_state=engine_state))
        props_columns.append(entry)
    return {
        "kind": "compare",
        "lang": lang,
        "roundId": round_id,
        "blind": blind,
        "revealed": revealed or not blind,
        "runOrder": run_order,
        "reveal": reveal if blind else None,
        "final": final,
        "vote": dict(vote) if vote else None,
        "columns": props_columns,
    }


def _named_column(column: Column, lang: str, *, engine_state: bool = True) -> dict[str, object]:
    entry: dict[str, object] = {
        "backend": column.backend_label,
        "model": column.model,
        "state": column.state,
        "error": column.error_text(lang, named=True),
        "notes": [notice.render(lang) for notice in (*column.notices(), column.empty_notice()) if notice],
    }
    request = column.plan.request if column.plan else None
    if column.record is not None and column.finished:
        summary = column.plan.engine_summary(shown=engine_state) if column.plan else None
        entry["figures"] = final_props(column.record, lang=lang, request=request, engine_at_start=summary)
    elif column.timed is not None:
        entry["figures"] = live_props(column.timed.live(), backend=column.backend_label, model=column.model,
                                      lang=lang, queue_shown=engine_state)
    return entry
