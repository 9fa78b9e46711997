"""A compare or blind round, end to end, without Chainlit: plan -> stream -> store -> notices ->
vote -> reveal.

`play` runs one prompt on 2-4 backends side by side (core.rounds: columns, run order - a
sequential one in a random order -, the one stream loop per column, what the browser may see),
hides a blind round's backends from every view of its person until its vote (core.disclosure: in
every tab of this process at once, on other replicas once the round is in the database), keeps
the round, its replies and its revealed view in the database (each write that has to wait is said
once), and continues each backend's own thread of the conversation. A round whose backends are
those of a blind round of the person still waiting for its vote waits (`give_up_rounds`: the
person insists, and that round is marked not blind). A blind round stopped before its end shows
every column's partial text at once: its vote is marked as one that saw speed. `cast_vote`
checks a vote, stores it and reveals the round. The UI (ui/rounds_view.py) implements
`RoundDisplay`: how to show a round as it streams, a notice, a round that cannot start.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from dataclasses import dataclass, field, replace
from typing import Any, Awaitable, Callable, Mapping, Protocol, Sequence

from backends.base import ChatMessage, display_label
from backends.errors import BackendError
from backends.registry import BackendStatus
from core.app_state import AppState
from core.disclosure import Wait
from core.input import remove_control_characters
from core.notices import Notice
from core.replies import Refusal, ReplyPlan, plan_reply, stored_reply
from core.rounds import (Column, RevealPace, RoundRun, RoundSettings, RoundSettingsError, assign_labels,
                         random_run_sequence, round_props, run_order_for)
from core.session_state import LabSession
from store import CompareRound, RoundColumn, SavedLater, Store, StoreError, Vote, names_in_comment
from store.records import UNRATED_CLOSED_BY_TEACHER, UNRATED_COMMENT_NAMES_BACKEND, UNRATED_SHOWN_BEFORE_VOTE, utc_now
from vocabulary import VOTE_OUTCOMES

log = logging.getLogger(__name__)

RECENT_ROUNDS = 20  # rounds per session kept in memory; older ones are voted on from the database
MAX_COMMENT_CHARS = 2000


@dataclass(eq=False)
class Round:
    """A round of this session as it streams and after: its columns and how it is shown."""

    round_id: str
    columns: list[Column]
    settings: RoundSettings
    run_order: str
    final: bool = False
    vote: dict | None = None
    pace: RevealPace = field(default_factory=RevealPace)  # blind reveal "pace": the common token count
    speed_seen: bool = False  # stopped with its partial texts shown at once (see `play`)

    def props(self, lang: str, *, revealed: bool | None = None, engine_state: bool = True) -> dict:
        """What the browser may receive of it now (core.rounds.round_props: anonymous until voted;
        without `engine_state`, no engine state at start nor queue position: core.disclosure)."""
        return round_props(round_id=self.round_id, columns=self.columns, blind=self.settings.blind,
                           run_order=self.run_order, reveal=self.settings.reveal, lang=lang,
                           revealed=self.vote is not None if revealed is None else revealed,
                           vote=self.vote, final=self.final, pace=self.pace, engine_state=engine_state)


class RoundDisplay(Protocol):
    """What a round needs from the screen it is shown on (ui/rounds_view.py in the app)."""

    async def not_possible(self, reason: str) -> None:
        """The chosen backends cannot make a round: say why; the message waits for Retry."""

    async def waits(self, wait: Wait) -> None:
        """A blind round of the person with these backends waits for its vote: say so, offer to vote
        first or to send anyway (`give_up_rounds`); the message waits."""

    async def show(self, round_: Round) -> Callable[[], Awaitable[None]]:
        """Show the round (its props now); return how to draw it again (called once per tick)."""

    async def notice(self, notice: Notice) -> None:
        """Tell the person something (rows not saved)."""

    async def backends_checked(self, failed: Sequence[tuple[str, BackendError | None]]) -> None:
        """After a compare round: backends whose column failed may be down; show the list as it is."""


# ---------------------------------------------------------------- a round, end to end


async def play(state: AppState, session: LabSession, user_text: str, display: RoundDisplay, *,
               thread_id: str | None, user: str | None, lang: str) -> Round | None:
    """One prompt to every chosen backend side by side (blind: anonymous until voted on)."""
    settings = session.settings
    round_settings = RoundSettings(settings.compare_backends, blind=settings.mode == "blind",
                                   run_order=settings.run_order, reveal=settings.reveal)
    try:
        round_settings.check(state.registry.names)
    except RoundSettingsError as error:
        session.pending = user_text
        await display.not_possible(str(error))
        return None
    names = round_settings.backends
    rule = await state.rule(session.person)  # the person's, on every replica (it is session.disclosure)
    if (wait := rule.reply_wait(names)) is not None:
        session.pending = user_text
        await display.waits(wait)
        return None
    for name in names:
        session.threads.setdefault(name, list(session.history))
    round_id = str(uuid.uuid4())
    statuses = dict(zip(names, await asyncio.gather(*(state.status(name) for name in names))))
    if round_settings.blind:  # before anything about the round leaves, in every tab: see core.disclosure
        rule.hide(round_id, set().union(*(state.backend_words(name, statuses[name]) for name in names)), names)
    columns = [Column(label=label, backend=name, backend_label=shown_label(state, name, statuses[name]))
               for label, name in assign_labels(names, round_settings.blind)]

    async def plan(column: Column) -> ReplyPlan | Refusal:
        """A column's reply, prepared when it runs (sequential: just before; concurrent: all first)."""
        prepared = await plan_reply(state, settings.for_backend(column.backend), session.threads[column.backend],
                                    user_text, rule)
        if round_settings.blind and isinstance(prepared, ReplyPlan):
            rule.hide(round_id, {prepared.model, prepared.request.model, prepared.label})
        return prepared

    round_ = Round(round_id, columns, round_settings,
                   run_order_for(round_settings, [state.registry.get(name) for name in names]))
    store = await state.storage()
    stored_round = CompareRound(
        id=round_id, thread_id=thread_id, user_identifier=user, created_at=utc_now(), prompt=user_text,
        mode="blind" if round_settings.blind else "compare", run_order=round_.run_order,
        columns=tuple(RoundColumn(label=c.label, backend=c.backend) for c in columns),
        reveal=round_settings.reveal if round_settings.blind else None, person=session.person or None)
    # Stored while the round streams, not before its requests leave (a hung database held the round
    # for its timeouts); its replies are stored after it, in order. Other replicas learn of a blind
    # round when it is written (core.disclosure); this process's views know it already.
    saving = asyncio.create_task(_stored(store, lambda s: s.save_round(stored_round)))
    sequence = random_run_sequence(len(columns)) if round_.run_order == "sequential" else None
    try:
        redraw = await display.show(round_)
        run = RoundRun(columns, round_.run_order, redraw, plan=plan, sequence=sequence)
        await run.run()
        round_.final = True
        await redraw()
    finally:
        not_saved = [await asyncio.shield(saving)]
    if store is not None and not_saved[0] is None:
        rule.stored(round_id)
    _remember(session, round_)
    if round_settings.blind and round_settings.reveal != "live" and run.stopped and any(c.text for c in columns):
        # Stop showed every column's partial text at once: their lengths say which column was faster,
        # so this vote saw speed, whatever the reveal (core.ratings counts it so).
        round_.speed_seen = True
        not_saved.append(await _stored(store, lambda s: s.set_speed_seen(round_id)))
        await display.notice(Notice("round_speed_seen"))
    not_saved += await _store_replies(state, store, round_, user_text, thread_id, user)
    # What the round shows once voted on, kept in the database (never sent before the vote), so that
    # a vote cast after the chat was reopened or the app restarted can still reveal it.
    # Shown only after the vote: with the engines' state at each column's start, whatever the rule now.
    revealed_view = round_.props(lang, revealed=True, engine_state=True)
    not_saved.append(await _stored(store, lambda s: s.set_revealed_view(round_id, revealed_view)))
    shown = [notice for notice in not_saved if notice is not None]
    if shown:
        await display.notice(shown[-1])  # one line: the latest says how many rows wait
    if not round_settings.blind:  # in a blind round, "vLLM unavailable" would name the failed column
        await display.backends_checked([(column.backend, column.error) for column in columns])
    for column in columns:
        if column.plan is not None and column.text:
            session.threads[column.backend].extend([ChatMessage("user", user_text),
                                                    ChatMessage("assistant", column.text)])
    session.pending = None
    return round_


