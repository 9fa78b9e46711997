"""The whole leaderboard of one view: plain and controlled ratings with ranks, effects, counts.

`build_board` is what the chat's /leaderboard and the offline `python -m core.ratings`
both compute from battles (compare.battles); `board_markdown` and `board_json`
render it, in English or Chinese (compare.texts). Plain Python and numpy only.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Iterable, Sequence

from core.ratings.battles import Battle, BattleView, rounds_from_battles, vote_count, votes_by
from core.ratings.controlled import DEFAULT_CONTROLS, ControlledRatings, Effect, rate_with_controls
from core.ratings.ratings import (
    BOOTSTRAP_SAMPLES,
    Leaderboard,
    ReplyFigures,
    build_leaderboard,
    leaderboard_table_markdown,
)
from core.ratings.texts import text

# The controlled fit refits several parameters per resample; 500 resamples keep its 95%
# interval bounds steady to about a point and the whole board well under a second at
# 2,000 votes (docs/teachers/votes-and-ratings.md).
CONTROLLED_BOOTSTRAP_SAMPLES = 500


class ViewError(ValueError):
    """A typed leaderboard filter that names no view; `key` and `values` say why (compare.texts)."""

    def __init__(self, key: str, **values: object) -> None:
        super().__init__(text(key, "en", **values))
        self.key = key
        self.values = values


@dataclass(frozen=True)
class Board:
    """One view of the leaderboard.

    `plain` is today's leaderboard on the view's rated votes; `controlled` the ratings with the
    chosen controls (None without controls or votes). The counts say how many votes this view
    holds (`votes_in_view`) of all rated ones (`votes_rated`), how many were cast with names
    visible (`names_visible`) or kept but not rated (`unrated`), and how many rated votes each
    category and language holds.
    """

    view: BattleView
    plain: Leaderboard
    controlled: ControlledRatings | None
    votes_in_view: int
    votes_rated: int
    names_visible: int
    unrated: int
    categories: tuple[tuple[str, int], ...]
    languages: tuple[tuple[str, int], ...]


def build_board(
    battles: Sequence[Battle],
    reply_figures: Sequence[ReplyFigures] = (),
    view: BattleView = BattleView(),
    controls: Sequence[str] = DEFAULT_CONTROLS,
    *,
    bootstrap_samples: int = BOOTSTRAP_SAMPLES,
    controlled_bootstrap_samples: int = CONTROLLED_BOOTSTRAP_SAMPLES,
    seed: int = 0,
) -> Board:
    """Rate the view's counted battles (blind, not set apart) plainly and with `controls`.

    `reply_figures` give the median speed columns; in a filtered view only those of backends
    with votes in the view are shown (a backend without votes there is not "unvoted").
    """
    counted = [battle for battle in battles if battle.counted]
    in_view = view.select(counted)
    if view != BattleView():
        voted = {name for battle in in_view for name in (battle.a.backend, battle.b.backend)}
        reply_figures = [figures for figures in reply_figures if figures.backend in voted]
    plain = build_leaderboard(rounds_from_battles(in_view), reply_figures,
                              bootstrap_samples=bootstrap_samples, seed=seed)
    controlled = None
    if controls and in_view:
        controlled = rate_with_controls(in_view, controls, bootstrap_samples=controlled_bootstrap_samples, seed=seed)
    return Board(
        view=view,
        plain=plain,
        controlled=controlled,
        votes_in_view=vote_count(in_view),
        votes_rated=vote_count(counted),
        names_visible=vote_count(battle for battle in battles if not battle.anony),
        unrated=vote_count(battle for battle in battles if battle.anony and not battle.rated),
        categories=tuple(votes_by(counted, "category")),
        languages=tuple(votes_by(counted, "language")),
    )


def parse_view(words: str, categories: Iterable[str], languages: Iterable[str]) -> BattleView:
    """A typed filter, e.g. "category=code lang=zh", "code zh", "language=en" or nothing (all).

    `categories` and `languages` are the ones a person may ask for; anything else raises
    ViewError saying what is known. "all" (or "*") as a value means no filter.
    """
    categories, languages = list(dict.fromkeys(categories)), list(dict.fromkeys(languages))
    category = language = None
    for word in words.split():
        key, separator, value = word.partition("=")
        key = key.lower() if separator else ("lang" if word.lower() in languages else "category")
        value = value if separator else word
        if value.lower() in ("all", "*"):
            continue
        if key in ("category", "cat"):
            match = next((known for known in categories if known.lower() == value.lower()), None)
            if match is None:
                raise ViewError("view_unknown_category", category=value[:40], known=", ".join(categories))
            category = match
        elif key in ("lang", "language"):
            if value.lower() not in languages:
                raise ViewError("view_unknown_language", language=value[:40], known=", ".join(languages))
            language = value.lower()
        else:
            raise ViewError("view_unknown_filter", word=word[:40])
    return BattleView(category, language)


# ---------------------------------------------------------------- Markdown


def plain_markdown(board: Leaderboard, *, unrated_votes: int, lang: str) -> str:
    """The plain leaderboard: title, table (ranks that respect the intervals, each backend's
    good/bad judgements), how many votes came with a comment, and the notes."""
    titles = [title.strip() for title in text("leaderboard_columns", lang).split("|")]
    parts = [text("leaderboard_title", lang, blind=board.total_votes, compare=unrated_votes),
             leaderboard_table_markdown(board, titles)]
    if board.rated_rows:
        parts.append(text("leaderboard_ranks", lang))
    if board.total_votes:
        parts.append(text("leaderboard_comments", lang, commented=board.commented_votes, votes=board.total_votes))
    notes = [f"- {text('leaderboard_note_' + note.key, lang, **note.values)}" for note in board.notes]
    if notes:
        parts.append("\n".join(notes))
    return "\n\n".join(parts)


def controlled_markdown(board: Board, lang: str) -> str:
    """The controlled ratings beside the plain ones, the effects in plain words, and their notes."""
    controlled = board.controlled
    if controlled is None or not controlled.ratings:
        return ""
    names = [text(f"control_{name}", lang) for name in controlled.controls]
    controls = text("control_separator", lang).join(names[:-1])
    controls = controls + text("control_last_separator", lang) + names[-1] if controls else names[-1]
    titles = [title.strip() for title in text("controlled_columns", lang).split("|")]
    lines = ["| " + " | ".join(titles) + " |", "|---:|---|---:|---|---:|---:|"]
    plain_rows = {row.backend: row for row in board.plain.rated_rows}
    ordered = sorted(controlled.ratings.values(), key=lambda rating: (-rating.rating, rating.backend))
    for rating in ordered:
        plain = plain_rows.get(rating.backend)
        lines.append("| " + " | ".join([
            str(controlled.ranks[rating.backend]), rating.backend.replace("|", "\\|"), f"{rating.rating:.0f}",
            f"{rating.ci_low:.0f} – {rating.ci_high:.0f}",
            "–" if plain is None else f"{plain.rating:.0f}", "–" if plain is None else str(plain.rank),
        ]) + " |")
    parts = [text("controlled_title", lang, controls=controls, votes=controlled.votes), "\n".join(lines),
             text("effects_title", lang) + "\n" + "\n".join(f"- {effect_sentence(e, lang)}" for e in controlled.effects)]
    notes = [f"- {text('controlled_note_' + note.key, lang, **note.values)}" for note in controlled.notes]
    if notes:
        parts.append("\n".join(notes))
    return "\n\n".join(parts)


def effect_sentence(effect: Effect, lang: str) -> str:
    """One covariate's effect in plain words, e.g. "A side that decodes twice as fast wins 62% of
    the votes (95% interval 55–69%): people prefer it."."""
    subject = text(f"effect_{effect.covariate}", lang)
    if effect.win_share is None:
        key = "effect_not_measured_speed" if effect.covariate in ("first_token", "decode") else "effect_not_measured"
        return text(key, lang, subject=subject)
    return text("effect_line", lang, subject=subject, share=round(100 * effect.win_share),
                low=round(100 * effect.win_share_low), high=round(100 * effect.win_share_high),
                verdict=text(f"verdict_{effect.verdict}", lang))


