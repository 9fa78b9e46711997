"""Compare and blind rounds and their votes: the Chainlit side.

The round itself (columns, run order, streaming, what the browser may see)
is `chat.rounds`, Chainlit-free; this module keeps per-session state, sends
the one element that shows every column, stores the round, its replies and
its vote, and reveals a blind round once it has been voted on.
"""

from __future__ import annotations

import asyncio
import uuid
from dataclasses import dataclass, field, replace
from typing import Any

import chainlit as cl

from backends.base import ChatMessage
from chat.flow import Refusal, ReplyPlan, plan_reply, stored_reply
from chat.i18n import text
from chat.input import remove_control_characters
from chat.session import (
    APP_AUTHOR,
    MetricsElement,
    app_state,
    backend_threads,
    current_user,
    lang,
    refresh_backend_list,
    say,
    session_dict,
    session_settings,
)
from compare.ratings import OUTCOMES
from chat.rounds import (Column, RevealPace, RoundRun, RoundSettings, RoundSettingsError, assign_labels, round_props,
                         run_order_for)
from store import CompareRound, RoundColumn, StoreError, Vote, names_in_comment
from store.records import UNRATED_COMMENT_NAMES_BACKEND, utc_now

RECENT_ROUNDS = 20  # rounds per session whose element a vote can still reveal
MAX_COMMENT_CHARS = 2000


@dataclass
class RoundView:
    """A round of this session, kept so that its vote can update (and reveal) its element."""

    round_id: str
    columns: list[Column]
    settings: RoundSettings
    run_order: str
    element: MetricsElement
    final: bool = False
    vote: dict | None = None
    pace: RevealPace = field(default_factory=RevealPace)  # blind reveal "pace": the common token count

    def props(self, lang_code: str, *, revealed: bool | None = None) -> dict:
        return round_props(round_id=self.round_id, columns=self.columns, blind=self.settings.blind,
                           run_order=self.run_order, reveal=self.settings.reveal, lang=lang_code,
                           revealed=self.vote is not None if revealed is None else revealed,
                           vote=self.vote, final=self.final, pace=self.pace)


def _rounds() -> dict[str, RoundView]:
    return session_dict("rounds")


async def compare_reply(user_text: str) -> None:
    """One prompt to every chosen backend, side by side (blind: anonymous until voted on)."""
    state, lang_code, settings = app_state(), lang(), session_settings()
    round_settings = RoundSettings(settings.compare_backends, blind=settings.mode == "blind",
                                   run_order=settings.run_order, reveal=settings.reveal)
    try:
        round_settings.check(state.registry.names)
    except RoundSettingsError as error:
        cl.user_session.set("pending", user_text)
        await say(text("round_not_possible", lang_code, reason=str(error)))
        return
    threads = backend_threads()
    chat_history = cl.user_session.get("history")
    for name in round_settings.backends:
        threads.setdefault(name, list(chat_history))
    assignment = assign_labels(round_settings.backends, round_settings.blind)
    plans = await asyncio.gather(*(
        plan_reply(state, settings.for_backend(name), threads[name], user_text) for _, name in assignment
    ))
    columns = []
    for (label, name), plan in zip(assignment, plans):
        backend = state.registry.get(name)
        column = Column(label=label, backend=name,
                        backend_label=plan.label if isinstance(plan, ReplyPlan) else backend.label)
        if isinstance(plan, Refusal):
            column.refusal = plan
        else:
            column.plan = plan
        columns.append(column)
    order = run_order_for(round_settings, [state.registry.get(name) for name in round_settings.backends])

    round_id = str(uuid.uuid4())
    element = MetricsElement(name="Metrics", props={}, display="inline")
    view = RoundView(round_id, columns, round_settings, order, element)
    element.props = view.props(lang_code)
    await _save_round(round_id, user_text, view)
    message = cl.Message(content="", author=APP_AUTHOR, elements=[element])
    await message.send()

    async def render() -> None:
        element.props = view.props(lang_code)
        await element.update()

    await RoundRun(columns, order, render).run()
    view.final = True
    element.props = view.props(lang_code)
    await element.update()
    recent = _rounds()
    recent[round_id] = view
    for old in list(recent)[:-RECENT_ROUNDS]:
        # Still votable from what the database kept; its element is remembered for the reveal.
        forgotten = recent.pop(old).element
        _round_elements()[old] = (forgotten.id, forgotten.for_id)
    await _store_replies(view, user_text)
    await _keep_revealed_view(view, lang_code)
    if not round_settings.blind:  # in a blind round, "vLLM unavailable" would name the failed column
        await refresh_backend_list([(column.backend, column.error) for column in columns])
    for column in columns:
        if column.plan is not None and column.text:
            threads[column.backend].extend([ChatMessage("user", user_text), ChatMessage("assistant", column.text)])
    cl.user_session.set("pending", None)


