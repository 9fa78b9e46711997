"""What a message or a button asks for: a reply (single or round), or a report.

`/leaderboard`, `/stats`, `/replay`, `/engines`, `/bench`, `/status`, `/prompt`, `/trace`,
`/close_rounds` (a teacher closes the class's open blind rounds) and `/sign_out` (a teacher ends
a person's logins, or everyone else's: ui/sign_out.py) are
Chainlit commands (picked from the composer) and also work typed as text; `/leaderboard` takes a
filter ("/leaderboard category=code lang=zh"), `/trace` "notext" (the class's trace without texts),
`/sign_out` a user name or "all". A message in compare or blind mode starts a round;
otherwise the session's backend answers. Each asks the person's blind rule first (core.disclosure):
while a blind round of theirs waits for its vote, a view or a reply that could name its columns
waits, unless the person insists ("Show anyway", `insist`): the round then no longer counts as blind.
"""

from __future__ import annotations

import asyncio
import random

import chainlit as cl

from backends.base import on_behalf_of
from core import reports as core_reports
from core.round_flow import give_up_rounds
from ui import engines_view, reports_view as reports, rounds_view, session_memory as memory, session_view as session
from ui.sign_out import sign_out_command
from ui.chat_history import history_written
from core.texts import text

COMMANDS = ("leaderboard", "stats", "replay", "engines", "bench", "status", "prompt", "trace", "close_rounds",
            "sign_out")
COMMAND_ICONS = {"leaderboard": "trophy", "stats": "chart-column", "replay": "repeat", "engines": "gauge",
                 "bench": "timer", "status": "activity", "prompt": "shuffle", "trace": "download",
                 "close_rounds": "lock-open", "sign_out": "log-out"}
TAKES_ARGUMENTS = ("leaderboard", "trace", "sign_out")
# Commands without a button under the backends' status: they need an argument.
NO_BUTTON = ("sign_out",)


async def announce_commands() -> None:
    """Offer the commands in the composer."""
    lang = session.lang()
    await cl.context.emitter.set_commands([
        {"id": name, "icon": COMMAND_ICONS[name], "description": text(f"command_{name}", lang), "button": False}
        for name in COMMANDS
    ])


def report_actions() -> list[cl.Action]:
    """Buttons for the reports, shown under the backends' status."""
    lang = session.lang()
    return [cl.Action(name=name, payload={}, label=text(f"action_{name}", lang), icon=COMMAND_ICONS[name])
            for name in COMMANDS if name not in NO_BUTTON]


def typed_command(content: str) -> tuple[str, str] | None:
    """(command, arguments) for a command typed as a message: '/stats' alone on the line, or
    '/leaderboard' with its filter ('/leaderboard category=code'); None for anything else."""
    typed = content.strip()
    if not typed.startswith("/"):
        return None
    name, _, arguments = typed[1:].partition(" ")
    if name not in COMMANDS or (arguments.strip() and name not in TAKES_ARGUMENTS):
        return None
    return name, arguments.strip()


async def on_message(message: cl.Message) -> None:
    if message.command in COMMANDS:
        arguments = message.content if message.command in TAKES_ARGUMENTS else ""
        await run_command(message.command, arguments if isinstance(arguments, str) else "")
        return
    user_text = await session.checked_input(message.content, message)
    if user_text is None:
        return
    command = typed_command(user_text)
    if command:
        await run_command(*command)
        return
    await answer(user_text)


async def answer(user_text: str) -> None:
    """A reply from the session's backend, or a round when compare or blind mode is on, in this
    person's turn where an engine queues in this process (backends.base.on_behalf_of)."""
    on_behalf_of.set(session.current_person())  # this task's own context: its streams inherit it
    session.lab().user_prompts.append(user_text)
    try:
        if session.session_settings().mode == "chat":
            await session.reply(user_text)
        else:
            await rounds_view.compare_reply(user_text)
    finally:
        memory.bound_session()
    await history_written()  # a reply the person saw end outlives the replica before its task ends


async def run_command(name: str, arguments: str = "") -> None:
    if name == "sign_out":  # no blind round waits on it; it checks the teacher before anything is said
        await sign_out_command(arguments)
        return
    rule = await session.current_rule()  # the person's: a round in another tab or replica holds it too
    wait = rule.refusal(name)
    if wait is not None:  # core.disclosure: it could tie a blind round's column to its backend
        await session.show_command_wait(wait, name, session.lang())
        return
    if name == "leaderboard":
        await reports.show_leaderboard(arguments)
    elif name == "export_votes":
        await reports.export_votes()
    elif name == "prompt":
        await try_a_set_prompt()
    elif name == "stats":
        await reports.show_stats()
    elif name == "replay":
        await reports.replay_on_all_backends()
    elif name == "engines":
        await engines_view.open_panel()
    elif name == "bench":
        await engines_view.run_bench()
    elif name == "status":
        await session.show_status()
    elif name == "trace":
        await engines_view.export_trace(arguments)
    elif name == "close_rounds":
        await rounds_view.close_class_rounds()


async def retry() -> None:
    """Resend the message that failed, to the backend(s) now selected. Stop works here too."""
    pending = session.lab().pending
    if not pending:
        await session.say(text("retry_gone", session.lang()))
        return
    pending = await session.checked_input(pending)
    if pending is None:
        return
    chainlit_session = cl.context.session
    chainlit_session.current_task = asyncio.current_task()
    await cl.context.emitter.task_start()
    try:
        await cl.Message(content=pending, author="You", type="user_message").send()
        prompts = session.lab().user_prompts
        if prompts and prompts[-1] == pending:
            prompts.pop()  # the failed attempt is replaced by this one
        await answer(pending)
    finally:
        await cl.context.emitter.task_end()


async def insist(payload: object) -> None:
    """"Show anyway": the person gives up the blindness of their waiting rounds to see a view (the
    payload's command: every waiting round) or to send the waiting message (the rounds that share a
    backend with it); those rounds are kept but their votes not rated (core.round_flow.give_up_rounds)."""
    command = payload.get("command") if isinstance(payload, dict) else None
    lab = session.lab()
    if command is not None and command not in (*COMMANDS, "export_votes"):
        return
    if command is None:
        settings = lab.settings
        backends = list(settings.compare_backends) if settings.mode != "chat" else [settings.backend]
    else:
        backends = None
    notice = await give_up_rounds(session.app_state(), lab, backends)
    if notice is not None:
        await session.say(notice.render(session.lang()))
        if notice.key == "blind_give_up_unsure":
            return
    if command is not None:
        await run_action(command)
    elif lab.pending:
        await retry()


def view_arguments(payload: object) -> str:
    """The filter a leaderboard view button carries ("" when there is none or it is not text)."""
    arguments = payload.get("arguments") if isinstance(payload, dict) else None
    return arguments if isinstance(arguments, str) else ""


async def try_a_set_prompt() -> None:
    """Send a random prompt of the shipped set in the person's language, as if they had typed
    it: in a blind round its vote counts under the prompt's category on the leaderboard."""
    prompt = random.choice(core_reports.prompt_sets()[session.lang()])
    await cl.Message(content=prompt, author="You", type="user_message").send()
    await answer(prompt)


async def run_action(name: str, arguments: str = "") -> None:
    """A report button: run it as a task the Stop button can end."""
    chainlit_session = cl.context.session
    chainlit_session.current_task = asyncio.current_task()
    await cl.context.emitter.task_start()
    try:
        await run_command(name, arguments)
    finally:
        await cl.context.emitter.task_end()