def _remember(session: LabSession, round_: Round) -> None:
    """The session's newest rounds stay in memory; older ones are voted on from the database."""
    session.rounds[round_.round_id] = round_
    for old in list(session.rounds)[:-RECENT_ROUNDS]:
        session.rounds.pop(old)


def shown_label(state: AppState, name: str, status: BackendStatus) -> str:
    """A backend's name where its numbers are shown (a stand-in says so)."""
    return display_label(state.registry.get(name).label, status.info.stand_in if status.info else None)


async def _stored(store: Store | None, write: Callable[[Store], Awaitable[None]]) -> Notice | None:
    """One of the store's writes; None when it is in the database (or there is none: the chat said so
    at its start), else what to tell the person."""
    if store is None:
        return None
    try:
        await write(store)
    except SavedLater as later:
        return Notice("saved_later", {"waiting": later.waiting})
    except StoreError as error:
        return Notice("not_saved", {"problem": str(error)})
    return None


async def _store_replies(state: AppState, store: Store | None, round_: Round, user_text: str,
                         thread_id: str | None, user: str | None) -> list[Notice]:
    notices: list[Notice | None] = []
    for column in round_.columns:
        if column.plan is None or column.record is None:
            continue
        reply = stored_reply(column.plan, column.record, user_text=user_text, reply_text=column.text,
                             mode="blind" if round_.settings.blind else "compare", thread_id=thread_id,
                             user_identifier=user, round_id=round_.round_id, column_label=column.label)
        notice = await state.save_reply(reply)
        notices.append(notice)
        if notice is None or notice.key == "saved_later":
            # Behind the reply in the outbox when that waits, so the two are written in order.
            notices.append(await _stored(store, lambda s, label=column.label, reply_id=reply.id:
                                         s.set_round_reply(round_.round_id, label, reply_id)))
    return [notice for notice in notices if notice is not None]


