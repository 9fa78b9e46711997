"""The leaderboard (and its vote export), this chat's figures (/stats) and replaying the chat
on every backend.

All read the database (`store`); the statistics are `compare` (ratings, controlled
ratings, battles) and plain Python, the charts Plotly. Chainlit only shows the results.
"""

from __future__ import annotations

import asyncio
import csv
import functools
import io
import json
from dataclasses import asdict
from typing import Sequence

import chainlit as cl
import plotly.graph_objects as go

from backends.base import ChatMessage
from backends.errors import BackendError
from core.load.prompt_sets import BUILT_IN_SETS, BenchPrompt, load_prompt_set, prompt_text
from core.replies import Refusal, plan_reply, stored_reply
from core.texts import text
from ui.session_view import app_state, current_user, lab, lang, say, screened, session_settings
from core.ratings.battles import FREE_CATEGORY, Battle, BattleView, PromptCatalogue, battles_from_votes, battles_jsonl
from core.ratings.board import Board, ViewError, board_markdown, build_board, parse_view
from core.ratings.ratings import ReplyFigures, leaderboard_figure, win_matrix_figure
from store import StoredReply, StoreError
from store.records import utc_now
from core.timing import RequestRecord, median_of

STATS_COLUMNS = ("created_at", "backend", "model", "mode", "status", "first_token_ms", "decode_tokens_per_s",
                 "output_tokens", "ms_per_output_token", "total_s", "prompt")
FIGURES_LIMIT = 10_000  # stored replies read for the leaderboard's medians
VIEW_BUTTONS = 8  # category buttons under the leaderboard (the busiest); any other can be typed


async def _store_or_say():
    store = await app_state().storage()
    if store is None:
        await say(text("storage_unavailable", lang(), problem=app_state().storage_problem))
    return store


# ---------------------------------------------------------------- leaderboard


@functools.cache
def _shipped_sets() -> dict[str, tuple[BenchPrompt, ...]]:
    return {language: tuple(load_prompt_set(language)) for language in BUILT_IN_SETS}


def prompt_sets() -> dict[str, tuple[str, ...]]:
    """The shipped prompt sets' prompts by language ("zh", "en"), read once."""
    return {language: tuple(prompt_text(prompt) for prompt in prompts) for language, prompts in _shipped_sets().items()}


@functools.cache
def prompt_catalogue() -> PromptCatalogue:
    """Which category and language each line of the shipped prompt sets has (other prompts: "free")."""
    return PromptCatalogue.from_sets({language: [(prompt_text(prompt), prompt.category) for prompt in prompts]
                                      for language, prompts in _shipped_sets().items()})


def may_export() -> bool:
    """The export holds every vote's comment and voter: with login on, for teachers only."""
    return app_state().auth.is_teacher(current_user())


def view_choices(battles: Sequence[Battle]) -> tuple[list[str], list[str]]:
    """The categories and languages a person may filter by: the prompt sets' and any with votes."""
    categories = sorted({category for category, _ in prompt_catalogue().entries.values()}
                        | {battle.category for battle in battles} | {FREE_CATEGORY})
    languages = sorted(set(BUILT_IN_SETS) | {battle.language for battle in battles})
    return categories, languages


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


def stats_rows(replies: Sequence[StoredReply]) -> list[dict]:
    """One row per reply, in the units people read (ms for latencies)."""
    return [{
        "created_at": reply.created_at.isoformat(timespec="seconds"),
        "backend": reply.backend,
        "model": reply.model,
        "mode": reply.mode,
        "status": reply.status,
        "first_token_ms": None if reply.first_token_s is None else round(reply.first_token_s * 1000, 1),
        "decode_tokens_per_s": None if reply.decode_tokens_per_s is None else round(reply.decode_tokens_per_s, 2),
        "output_tokens": reply.output_tokens,
        "ms_per_output_token": None if reply.ms_per_output_token is None else round(reply.ms_per_output_token, 2),
        "total_s": round(reply.total_s, 3),
        "prompt": reply.prompt,
    } for reply in replies]


def stats_csv(rows: Sequence[dict]) -> bytes:
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=STATS_COLUMNS)
    writer.writeheader()
    writer.writerows(rows)
    return buffer.getvalue().encode("utf-8")


def stats_markdown(rows: Sequence[dict]) -> str:
    def cell(value) -> str:
        return "–" if value is None else str(value).replace("|", "\\|")

    header = "| # | backend | mode | status | TTFT ms | tokens/s | tokens | TPOT ms | total s |\n|---|---|---|---|---|---|---|---|---|"
    lines = [f"| {index} | {cell(row['backend'])} | {row['mode']} | {row['status']} | {cell(row['first_token_ms'])} | "
             f"{cell(row['decode_tokens_per_s'])} | {row['output_tokens']} | {cell(row['ms_per_output_token'])} | "
             f"{row['total_s']} |" for index, row in enumerate(rows, 1)]
    return "\n".join([header, *lines])