async def _save_round(round_id: str, user_text: str, view: RoundView) -> None:
    store = await app_state().storage()
    if store is None:
        return
    compare_round = CompareRound(
        id=round_id, thread_id=cl.context.session.thread_id, user_identifier=current_user(),
        created_at=utc_now(), prompt=user_text, mode="blind" if view.settings.blind else "compare",
        run_order=view.run_order,
        columns=tuple(RoundColumn(label=c.label, backend=c.backend) for c in view.columns),
        reveal=view.settings.reveal if view.settings.blind else None,
    )
    try:
        await store.save_round(compare_round)
    except StoreError as error:
        await say(text("storage_failed", lang(), problem=str(error)))


async def _store_replies(view: RoundView, user_text: str) -> None:
    state = app_state()
    store = await state.storage()
    for column in view.columns:
        if column.plan is None or column.record is None:
            continue
        reply = stored_reply(column.plan, column.record, user_text=user_text, reply_text=column.text,
                             mode="blind" if view.settings.blind else "compare",
                             thread_id=cl.context.session.thread_id, user_identifier=current_user(),
                             round_id=view.round_id, column_label=column.label)
        if await state.save_reply(reply) and store is not None:
            try:
                await store.set_round_reply(view.round_id, column.label, reply.id)
            except StoreError as error:
                await say(text("storage_failed", lang(), problem=str(error)))


async def _keep_revealed_view(view: RoundView, lang_code: str) -> None:
    """What the round shows once voted on, kept in the database (never sent before the vote), so
    that a vote cast after the chat was reopened or the app restarted can still reveal it."""
    store = await app_state().storage()
    if store is None:
        return
    try:
        await store.set_revealed_view(view.round_id, view.props(lang_code, revealed=True))
    except StoreError as error:
        await say(text("storage_failed", lang(), problem=str(error)))


def _round_elements() -> dict[str, tuple[str, str | None]]:
    """Round id -> (element id, message id) for rounds of this chat not kept in memory."""
    return session_dict("round_elements")


async def resume(thread: dict) -> None:
    """A reopened chat: note which element shows each of its rounds, so a vote can update it."""
    elements = _round_elements()
    for element in thread.get("elements") or []:
        props = element.get("props")
        if isinstance(props, dict) and props.get("kind") == "compare" and props.get("roundId"):
            elements[props["roundId"]] = (element["id"], element.get("forId"))


def _parse_vote(payload: Any) -> Vote:
    """A vote action's payload as a Vote; anything the element cannot send is refused."""
    if not isinstance(payload, dict):
        raise ValueError("the vote is not an object")
    round_id, outcome = payload.get("round_id"), payload.get("outcome")
    winner, judgements = payload.get("winner"), payload.get("judgements") or {}
    comment = payload.get("comment") or ""
    # A round id is a uuid4; anything long or with control characters names no round (PostgreSQL
    # would refuse NUL in the lookup with a driver error, not an answer).
    if not isinstance(round_id, str) or not round_id or len(round_id) > 64 or remove_control_characters(round_id)[1]:
        raise ValueError("the vote names no round")
    if outcome not in OUTCOMES:
        raise ValueError(f"outcome {str(outcome)[:40]!r} is not one of {', '.join(OUTCOMES)}")
    if winner is not None and not isinstance(winner, str):
        raise ValueError("the winner must be a column label")
    if not isinstance(judgements, dict) or not all(isinstance(k, str) and isinstance(v, str)
                                                   for k, v in judgements.items()):
        raise ValueError("judgements must map column labels to good or bad")
    if not isinstance(comment, str) or len(comment) > MAX_COMMENT_CHARS:
        raise ValueError(f"the comment must be text of at most {MAX_COMMENT_CHARS} characters")
    return Vote(round_id=round_id, outcome=outcome, winner_label=winner, judgements=dict(judgements),
                comment=remove_control_characters(comment)[0].strip(), user_identifier=current_user())