# ---------------------------------------------------------------- the rule, given up


async def give_up_rounds(state: AppState, session: LabSession, backends: Sequence[str] | None) -> Notice | None:
    """The person insists on a reply from `backends` (None: on a view of every backend) while blind
    rounds of theirs with those backends wait for a vote: those rounds are held no more, on every
    replica, and a vote on them is kept but not rated (store.records.UNRATED_SHOWN_BEFORE_VOTE).
    Returns what to tell the person (None: nothing was waiting)."""
    rule = await state.rule(session.person)
    if rule.unsure:
        return Notice("blind_give_up_unsure")
    ids = rule.give_up(backends)
    if not ids:
        return None
    store = await state.storage()
    problem = await _stored(store, lambda s: s.give_up_blind_rounds(session.person, ids, UNRATED_SHOWN_BEFORE_VOTE))
    given_up = Notice("blind_given_up", {"rounds": len(ids)})
    return given_up if problem is None or problem.key == "saved_later" else problem


async def close_class_rounds(state: AppState, user: str | None) -> Notice:
    """A teacher (with login off: the one local user) closes every blind round of the deployment that
    waits for its vote, e.g. after a rehearsal: it holds nobody any more, its person's views and
    replies go on, and a vote on it is kept but not rated (store.records.UNRATED_CLOSED_BY_TEACHER)."""
    if not state.auth.is_teacher(user):
        return Notice("close_rounds_teachers_only")
    store = await state.storage()
    if store is None:
        return Notice("close_rounds_no_store")
    try:
        closed = await store.close_open_blind_rounds()
    except StoreError as error:
        log.warning("closing the open blind rounds failed: %s", error)
        return Notice("close_rounds_failed")
    state.disclosures.closed(closed)
    rounds = sum(len(ids) for ids in closed.values())
    return Notice("rounds_closed", {"rounds": rounds, "people": len(closed)}) if rounds else Notice("no_rounds_open")


# ---------------------------------------------------------------- votes


@dataclass(frozen=True)
class VoteResult:
    """A vote's answer: recorded (with the revealed round's props) or refused, and the words for it."""

    ok: bool
    message: str  # in the person's language
    props: dict | None = None  # the round as it shows now (revealed), to draw in its element
    in_memory: bool = False  # the round is one of this session's (else its element is drawn from the database)


def parse_vote(payload: Any, user: str | None) -> Vote:
    """A vote action's payload as a Vote; anything the element cannot send is refused (ValueError)."""
    if not isinstance(payload, dict):
        raise ValueError("the vote is not an object")
    round_id, outcome = payload.get("round_id"), payload.get("outcome")
    winner, judgements = payload.get("winner"), payload.get("judgements") or {}
    comment = payload.get("comment") or ""
    # A round id is a uuid4; anything long or with control characters names no round (PostgreSQL
    # would refuse NUL in the lookup with a driver error, not an answer).
    if not isinstance(round_id, str) or not round_id or len(round_id) > 64 or remove_control_characters(round_id)[1]:
        raise ValueError("the vote names no round")
    if outcome not in VOTE_OUTCOMES:
        raise ValueError(f"outcome {str(outcome)[:40]!r} is not one of {', '.join(VOTE_OUTCOMES)}")
    if winner is not None and not isinstance(winner, str):
        raise ValueError("the winner must be a column label")
    if not isinstance(judgements, dict) or not all(isinstance(k, str) and isinstance(v, str)
                                                   for k, v in judgements.items()):
        raise ValueError("judgements must map column labels to good or bad")
    if not isinstance(comment, str) or len(comment) > MAX_COMMENT_CHARS:
        raise ValueError(f"the comment must be text of at most {MAX_COMMENT_CHARS} characters")
    return Vote(round_id=round_id, outcome=outcome, winner_label=winner, judgements=dict(judgements),
                comment=remove_control_characters(comment)[0].strip(), user_identifier=user)