def stats_figure(rows: Sequence[dict]) -> go.Figure:
    """TTFT and decode tokens/s of every reply, one colour per backend."""
    figure = go.Figure()
    for backend in dict.fromkeys(row["backend"] for row in rows):
        mine = [(index, row) for index, row in enumerate(rows, 1) if row["backend"] == backend]
        figure.add_trace(go.Scatter(x=[i for i, _ in mine], y=[r["first_token_ms"] for _, r in mine],
                                    mode="markers+lines", name=f"{backend} TTFT (ms)"))
        figure.add_trace(go.Bar(x=[i for i, _ in mine], y=[r["decode_tokens_per_s"] for _, r in mine],
                                name=f"{backend} tokens/s", yaxis="y2", opacity=0.5))
    figure.update_layout(xaxis_title="reply #", yaxis_title="TTFT (ms)",
                         yaxis2=dict(title="decode tokens/s", overlaying="y", side="right"),
                         barmode="group", height=380, margin=dict(t=30))
    return figure


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


def replay_markdown(results: dict[str, list[RequestRecord]], failures: dict[str, list[str]]) -> str:
    lines = ["| backend | replies | failed | TTFT ms (median) | tokens/s (median) | tokens | total s |",
             "|---|---|---|---|---|---|---|"]
    for backend, records in results.items():
        ttft = median_of([r.first_token_s for r in records])
        rate = median_of([r.decode_tokens_per_s for r in records])
        lines.append(f"| {backend} | {len(records)} | {len(failures.get(backend, []))} | "
                     f"{'–' if ttft is None else f'{ttft * 1000:.1f}'} | {'–' if rate is None else f'{rate:.1f}'} | "
                     f"{sum(r.output_tokens for r in records)} | {sum(r.total_s for r in records):.1f} |")
    return "\n".join(lines)


async def replay_on_all_backends() -> None:
    """Re-run this chat's user prompts, turn by turn, on every chosen backend (each with its own
    thread), one backend after another; a progress line moves; the result is a table."""
    state, lang_code, settings = app_state(), lang(), session_settings()
    if not state.auth.is_teacher(current_user()):  # it loads every chosen backend, prompt after prompt
        await say(text("replay_teachers_only", lang_code))
        return
    prompts: list[str] = list(lab().user_prompts)
    if not prompts:
        await say(text("replay_empty", lang_code))
        return
    chosen = settings.compare_backends or tuple(state.registry.names)
    progress = await say(text("replay_progress", lang_code, done=0, total=len(prompts) * len(chosen), bar="", backend="…"))
    results: dict[str, list[RequestRecord]] = {}
    failures: dict[str, list[str]] = {}
    done, total = 0, len(prompts) * len(chosen)
    for name in chosen:
        label = state.registry.get(name).label
        conversation: list[ChatMessage] = []
        results[label] = []
        for prompt in prompts:
            plan = await plan_reply(state, settings.for_backend(name), conversation, prompt)
            reply_text = ""
            if isinstance(plan, Refusal):
                failures.setdefault(label, []).append(plan.reason)
            else:
                timed = plan.open_stream()
                parts: list[str] = []
                status, failure = "completed", None
                try:
                    async for chunk in timed:
                        parts.append(chunk.text)
                except BackendError as error:
                    status, failure = "error", error
                finally:
                    await timed.aclose()
                record = timed.finish(status, error=failure.describe() if failure else None)
                reply_text = "".join(parts)
                if failure is None:
                    results[label].append(record)
                else:
                    failures.setdefault(label, []).append(failure.describe())
                await state.save_reply(stored_reply(plan, record, user_text=prompt, reply_text=reply_text,
                                                    mode="replay", thread_id=cl.context.session.thread_id,
                                                    user_identifier=current_user()))
            conversation.extend([ChatMessage("user", prompt), ChatMessage("assistant", reply_text)])
            done += 1
            filled = round(20 * done / total)
            progress.content = screened(text("replay_progress", lang_code, done=done, total=total,
                                             bar="▓" * filled + "░" * (20 - filled), backend=label))
            await progress.update()
    content = text("replay_title", lang_code, prompts=len(prompts)) + "\n\n" + replay_markdown(results, failures)
    problems = [f"- {backend}: {reasons[0]}" for backend, reasons in failures.items()]
    if problems:
        content += "\n\n" + text("replay_failures", lang_code) + "\n" + "\n".join(problems)
    await say(content, author="Replay")