def board_markdown(board: Board, lang: str = "en") -> str:
    """The whole leaderboard message: plain ratings, the view, controlled ratings and effects,
    and the votes each category and language holds."""
    parts = [plain_markdown(board.plain, unrated_votes=board.names_visible, lang=lang)]
    if board.unrated:
        parts.append(f"- {text('leaderboard_note_unrated_named', lang, votes=board.unrated)}")
    if board.view != BattleView():
        described = [text("leaderboard_view_category", lang, category=board.view.category)] if board.view.category else []
        if board.view.language:
            described.append(text("leaderboard_view_language", lang, language=board.view.language))
        parts.insert(0, text("leaderboard_view", lang, view=", ".join(described), votes=board.votes_in_view,
                             total=board.votes_rated))
    controlled = controlled_markdown(board, lang)
    if controlled:
        parts.append(controlled)
    if board.categories:
        parts.append(text("leaderboard_views", lang,
                          categories=", ".join(f"{name} ({votes})" for name, votes in board.categories),
                          languages=", ".join(f"{name} ({votes})" for name, votes in board.languages)))
    return "\n\n".join(parts)


# ---------------------------------------------------------------- JSON


def board_json(board: Board, lang: str = "en") -> dict[str, Any]:
    """The board as plain data: rows, controlled ratings, effects and notes (with their sentences)."""
    def notes(items, prefix: str) -> list[dict[str, Any]]:
        return [{"key": note.key, "values": dict(note.values), "text": text(prefix + note.key, lang, **note.values)}
                for note in items]

    controlled = board.controlled
    return {
        "view": {"category": board.view.category, "language": board.view.language},
        "votes_in_view": board.votes_in_view,
        "votes_rated": board.votes_rated,
        "votes_names_visible": board.names_visible,
        "votes_kept_not_rated": board.unrated,
        "categories": dict(board.categories),
        "languages": dict(board.languages),
        "plain": [asdict(row) for row in board.plain.rows],
        "plain_notes": notes(board.plain.notes, "leaderboard_note_"),
        "controlled": None if controlled is None else {
            "controls": list(controlled.controls),
            "votes": controlled.votes,
            "battles": controlled.battles,
            "ratings": [{**asdict(rating), "rank": controlled.ranks[name]}
                        for name, rating in sorted(controlled.ratings.items(), key=lambda item: -item[1].rating)],
            "effects": [{**asdict(effect), "text": effect_sentence(effect, lang)} for effect in controlled.effects],
            "notes": notes(controlled.notes, "controlled_note_"),
        },
    }