async def cast_vote(state: AppState, session: LabSession, payload: Any, *, thread_id: str | None,
                    user: str | None, lang: str) -> VoteResult:
    """Cast the vote on a round of this chat (in memory, or kept in the database from before the
    chat was reopened or the app restarted), then reveal it."""
    def refused(reason: str | Notice) -> VoteResult:
        shown = reason.render(lang) if isinstance(reason, Notice) else reason
        return VoteResult(False, Notice("vote_refused", {"reason": shown}).render(lang))

    try:
        ballot = parse_vote(payload, user)
    except ValueError as error:
        return refused(str(error))
    store = await state.storage()
    if store is None:
        return refused(Notice("storage_unavailable", {"problem": state.storage_problem}))
    live = session.rounds.get(ballot.round_id)
    if live is not None:
        if not live.final:
            return refused(Notice("vote_too_early"))
        names = [column.backend for column in live.columns]
        shown = [part for column in live.columns for part in (column.backend_label, column.model)]
        blind = live.settings.blind
    else:
        stored = await store.get_round(ballot.round_id)
        if stored is None:
            return refused(Notice("vote_no_round"))
        if stored.thread_id is None or stored.thread_id != thread_id:
            return refused(Notice("vote_other_chat"))
        revealed_view = await store.revealed_view(ballot.round_id)
        if revealed_view is None:
            return refused(Notice("vote_round_unfinished"))
        names = [column.backend for column in stored.columns]
        shown = [str(column.get(key) or "") for column in revealed_view.get("columns") or []
                 if isinstance(column, dict) for key in ("backend", "model")]
        blind = stored.mode == "blind"
    named: tuple[str, ...] = ()
    if blind:
        ballot, named = _set_apart_if_named(state, ballot, names, shown)
    try:
        await store.cast_vote(ballot, votes_per_day=state.auth.vote_cap)
    except StoreError as error:
        return refused(str(error))
    shown_before = await _given_up(store, ballot.round_id) if blind and not named else None
    vote = {"outcome": ballot.outcome, "winner": ballot.winner_label, "judgements": ballot.judgements}
    session.disclosure.reveal(ballot.round_id)
    if live is not None:
        live.vote = vote
        props = live.props(lang)
    else:
        props = {**revealed_view, "revealed": True, "final": True, "vote": vote}
    return VoteResult(True, _recorded(props, named, lang, shown_before=shown_before), props, in_memory=live is not None)


async def _given_up(store: Store, round_id: str) -> str | None:
    """Why the round stopped being blind before its vote (its person gave it up, or a teacher closed
    it: the store then kept the vote unrated), or None."""
    try:
        stored = await store.get_round(round_id)
    except StoreError:
        return None  # the vote is kept as the store decided; only this message cannot say it
    return stored.not_blind_reason if stored is not None else None


def _set_apart_if_named(state: AppState, ballot: Vote, names: list[str],
                        shown: list[str]) -> tuple[Vote, tuple[str, ...]]:
    """A blind round's ballot, marked "kept but not rated" when its comment names one of the
    round's backends (configured name, label or model id), with the names it gave."""
    labels = [state.registry.get(name).label for name in names if name in state.registry.names]
    named = names_in_comment(ballot.comment, [*names, *labels, *shown])
    if not named:
        return ballot, ()
    return replace(ballot, unrated_reason=UNRATED_COMMENT_NAMES_BACKEND), named


def _recorded(props: Mapping[str, Any], named: tuple[str, ...], lang: str, *, shown_before: str | None = None) -> str:
    """Name every column of the revealed round, and say so when the vote is kept but not rated
    because its comment named a backend, or its person chose to see what could name them first."""
    names = ", ".join(f"**{c['label']}** = {c.get('backend') or '?'}" + (f" (`{c['model']}`)" if c.get("model") else "")
                      for c in props.get("columns") or [])
    message = Notice("vote_recorded", {"names": names}).render(lang)
    if named:
        message += " " + Notice("vote_not_rated", {"names": ", ".join(named)}).render(lang)
    elif shown_before == UNRATED_CLOSED_BY_TEACHER:
        message += " " + Notice("vote_not_rated_closed").render(lang)
    elif shown_before:
        message += " " + Notice("vote_not_rated_shown").render(lang)
    return message
