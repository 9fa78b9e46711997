"""The leaderboard (and its vote export), this chat's figures (/stats) and replaying the chat on
every backend, in Chainlit. What they compute is core.reports and core.ratings; this module reads
the database, asks, and shows the results (messages, Plotly charts, downloads).
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import asdict

import chainlit as cl

from core import reports
from core.ratings.battles import BattleView, battles_from_votes, battles_jsonl
from core.ratings.board import Board, ViewError, board_markdown, build_board, parse_view
from core.ratings.ratings import ReplyFigures, leaderboard_figure, win_matrix_figure
from core.reports import prompt_catalogue, stats_csv, stats_figure, stats_markdown, stats_rows, view_choices
from core.texts import text
from store import StoreError
from store.records import utc_now
from ui.session_view import app_state, current_user, lab, lang, say, screened, session_settings

FIGURES_LIMIT = 10_000  # stored replies read for the leaderboard's medians
VIEW_BUTTONS = 8  # category buttons under the leaderboard (the busiest); any other can be typed


async def _store_or_say():
    store = await app_state().storage()
    if store is None:
        await say(text("storage_unavailable", lang(), problem=app_state().storage_problem))
    return store


# ---------------------------------------------------------------- leaderboard


def may_export() -> bool:
    """The export holds every vote's comment and voter: with login on, for teachers only."""
    return app_state().auth.is_teacher(current_user())


def view_actions(board: Board, lang_code: str) -> list[cl.Action]:
    """Buttons for the views with votes: each language, the busiest categories, and back to all."""
    def action(label: str, arguments: str) -> cl.Action:
        return cl.Action(name="leaderboard_view", payload={"arguments": arguments}, label=label)

    actions = [action(text("leaderboard_all", lang_code), "")] if board.view != BattleView() else []
    actions += [action(f"{language} ({votes})", f"lang={language}") for language, votes in board.languages]
    actions += [action(f"{category} ({votes})", f"category={category}")
                for category, votes in board.categories[:VIEW_BUTTONS]]
    return actions


async def show_leaderboard(arguments: str = "") -> None:
    """Plain and controlled Bradley-Terry ratings with ranks, the effects of speed, length and
    style, counts and median figures per backend, for all votes or one category / language
    (`arguments`, e.g. "category=code lang=zh"), with buttons for the views and the export."""
    lang_code = lang()
    store = await _store_or_say()
    if store is None:
        return
    try:
        records = await store.votes(with_replies=True)
        speeds = await store.reply_speeds(limit=FIGURES_LIMIT)
    except StoreError as error:
        await say(text("storage_failed", lang_code, problem=str(error)))
        return
    # Markdown counts and a few hundred ms of numpy for thousands of votes: off the event loop,
    # so that the other chats go on meanwhile.
    battles = await asyncio.to_thread(battles_from_votes, records, prompt_catalogue())
    try:
        view = parse_view(arguments, *view_choices(battles))
    except ViewError as error:
        await say(text(error.key, lang_code, **error.values))
        return
    figures = [ReplyFigures(r.backend, r.first_token_s, r.decode_tokens_per_s)
               for r in speeds if r.status == "completed"]
    board = await asyncio.to_thread(build_board, battles, figures, view)
    elements = []
    if board.plain.rated_rows:
        elements = [cl.Plotly(name="ratings", display="inline", figure=leaderboard_figure(
                        board.plain, board.controlled.ratings if board.controlled else None)),
                    cl.Plotly(name="win_matrix", figure=win_matrix_figure(board.plain), display="inline")]
    actions = view_actions(board, lang_code)
    if records and may_export():
        actions.append(cl.Action(name="export_votes", payload={}, label=text("leaderboard_export", lang_code),
                                 icon="download"))
    await say(board_markdown(board, lang_code), author="Leaderboard", elements=elements, actions=actions)


async def export_votes() -> None:
    """Every stored vote as battle JSONL (core/ratings/battles.py documents the fields), as a download."""
    lang_code = lang()
    if not may_export():
        await say(text("export_teachers_only", lang_code))
        return
    store = await _store_or_say()
    if store is None:
        return
    try:
        records = await store.votes(with_replies=True)
    except StoreError as error:
        await say(text("storage_failed", lang_code, problem=str(error)))
        return
    battles = await asyncio.to_thread(battles_from_votes, records, prompt_catalogue())
    name = f"votes-{utc_now():%Y-%m-%d}.jsonl"
    await say(text("export_ready", lang_code, votes=len(records), battles=len(battles), name=name),
              author="Leaderboard", elements=[cl.File(name=name, content=battles_jsonl(battles),
                                                     mime="application/jsonl", display="inline")])


# ---------------------------------------------------------------- this chat's figures


async def show_stats() -> None:
    """Every reply of this chat (from the database): a table, a chart, CSV and JSON downloads."""
    lang_code = lang()
    store = await _store_or_say()
    if store is None:
        return
    try:
        replies = await store.replies_for_thread(cl.context.session.thread_id)
    except StoreError as error:
        await say(text("storage_failed", lang_code, problem=str(error)))
        return
    if not replies:
        await say(text("stats_empty", lang_code))
        return
    rows = stats_rows(replies)
    elements = [
        cl.Plotly(name="replies_chart", figure=stats_figure(rows), display="inline"),
        cl.File(name="replies.csv", content=stats_csv(rows), mime="text/csv", display="inline"),
        cl.File(name="replies.json", mime="application/json", display="inline",
                content=json.dumps([asdict(r) | {"created_at": r.created_at.isoformat()} for r in replies],
                                   ensure_ascii=False, indent=1).encode("utf-8")),
    ]
    await say(text("stats_title", lang_code, count=len(rows)) + "\n\n" + stats_markdown(rows),
              author="Stats", elements=elements)


# ---------------------------------------------------------------- replay


async def replay_on_all_backends() -> None:
    """/replay: this chat's prompts on every chosen backend (core.reports.replay), with a moving
    progress line, then a table."""
    state, lang_code, settings = app_state(), lang(), session_settings()
    if not state.auth.is_teacher(current_user()):  # it loads every chosen backend, prompt after prompt
        await say(text("replay_teachers_only", lang_code))
        return
    prompts: list[str] = list(lab().user_prompts)
    if not prompts:
        await say(text("replay_empty", lang_code))
        return
    total = len(prompts) * len(settings.compare_backends or state.registry.names)
    progress = await say(text("replay_progress", lang_code, done=0, total=total, bar="", backend="…"))

    async def moved(done: int, total: int, label: str) -> None:
        filled = round(20 * done / total)
        progress.content = screened(text("replay_progress", lang_code, done=done, total=total,
                                         bar="▓" * filled + "░" * (20 - filled), backend=label))
        await progress.update()

    result = await reports.replay(state, settings, prompts, thread_id=cl.context.session.thread_id,
                                  user=current_user(), progress=moved)
    content = text("replay_title", lang_code, prompts=result.prompts) + "\n\n" + reports.replay_markdown(
        result.results, result.failures)
    problems = [f"- {backend}: {reasons[0]}" for backend, reasons in result.failures.items()]
    if problems:
        content += "\n\n" + text("replay_failures", lang_code) + "\n" + "\n".join(problems)
    await say(content, author="Replay")
