"""Reports without Chainlit: this chat's figures (/stats), replaying a chat on every backend, and
the prompt sets behind the leaderboard's views. The UI (ui/reports_view.py) shows what these make.
"""

from __future__ import annotations

import csv
import functools
import io
from dataclasses import dataclass, field
from typing import Awaitable, Callable, Sequence

import plotly.graph_objects as go

from backends.base import ChatMessage
from core.app_state import AppState
from core.load.prompt_sets import BUILT_IN_SETS, BenchPrompt, load_prompt_set, prompt_text
from core.ratings.battles import FREE_CATEGORY, Battle, PromptCatalogue
from core.replies import Refusal, plan_reply, stored_reply
from core.settings import SessionSettings
from core.streaming import Stopped, consume
from core.timing import RequestRecord, median_of
from store import StoredReply

STATS_COLUMNS = ("created_at", "backend", "model", "mode", "status", "first_token_ms", "decode_tokens_per_s",
                 "output_tokens", "ms_per_output_token", "total_s", "prompt_tokens", "cached_prompt_tokens",
                 "prefill_tokens_per_s", "prompt")


# ---------------------------------------------------------------- the prompt sets (the leaderboard's views)


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


def view_choices(battles: Sequence[Battle]) -> tuple[list[str], list[str]]:
    """The categories and languages a person may filter by: the prompt sets' and any with votes."""
    categories = sorted({category for category, _ in prompt_catalogue().entries.values()}
                        | {battle.category for battle in battles} | {FREE_CATEGORY})
    languages = sorted(set(BUILT_IN_SETS) | {battle.language for battle in battles})
    return categories, languages



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
        **prompt_cost(reply),
        "prompt": reply.prompt,
    } for reply in replies]


def prompt_cost(reply: StoredReply) -> dict:
    """The reply's prompt cost as its engine reported it (stored with the reply's record; None: not
    reported): prompt tokens, how many came from the engine's cache, prefill tokens/s."""
    server = reply.record.get("server") if isinstance(reply.record, dict) else None
    server = server if isinstance(server, dict) else {}
    rate = server.get("prompt_tokens_per_s")
    return {"prompt_tokens": server.get("input_tokens"), "cached_prompt_tokens": server.get("cached_prompt_tokens"),
            "prefill_tokens_per_s": None if rate is None else round(rate, 1)}


def stats_csv(rows: Sequence[dict]) -> bytes:
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=STATS_COLUMNS)
    writer.writeheader()
    writer.writerows(rows)
    return buffer.getvalue().encode("utf-8")


def stats_markdown(rows: Sequence[dict]) -> str:
    def cell(value) -> str:
        return "–" if value is None else str(value).replace("|", "\\|")

    header = ("| # | backend | mode | status | TTFT ms | tokens/s | tokens | TPOT ms | total s | prompt tokens "
              "| from cache | prefill tokens/s |\n|---|---|---|---|---|---|---|---|---|---|---|---|")
    lines = [f"| {index} | {cell(row['backend'])} | {row['mode']} | {row['status']} | {cell(row['first_token_ms'])} | "
             f"{cell(row['decode_tokens_per_s'])} | {row['output_tokens']} | {cell(row['ms_per_output_token'])} | "
             f"{row['total_s']} | {cell(row['prompt_tokens'])} | {cell(row['cached_prompt_tokens'])} | "
             f"{cell(row['prefill_tokens_per_s'])} |" for index, row in enumerate(rows, 1)]
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



# ---------------------------------------------------------------- replay


@dataclass
class Replay:
    """A chat replayed on every chosen backend: each backend's records and its failures' reasons."""

    prompts: int
    results: dict[str, list[RequestRecord]] = field(default_factory=dict)
    failures: dict[str, list[str]] = field(default_factory=dict)

    def failed(self, label: str, reason: str) -> None:
        self.failures.setdefault(label, []).append(reason)


async def replay(state: AppState, settings: SessionSettings, prompts: Sequence[str], *, thread_id: str | None,
                 user: str | None, progress: Callable[[int, int, str], Awaitable[None]]) -> Replay:
    """This chat's prompts, turn by turn, on every chosen backend (each with its own thread), one
    backend after another, each reply measured by the one stream loop and stored (mode "replay").
    `progress(done, total, label)` after each reply. Stop ends it: the stopped reply is stored first."""
    chosen = settings.compare_backends or tuple(state.registry.names)
    outcome = Replay(len(prompts))
    done, total = 0, len(prompts) * len(chosen)
    for name in chosen:
        label = state.registry.get(name).label
        conversation: list[ChatMessage] = []
        outcome.results[label] = []
        for prompt in prompts:
            plan = await plan_reply(state, settings.for_backend(name), conversation, prompt)
            reply_text = ""
            if isinstance(plan, Refusal):
                outcome.failed(label, plan.reason)
            else:
                try:
                    streamed = await consume(plan.open_stream())
                except Stopped as stopped:
                    await _store(state, plan, stopped.outcome, prompt, thread_id, user)
                    raise
                await _store(state, plan, streamed, prompt, thread_id, user)
                reply_text = streamed.text
                if streamed.error is None:
                    outcome.results[label].append(streamed.record)
                else:
                    outcome.failed(label, streamed.error.describe())
            conversation.extend([ChatMessage("user", prompt), ChatMessage("assistant", reply_text)])
            done += 1
            await progress(done, total, label)
    return outcome


async def _store(state: AppState, plan, streamed, prompt: str, thread_id: str | None, user: str | None) -> None:
    await state.save_reply(stored_reply(plan, streamed.record, user_text=prompt, reply_text=streamed.text,
                                        mode="replay", thread_id=thread_id, user_identifier=user))


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


