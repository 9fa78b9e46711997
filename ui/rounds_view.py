"""Compare and blind rounds and their votes in Chainlit: one element shows every column.

What a round does (columns, run order, streaming, storing, what the browser may see, votes,
the reveal) is core.round_flow and core.rounds, without Chainlit; this module draws a round
as one custom element refreshed once per tick, says what the flow says, and updates a round's
element when its vote reveals it.
"""

from __future__ import annotations

from typing import Any

import chainlit as cl

from core.disclosure import Wait
from core.notices import Notice
from core.round_flow import Round, cast_vote, close_class_rounds as close_rounds, play
from core.texts import text
from ui.session_view import (APP_AUTHOR, MetricsElement, app_state, current_rule, current_user, lab, lang,
                             refresh_backend_list, retry_action, say, show_reply_wait)


class RoundElement:
    """How a round is shown in Chainlit (core.round_flow.RoundDisplay)."""

    def __init__(self, lang_code: str) -> None:
        self.lang = lang_code

    async def not_possible(self, reason: str) -> None:
        await say(text("round_not_possible", self.lang, reason=reason), actions=[retry_action(self.lang)])

    async def waits(self, wait: Wait) -> None:
        await show_reply_wait(wait, self.lang)

    async def show(self, round_: Round):
        element = MetricsElement(name="Metrics", props=round_.props(self.lang), display="inline")
        await cl.Message(content="", author=APP_AUTHOR, elements=[element]).send()
        lab().round_elements[round_.round_id] = (element.id, element.for_id)

        rule = lab().disclosure

        async def redraw() -> None:
            # A compare round's named columns show no engine state nor queue while a blind round waits.
            element.props = round_.props(self.lang, engine_state=rule.engine_state_shown())
            await element.update()

        return redraw

    async def notice(self, notice: Notice) -> None:
        await say(notice.render(self.lang))

    async def backends_checked(self, failed) -> None:
        await refresh_backend_list(failed)


async def compare_reply(user_text: str) -> None:
    """One prompt to every chosen backend, side by side (blind: anonymous until voted on)."""
    await play(app_state(), lab(), user_text, RoundElement(lang()), thread_id=cl.context.session.thread_id,
               user=current_user(), lang=lang())


async def resume(thread: dict) -> None:
    """A reopened chat: note which element shows each of its rounds, so a vote can update it. Its
    blind rounds that still wait for their vote stay hidden: they are the person's, and the person's
    rule (core.disclosure) knows them from the database."""
    elements = lab().round_elements
    for element in thread.get("elements") or []:
        props = element.get("props")
        if isinstance(props, dict) and props.get("kind") == "compare" and props.get("roundId"):
            elements[props["roundId"]] = (element["id"], element.get("forId"))
    await current_rule()


async def vote(payload: Any) -> dict:
    """Cast the vote on a round of this chat, then reveal it in its element. Returns {"ok", "message"}
    to the element."""
    result = await cast_vote(app_state(), lab(), payload, thread_id=cl.context.session.thread_id,
                             user=current_user(), lang=lang())
    if result.ok:
        element_id, for_id = lab().round_elements.get(result.props.get("roundId"), (None, None))
        if element_id and for_id:
            element = MetricsElement(id=element_id, name="Metrics", props=result.props, display="inline")
            element.for_id = for_id
            await element.update()
        else:  # its element was never kept: show the revealed round anew
            await cl.Message(content="", author=APP_AUTHOR,
                             elements=[MetricsElement(name="Metrics", props=result.props, display="inline")]).send()
    await say(result.message)
    return {"ok": result.ok, "message": result.message}


async def close_class_rounds() -> None:
    """/close_rounds: a teacher closes every blind round of the class that waits for its vote."""
    notice = await close_rounds(app_state(), current_user())
    await say(notice.render(lang()))
