"""Compare and blind rounds and their votes: the Chainlit side.

The round itself (columns, run order, streaming, what the browser may see)
is `core.rounds`, Chainlit-free; this module keeps per-session state, sends
the one element that shows every column, stores the round, its replies and
its vote, and reveals a blind round once it has been voted on.
"""

from __future__ import annotations

import asyncio
import uuid
from dataclasses import dataclass, field, replace
from typing import Any

import chainlit as cl

from backends.base import ChatMessage, display_label
from core.disclosure import identifying_words
from core.notices import Notice
from core.replies import Refusal, ReplyPlan, plan_reply, stored_reply
from core.texts import text
from core.input import remove_control_characters
from ui.session_view import (
    APP_AUTHOR,
    MetricsElement,
    app_state,
    backend_threads,
    current_user,
    lab,
    lang,
    refresh_backend_list,
    retry_action,
    say,
    session_settings,
)
from core.ratings.ratings import OUTCOMES
from core.rounds import (Column, RevealPace, RoundRun, RoundSettings, RoundSettingsError, assign_labels, round_props,
                         run_order_for)
from store import CompareRound, RoundColumn, SavedLater, StoreError, Vote, names_in_comment
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
    return lab().rounds


async def compare_reply(user_text: str) -> None:
    """One prompt to every chosen backend, side by side (blind: anonymous until voted on)."""
    state, lang_code, settings = app_state(), lang(), session_settings()
    round_settings = RoundSettings(settings.compare_backends, blind=settings.mode == "blind",
                                   run_order=settings.run_order, reveal=settings.reveal)
    try:
        round_settings.check(state.registry.names)
    except RoundSettingsError as error:
        lab().pending = user_text
        await say(text("round_not_possible", lang_code, reason=str(error)), actions=[retry_action(lang_code)])
        return
    threads = backend_threads()
    chat_history = lab().history
    for name in round_settings.backends:
        threads.setdefault(name, list(chat_history))
    assignment = assign_labels(round_settings.backends, round_settings.blind)
    round_id = str(uuid.uuid4())
    statuses = dict(zip(round_settings.backends,
                        await asyncio.gather(*(state.status(name) for name in round_settings.backends))))
    if round_settings.blind:  # before anything about the round leaves: see core.disclosure
        lab().disclosure.hide(round_id, set().union(*(_words(name, statuses[name]) for name in round_settings.backends)))
    columns = [Column(label=label, backend=name, backend_label=_display_label(name, statuses[name]))
               for label, name in assignment]

    async def plan(column: Column) -> ReplyPlan | Refusal:
        prepared = await plan_reply(state, settings.for_backend(column.backend), threads[column.backend], user_text)
        if round_settings.blind and isinstance(prepared, ReplyPlan):
            lab().disclosure.hide(round_id, {prepared.model, prepared.request.model, prepared.label})
        return prepared

    order = run_order_for(round_settings, [state.registry.get(name) for name in round_settings.backends])

    element = MetricsElement(name="Metrics", props={}, display="inline")
    view = RoundView(round_id, columns, round_settings, order, element)
    element.props = view.props(lang_code)
    not_saved = [await _save_round(round_id, user_text, view)]
    message = cl.Message(content="", author=APP_AUTHOR, elements=[element])
    await message.send()

    async def render() -> None:
        element.props = view.props(lang_code)
        await element.update()

    await RoundRun(columns, order, render, plan=plan).run()
    view.final = True
    element.props = view.props(lang_code)
    await element.update()
    recent = _rounds()
    recent[round_id] = view
    for old in list(recent)[:-RECENT_ROUNDS]:
        # Still votable from what the database kept; its element is remembered for the reveal.
        forgotten = recent.pop(old).element
        _round_elements()[old] = (forgotten.id, forgotten.for_id)
    not_saved += await _store_replies(view, user_text)
    not_saved.append(await _keep_revealed_view(view, lang_code))
    await _say_not_saved(not_saved)
    if not round_settings.blind:  # in a blind round, "vLLM unavailable" would name the failed column
        await refresh_backend_list([(column.backend, column.error) for column in columns])
    for column in columns:
        if column.plan is not None and column.text:
            threads[column.backend].extend([ChatMessage("user", user_text), ChatMessage("assistant", column.text)])
    lab().pending = None


def _display_label(name: str, status) -> str:
    """A backend's name where its numbers are shown (a stand-in says so)."""
    backend = app_state().registry.get(name)
    return display_label(backend.label, status.info.stand_in if status.info else None)