async def vote(payload: Any) -> dict:
    """Cast the vote on a round of this chat, then reveal it. Returns {"ok", "message"} to the element."""
    lang_code = lang()
    try:
        ballot = _parse_vote(payload)
    except ValueError as error:
        return await _vote_refused(str(error))
    view = _rounds().get(ballot.round_id)
    store = await app_state().storage()
    if store is None:
        return await _vote_refused(text("storage_unavailable", lang_code, problem=app_state().storage_problem))
    if view is None:
        return await _vote_on_stored_round(store, ballot, lang_code)
    if not view.final:
        return await _vote_refused(text("vote_too_early", lang_code))
    if view.settings.blind:
        ballot, named = _set_apart_if_named(ballot, [c.backend for c in view.columns],
                                            [part for c in view.columns for part in (c.backend_label, c.model)])
    else:
        named = ()
    try:
        await store.cast_vote(ballot, votes_per_day=app_state().auth.vote_cap)
    except StoreError as error:
        return await _vote_refused(str(error))
    view.vote = _vote_shown(ballot)
    view.element.props = view.props(lang_code)
    await view.element.update()
    return await _vote_recorded(view.element.props, lang_code, named)


async def _vote_on_stored_round(store, ballot: Vote, lang_code: str) -> dict:
    """A round of this chat from before it was reopened (or before the app restarted): its vote
    reveals what the database kept of it, in the element that shows it."""
    stored = await store.get_round(ballot.round_id)
    if stored is None:
        return await _vote_refused(text("vote_no_round", lang_code))
    if stored.thread_id is None or stored.thread_id != cl.context.session.thread_id:
        return await _vote_refused(text("vote_other_chat", lang_code))
    revealed = await store.revealed_view(ballot.round_id)
    if revealed is None:
        return await _vote_refused(text("vote_round_unfinished", lang_code))
    named: tuple[str, ...] = ()
    if stored.mode == "blind":
        shown = [column for column in revealed.get("columns") or [] if isinstance(column, dict)]
        ballot, named = _set_apart_if_named(ballot, [column.backend for column in stored.columns],
                                            [str(c.get(key) or "") for c in shown for key in ("backend", "model")])
    try:
        await store.cast_vote(ballot, votes_per_day=app_state().auth.vote_cap)
    except StoreError as error:
        return await _vote_refused(str(error))
    props = {**revealed, "revealed": True, "final": True, "vote": _vote_shown(ballot)}
    element_id, for_id = _round_elements().get(ballot.round_id, (None, None))
    if element_id and for_id:
        element = MetricsElement(id=element_id, name="Metrics", props=props, display="inline")
        element.for_id = for_id
        await element.update()
    else:  # its element was never kept: show the revealed round anew
        await cl.Message(content="", author=APP_AUTHOR,
                         elements=[MetricsElement(name="Metrics", props=props, display="inline")]).send()
    return await _vote_recorded(props, lang_code, named)


def _set_apart_if_named(ballot: Vote, names: list[str], shown: list[str]) -> tuple[Vote, tuple[str, ...]]:
    """A blind round's ballot, marked "kept but not rated" when its comment names one of the
    round's backends (configured name, label or model id), with the names it gave."""
    registry = app_state().registry
    labels = [registry.get(name).label for name in names if name in registry.names]
    named = names_in_comment(ballot.comment, [*names, *labels, *shown])
    if not named:
        return ballot, ()
    return replace(ballot, unrated_reason=UNRATED_COMMENT_NAMES_BACKEND), named


def _vote_shown(ballot: Vote) -> dict:
    return {"outcome": ballot.outcome, "winner": ballot.winner_label, "judgements": ballot.judgements}


async def _vote_recorded(props: dict, lang_code: str, named: tuple[str, ...] = ()) -> dict:
    """Name every column of the revealed round (props as round_props made them), and say so when
    the vote is kept but not rated because its comment named a backend."""
    names = ", ".join(f"**{c['label']}** = {c.get('backend') or '?'}" + (f" (`{c['model']}`)" if c.get("model") else "")
                      for c in props.get("columns") or [])
    message = text("vote_recorded", lang_code, names=names)
    if named:
        message += " " + text("vote_not_rated", lang_code, names=", ".join(named))
    await say(message)
    return {"ok": True, "message": message}


async def _vote_refused(reason: str) -> dict:
    message = text("vote_refused", lang(), reason=reason)
    await say(message)
    return {"ok": False, "message": message}
