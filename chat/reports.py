"""The leaderboard, this chat's figures (/stats) and replaying the chat on every backend.

All three read the database (`store`); the statistics are `compare.ratings`
and plain Python, the charts Plotly. Chainlit only shows the results.
"""

from __future__ import annotations

import csv
import io
import json
import statistics
from dataclasses import asdict
from typing import Sequence

import chainlit as cl
import plotly.graph_objects as go

from backends.base import ChatMessage
from backends.errors import BackendError
from chat.flow import Refusal, plan_reply, stored_reply
from chat.i18n import text
from chat.session import app_state, current_user, lab, lang, say, screened, session_settings
from compare.ratings import (
    Leaderboard,
    ReplyFigures,
    RoundVote,
    build_leaderboard,
    leaderboard_figure,
    leaderboard_table_markdown,
    win_matrix_figure,
)
from store import StoredReply, StoreError, VoteRecord
from timing import RequestRecord

STATS_COLUMNS = ("created_at", "backend", "model", "mode", "status", "first_token_ms", "decode_tokens_per_s",
                 "output_tokens", "ms_per_output_token", "total_s", "prompt")
FIGURES_LIMIT = 10_000  # stored replies read for the leaderboard's medians


async def _store_or_say():
    store = await app_state().storage()
    if store is None:
        await say(text("storage_unavailable", lang(), problem=app_state().storage_problem))
    return store


# ---------------------------------------------------------------- leaderboard


def rated_votes(records: Sequence[VoteRecord]) -> list[RoundVote]:
    """The stored votes the ratings count (blind ones: names hidden while judging), each with its
    columns' good/bad judgements and its comment."""
    return [RoundVote(backends=record.backends, outcome=record.vote.outcome, winner=record.winner_backend,
                      verdicts=record.verdicts, comment=record.vote.comment)
            for record in records if record.mode == "blind"]


def leaderboard_markdown(board: Leaderboard, *, unrated_votes: int, lang_code: str) -> str:
    """The leaderboard message: title, table (with each backend's good/bad judgements), how many
    votes came with a comment, and the notes, in the person's language."""
    titles = [title.strip() for title in text("leaderboard_columns", lang_code).split("|")]
    parts = [text("leaderboard_title", lang_code, blind=board.total_votes, compare=unrated_votes),
             leaderboard_table_markdown(board, titles)]
    if board.total_votes:
        parts.append(text("leaderboard_comments", lang_code, commented=board.commented_votes,
                          votes=board.total_votes))
    notes = [f"- {text('leaderboard_note_' + note.key, lang_code, **note.values)}" for note in board.notes]
    if notes:
        parts.append("\n".join(notes))
    return "\n\n".join(parts)


async def show_leaderboard() -> None:
    """Votes, wins/ties/losses, Bradley-Terry ratings with 95% intervals, the win matrix and
    median figures per backend. Ratings count blind votes only (names hidden while judging)."""
    lang_code = lang()
    store = await _store_or_say()
    if store is None:
        return
    try:
        records = await store.votes()
        replies = await store.replies(limit=FIGURES_LIMIT)
    except StoreError as error:
        await say(text("storage_failed", lang_code, problem=str(error)))
        return
    votes = rated_votes(records)
    figures = [ReplyFigures(r.backend, r.first_token_s, r.decode_tokens_per_s)
               for r in replies if r.status == "completed"]
    board = build_leaderboard(votes, figures)
    content = leaderboard_markdown(board, unrated_votes=len(records) - len(votes), lang_code=lang_code)
    elements = []
    if board.rated_rows:
        elements = [cl.Plotly(name="ratings", figure=leaderboard_figure(board), display="inline"),
                    cl.Plotly(name="win_matrix", figure=win_matrix_figure(board), display="inline")]
    await say(content, author="Leaderboard", elements=elements)


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


def _median(values: Sequence[float | None]) -> float | None:
    present = [value for value in values if value is not None]
    return statistics.median(present) if present else None


def replay_markdown(results: dict[str, list[RequestRecord]], failures: dict[str, list[str]]) -> str:
    lines = ["| backend | replies | failed | TTFT ms (median) | tokens/s (median) | tokens | total s |",
             "|---|---|---|---|---|---|---|"]
    for backend, records in results.items():
        ttft = _median([r.first_token_s for r in records])
        rate = _median([r.decode_tokens_per_s for r in records])
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