def _words(name: str, status) -> set[str]:
    """What would name this backend in a browser (core.disclosure.identifying_words)."""
    backend = app_state().registry.get(name)
    return identifying_words(name=backend.name, label=backend.label, url=backend.url,
                             model=status.info.model_id if status.info else "",
                             display_label=_display_label(name, status))


async def _stored(write) -> Notice | None:
    """Run one of the store's writes; None when it is in the database, else what to tell the person."""
    try:
        await write
    except SavedLater as later:
        return Notice("saved_later", {"waiting": later.waiting})
    except StoreError as error:
        return Notice("not_saved", {"problem": str(error)})
    return None


async def _save_round(round_id: str, user_text: str, view: RoundView) -> Notice | None:
    store = await app_state().storage()
    if store is None:
        return None  # the chat said at its start that nothing is kept
    compare_round = CompareRound(
        id=round_id, thread_id=cl.context.session.thread_id, user_identifier=current_user(),
        created_at=utc_now(), prompt=user_text, mode="blind" if view.settings.blind else "compare",
        run_order=view.run_order,
        columns=tuple(RoundColumn(label=c.label, backend=c.backend) for c in view.columns),
        reveal=view.settings.reveal if view.settings.blind else None,
    )
    return await _stored(store.save_round(compare_round))


async def _store_replies(view: RoundView, user_text: str) -> list[Notice]:
    state = app_state()
    store = await state.storage()
    notices = []
    for column in view.columns:
        if column.plan is None or column.record is None:
            continue
        reply = stored_reply(column.plan, column.record, user_text=user_text, reply_text=column.text,
                             mode="blind" if view.settings.blind else "compare",
                             thread_id=cl.context.session.thread_id, user_identifier=current_user(),
                             round_id=view.round_id, column_label=column.label)
        notice = await state.save_reply(reply)
        notices.append(notice)
        if store is not None and (notice is None or notice.key == "saved_later"):
            # Behind the reply in the outbox when that waits, so the two are written in order.
            notices.append(await _stored(store.set_round_reply(view.round_id, column.label, reply.id)))
    return [notice for notice in notices if notice is not None]


async def _keep_revealed_view(view: RoundView, lang_code: str) -> Notice | None:
    """What the round shows once voted on, kept in the database (never sent before the vote), so
    that a vote cast after the chat was reopened or the app restarted can still reveal it."""
    store = await app_state().storage()
    if store is None:
        return None
    return await _stored(store.set_revealed_view(view.round_id, view.props(lang_code, revealed=True)))


async def _say_not_saved(notices: list[Notice | None]) -> None:
    """One line about the round's rows that are not in the database (the latest, most waiting)."""
    shown = [notice for notice in notices if notice is not None]
    if shown:
        await say(shown[-1].render(lang()))


def _round_elements() -> dict[str, tuple[str, str | None]]:
    """Round id -> (element id, message id) for rounds of this chat not kept in memory."""
    return lab().round_elements


async def resume(thread: dict) -> None:
    """A reopened chat: note which element shows each of its rounds, so a vote can update it, and
    keep hiding the backends of its blind rounds that still wait for their vote (core.disclosure)."""
    elements = _round_elements()
    for element in thread.get("elements") or []:
        props = element.get("props")
        if isinstance(props, dict) and props.get("kind") == "compare" and props.get("roundId"):
            elements[props["roundId"]] = (element["id"], element.get("forId"))
    await restore_hidden_rounds(thread.get("id"))


async def restore_hidden_rounds(thread_id: str | None) -> None:
    """Hide the backends of this chat's blind rounds that wait for a vote, read from the database.
    When they cannot be read (the database is unavailable, or rows of the chat still wait in the
    outbox) the rule is unsure and everything it guards waits; commands call this again."""
    disclosure = lab().disclosure
    store = await app_state().storage()
    if store is None or not thread_id:
        return
    try:
        if store.outbox is not None and store.outbox.waiting:
            raise StoreError(f"{store.outbox.waiting} row(s) still wait to be written")
        waiting = await store.unvoted_blind_rounds(thread_id)
        replies = await store.replies_for_thread(thread_id) if waiting else []
    except StoreError:
        disclosure.unsure = True
        return
    state = app_state()
    for round_ in waiting:
        words: set[str] = set()
        for column in round_.columns:
            if column.backend in state.registry.names:
                words |= _words(column.backend, await state.status(column.backend))
            words.add(column.backend)
        words |= {word for reply in replies if reply.round_id == round_.id
                  for word in (reply.model, reply.backend_label, reply.backend)}
        disclosure.hide(round_.id, words)
    disclosure.unsure = False


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
    lab().disclosure.reveal(ballot.round_id)
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
    lab().disclosure.reveal(ballot.round_id)
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
