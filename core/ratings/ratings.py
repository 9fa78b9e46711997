"""From blind votes to a leaderboard.

One compare round shows 2-4 backends as columns A-D; a person votes once:
one column is best ("win"), "tie", or "both_bad" (every column is bad).
A round becomes pairwise outcomes: the winner beats each other column; a tie
or both_bad is a tie between every pair (half a win each side). both_bad is
also counted on its own, because "all bad" is worth knowing beside "all equal".

Ratings are Bradley-Terry strengths on an Elo-like scale: 400 points = 10:1
odds, mean 1000 over the rated backends. The fit is a Newton method on the
log-likelihood with ties counted as half a win each side. A weak symmetric
prior keeps ratings finite when a backend has only won or only lost: every
pair of rated backends starts with `PRIOR_TIES_PER_PAIR` virtual tie(s). For
two backends this gives the closed form

    rating gap = 400 * log10((score_a + prior / 2) / (score_b + prior / 2))

where a score counts wins plus half the ties. The prior also links backends
that never met, pulling them toward equal rather than leaving the gap undefined.

The 95% interval comes from a bootstrap over rounds (not pairs, because the
pairs of one round are not independent): resample the rounds with
replacement, refit, take the 2.5th and 97.5th percentiles. Rounds with the
same pairwise outcome are interchangeable, so a resample is drawn as a
multinomial over the distinct kinds of round, and all resamples are fitted at
once as one batch of small matrices.

A backend's rank respects those intervals (Chatbot Arena's rule): 1 + the
number of backends whose interval lies wholly above its own, so backends whose
intervals overlap share a rank. Ratings with speed, length and style held
apart are compare.controlled; votes as a dataset are compare.battles.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass, field, replace
from typing import Iterable, Literal, Mapping, Sequence

import numpy as np

from core.timing import median_of
from vocabulary import JUDGEMENTS, MAX_COLUMNS, MIN_COLUMNS, VOTE_OUTCOMES
import plotly.graph_objects as go

Outcome = Literal["win", "tie", "both_bad"]
Verdict = Literal["good", "bad"]

OUTCOMES: tuple[str, ...] = VOTE_OUTCOMES
VERDICTS: tuple[str, ...] = JUDGEMENTS

RATING_MEAN = 1000.0
RATING_POINTS_PER_TENFOLD_ODDS = 400.0
# One virtual tie per pair weighs like one real tie: after a single win the
# winner rates ~190 points above the loser (odds 1.5 : 0.5), not infinitely.
PRIOR_TIES_PER_PAIR = 1.0
BOOTSTRAP_SAMPLES = 1000
INTERVAL_PERCENT = 95.0

# Below these, the leaderboard says in words that the numbers are rough.
FEW_VOTES_TOTAL = 20
FEW_VOTES_PER_BACKEND = 5

# Newton converges in well under 20 steps on real data; the cap only stops
# a runaway fit from looping forever.
_MAX_NEWTON_STEPS = 200
_NEWTON_STEP_TOLERANCE = 1e-10
_MAX_STEP_HALVINGS = 40


@dataclass(frozen=True)
class RoundVote:
    """One voted compare round.

    `backends` holds the configured backend name of each column, in column
    order (A, B, ...). Names are what is rated, so the same engine may appear
    twice under two configured names. `winner` is a backend name when
    `outcome == "win"`, else None. `verdicts` is optional: empty, or one
    good/bad/None per column. Verdicts and the comment are counted, not rated.
    """

    backends: tuple[str, ...]
    outcome: Outcome
    winner: str | None = None
    verdicts: tuple[Verdict | None, ...] = ()
    comment: str = ""

    def __post_init__(self) -> None:
        # A list would make the vote mutable and unhashable; accept it, store a tuple.
        object.__setattr__(self, "backends", tuple(self.backends))
        object.__setattr__(self, "verdicts", tuple(self.verdicts))
        backends = self.backends
        if not MIN_COLUMNS <= len(backends) <= MAX_COLUMNS:
            raise ValueError(
                f"A compare round has {MIN_COLUMNS} to {MAX_COLUMNS} columns, "
                f"got {len(backends)}: {backends!r}."
            )
        for name in backends:
            if not isinstance(name, str) or not name:
                raise ValueError(f"Backend names must be non-empty strings, got {name!r} in {backends!r}.")
        repeated = sorted({name for name in backends if backends.count(name) > 1})
        if repeated:
            raise ValueError(
                f"Backend {repeated[0]!r} appears more than once in {backends!r}; each column "
                "needs its own name (configure the same engine twice under two names to compare it with itself)."
            )
        if self.outcome not in OUTCOMES:
            raise ValueError(f"Unknown outcome {self.outcome!r}; expected one of {OUTCOMES}.")
        if self.outcome == "win" and self.winner is None:
            raise ValueError(f"A 'win' needs the winning backend's name; choose one of {backends!r}.")
        if self.outcome == "win" and self.winner not in backends:
            raise ValueError(
                f"Winner {self.winner!r} is not one of this round's backends {backends!r}."
            )
        if self.outcome != "win" and self.winner is not None:
            raise ValueError(
                f"Outcome {self.outcome!r} has no winner, but winner={self.winner!r} was given."
            )
        if self.verdicts and len(self.verdicts) != len(backends):
            raise ValueError(
                f"Give one verdict per column ({len(backends)}) or none, got {len(self.verdicts)}."
            )
        for verdict in self.verdicts:
            if verdict is not None and verdict not in VERDICTS:
                raise ValueError(f"Unknown verdict {verdict!r}; expected one of {VERDICTS} or None.")


@dataclass(frozen=True)
class PairOutcome:
    """One head-to-head result inside a round: `backend` scored
    `backend_score` against `opponent` (1.0 = won, 0.5 = tie)."""

    backend: str
    opponent: str
    backend_score: float


@dataclass(frozen=True)
class ReplyFigures:
    """The measured figures of one stored reply, as far as they are known."""

    backend: str
    first_token_s: float | None
    decode_tokens_per_s: float | None


@dataclass(frozen=True)
class Rating:
    """A backend's rating and its bootstrap interval, in rating points."""

    backend: str
    rating: float
    ci_low: float
    ci_high: float


@dataclass(frozen=True)
class LeaderboardRow:
    """One backend on the leaderboard.

    Round-level counts: a win is a round where this backend was chosen, a
    loss one where another column was chosen, a tie one voted tie or both_bad.
    Rating and interval are None for a backend with no votes.
    """

    backend: str
    votes: int
    wins: int
    ties: int
    losses: int
    both_bad: int
    good_verdicts: int
    bad_verdicts: int
    rating: float | None
    ci_low: float | None
    ci_high: float | None
    median_first_token_s: float | None
    median_decode_tokens_per_s: float | None
    replies: int
    rank: int | None = None  # interval_ranks: tied with every backend whose interval overlaps its own


@dataclass(frozen=True)
class Matchup:
    """Head-to-head record of `backend` against `opponent` over all rounds
    where both were columns. `wins` counts ties as 0.5."""

    backend: str
    opponent: str
    wins: float
    comparisons: int

    @property
    def win_rate(self) -> float | None:
        """Share of the comparisons won (ties as half), None if they never met."""
        return self.wins / self.comparisons if self.comparisons else None


@dataclass(frozen=True)
class LeaderboardNote:
    """Something the leaderboard should say in words, as data: the chat renders `key` with
    `values` in the person's language (core.texts, "leaderboard_note_" + key)."""

    key: str  # no_votes | few_votes | unvoted_backend | few_backend_votes | won_every_round | lost_every_round
    values: Mapping[str, object] = field(default_factory=dict)


@dataclass(frozen=True)
class Leaderboard:
    """Everything the compare view shows: rows best first, head-to-head
    records for every ordered pair of rated backends, and notes as data."""

    rows: tuple[LeaderboardRow, ...]
    matchups: tuple[Matchup, ...]
    total_votes: int
    commented_votes: int
    notes: tuple[LeaderboardNote, ...]

    def row(self, backend: str) -> LeaderboardRow:
        """The row of `backend`; an unknown name fails with the known ones."""
        for row in self.rows:
            if row.backend == backend:
                return row
        raise ValueError(f"No backend {backend!r} on the leaderboard; known: {[r.backend for r in self.rows]}.")

    def matchup(self, backend: str, opponent: str) -> Matchup:
        """The head-to-head record of `backend` against `opponent`."""
        for matchup in self.matchups:
            if matchup.backend == backend and matchup.opponent == opponent:
                return matchup
        raise ValueError(
            f"No matchup {backend!r} vs {opponent!r}; rated backends: {[r.backend for r in self.rated_rows]}."
        )

    @property
    def rated_rows(self) -> tuple[LeaderboardRow, ...]:
        """The rows that have a rating, best first."""
        return tuple(row for row in self.rows if row.rating is not None)


def pairwise_outcomes(vote: RoundVote) -> tuple[PairOutcome, ...]:
    """Expand a round into head-to-head results: a win is the winner beating
    each other column; a tie or both_bad is a tie for every pair of columns."""
    if vote.outcome == "win":
        return tuple(
            PairOutcome(vote.winner, other, 1.0) for other in vote.backends if other != vote.winner
        )
    columns = vote.backends
    return tuple(
        PairOutcome(columns[i], columns[j], 0.5)
        for i in range(len(columns))
        for j in range(i + 1, len(columns))
    )


def bradley_terry(
    pairs: Iterable[PairOutcome],
    backends: Sequence[str],
    *,
    prior_ties_per_pair: float = PRIOR_TIES_PER_PAIR,
) -> dict[str, float]:
    """Fit ratings (400 points = 10:1 odds, mean 1000) from head-to-head results.

    `backends` is the rated set; every pair of them gets `prior_ties_per_pair`
    virtual ties, so a backend that never lost still has a finite rating.
    """
    index = _index(backends)
    if not index:
        return {}
    ratings = ratings_from_log_strengths(_fit_log_strengths(_win_matrix(pairs, index), prior_ties_per_pair))
    return {name: float(ratings[i]) for name, i in index.items()}


def rate_backends(
    votes: Sequence[RoundVote],
    *,
    bootstrap_samples: int = BOOTSTRAP_SAMPLES,
    seed: int = 0,
    prior_ties_per_pair: float = PRIOR_TIES_PER_PAIR,
) -> dict[str, Rating]:
    """Rate every backend that appears in `votes`, with a bootstrap interval
    over rounds. The same votes and seed always give the same result."""
    if bootstrap_samples < 1:
        raise ValueError(f"bootstrap_samples must be at least 1, got {bootstrap_samples}.")
    if not votes:
        return {}
    index = _index(sorted({name for vote in votes for name in vote.backends}))
    # Rounds with the same set of columns and the same winner have the same
    # pairwise result (tie and both_bad alike), so they are interchangeable
    # when resampling: count each kind once and resample the kinds.
    kind_counts: dict[tuple[frozenset[str], str | None], int] = {}
    example_of_kind: dict[tuple[frozenset[str], str | None], RoundVote] = {}
    for vote in votes:
        kind = (frozenset(vote.backends), vote.winner)
        kind_counts[kind] = kind_counts.get(kind, 0) + 1
        example_of_kind.setdefault(kind, vote)
    counts = np.array(list(kind_counts.values()))
    size = len(index)
    kind_wins = np.stack([_win_matrix(pairwise_outcomes(example), index) for example in example_of_kind.values()])
    kind_wins = kind_wins.reshape(len(counts), size * size)

    point = ratings_from_log_strengths(
        _fit_log_strengths((counts @ kind_wins).reshape(size, size), prior_ties_per_pair)
    )
    rng = np.random.default_rng(seed)
    resampled_counts = rng.multinomial(len(votes), counts / len(votes), size=bootstrap_samples)
    resampled_wins = (resampled_counts @ kind_wins).reshape(bootstrap_samples, size, size)
    resampled = ratings_from_log_strengths(_fit_log_strengths(resampled_wins, prior_ties_per_pair))
    tail = (100.0 - INTERVAL_PERCENT) / 2
    low, high = np.percentile(resampled, [tail, 100.0 - tail], axis=0)
    return {
        name: Rating(name, float(point[i]), float(low[i]), float(high[i])) for name, i in index.items()
    }


def interval_ranks(intervals: Mapping[str, tuple[float, float]]) -> dict[str, int]:
    """Ranks that respect uncertainty (Chatbot Arena's rule): 1 + the number of backends whose
    interval lies wholly above this one's (their lower bound above its upper bound).

    Backends whose intervals overlap share a rank, so a rank only says "behind these" where the
    votes show it; `intervals` maps each backend to its (low, high).
    """
    return {
        name: 1 + sum(1 for other, (other_low, _) in intervals.items() if other != name and other_low > high)
        for name, (_, high) in intervals.items()
    }


def build_leaderboard(
    votes: Sequence[RoundVote],
    reply_figures: Sequence[ReplyFigures],
    *,
    bootstrap_samples: int = BOOTSTRAP_SAMPLES,
    seed: int = 0,
    prior_ties_per_pair: float = PRIOR_TIES_PER_PAIR,
) -> Leaderboard:
    """Ratings, counts, median speed figures and warnings for every backend
    seen in `votes` or `reply_figures`, best rated first, unrated last."""
    ratings = rate_backends(
        votes, bootstrap_samples=bootstrap_samples, seed=seed, prior_ties_per_pair=prior_ties_per_pair
    )
    names = list(dict.fromkeys([n for v in votes for n in v.backends] + [f.backend for f in reply_figures]))
    ranks = interval_ranks({name: (rating.ci_low, rating.ci_high) for name, rating in ratings.items()})
    rows = [replace(_row(name, votes, reply_figures, ratings.get(name)), rank=ranks.get(name)) for name in names]
    # Unrated last (by name); equal ratings by name, so the order never depends on input order.
    rows.sort(key=lambda r: (r.rating is None, -(r.rating or 0.0), r.backend))
    rated = [row.backend for row in rows if row.rating is not None]
    return Leaderboard(
        rows=tuple(rows),
        matchups=_matchups(votes, rated),
        total_votes=len(votes),
        commented_votes=sum(1 for vote in votes if vote.comment.strip()),
        notes=_notes(rows, len(votes)),
    )


# The table's column titles (the chat passes them in the person's language).
TABLE_TITLES: tuple[str, ...] = (
    "#", "Backend", "Rating", "95% interval", "Votes", "Wins", "Ties", "Losses", "Both bad",
    "Judged good", "Judged bad", "Median TTFT (ms)", "Median decode (tokens/s)", "Replies",
)


def leaderboard_table_markdown(board: Leaderboard, titles: Sequence[str] = TABLE_TITLES) -> str:
    """The leaderboard rows as a Markdown table for the chat."""
    if len(titles) != len(TABLE_TITLES):
        raise ValueError(f"The table has {len(TABLE_TITLES)} columns ({', '.join(TABLE_TITLES)}), "
                         f"got {len(titles)} titles.")
    lines = [
        "| " + " | ".join(titles) + " |",
        "|---:|---|" + "---:|" * (len(TABLE_TITLES) - 2),
    ]
    for row in board.rows:
        interval = "–" if row.ci_low is None else f"{row.ci_low:.0f} – {row.ci_high:.0f}"
        cells = [
            "–" if row.rank is None else str(row.rank),
            row.backend.replace("|", "\\|"),
            _format(row.rating, "{:.0f}"),
            interval,
            str(row.votes),
            str(row.wins),
            str(row.ties),
            str(row.losses),
            str(row.both_bad),
            str(row.good_verdicts),
            str(row.bad_verdicts),
            _format(None if row.median_first_token_s is None else row.median_first_token_s * 1000, "{:.0f}"),
            _format(row.median_decode_tokens_per_s, "{:.1f}"),
            str(row.replies),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def leaderboard_figure(board: Leaderboard, controlled: Mapping[str, Rating] | None = None) -> go.Figure:
    """Ratings as dots with 95% interval whiskers, best at the top; with `controlled` (ratings
    at equal speed, length and style), a second dot per backend beside the plain one.

    Dots, not bars from zero: ratings sit around 1000 and the differences
    that matter are tens of points, which bars from zero would flatten.
    """
    rated = board.rated_rows
    figure = go.Figure(_rating_dots([(row.backend, row.rating, row.ci_low, row.ci_high) for row in rated],
                                    "Rating (95% interval)"))
    if controlled:
        shown = [controlled[row.backend] for row in rated if row.backend in controlled]
        figure.add_trace(_rating_dots([(r.backend, r.rating, r.ci_low, r.ci_high) for r in shown],
                                      "At equal speed, length and style (95% interval)", symbol="diamond"))
    figure.add_vline(x=RATING_MEAN, line_dash="dot", line_color="grey")
    figure.update_layout(
        title=dict(text=f"Ratings from {board.total_votes} blind votes"),
        xaxis_title="Rating (points; mean 1000; +400 points = 10:1 odds of being preferred)",
        yaxis_title="Backend",
        yaxis=dict(autorange="reversed"),
        showlegend=bool(controlled),
        legend=dict(orientation="h", y=-0.25),
    )
    return figure


def _rating_dots(points: Sequence[tuple[str, float, float, float]], name: str, symbol: str = "circle") -> go.Scatter:
    """(backend, rating, low, high) as dots with asymmetric interval whiskers."""
    return go.Scatter(
        x=[rating for _, rating, _, _ in points],
        y=[backend for backend, _, _, _ in points],
        mode="markers",
        name=name,
        marker=dict(symbol=symbol, size=9),
        error_x=dict(
            type="data",
            symmetric=False,
            array=[high - rating for _, rating, _, high in points],
            arrayminus=[rating - low for _, rating, low, _ in points],
        ),
        hovertemplate="%{y}: %{x:.0f} points<extra>" + name.split(" (")[0] + "</extra>",
    )


def win_matrix_figure(board: Leaderboard) -> go.Figure:
    """Heatmap of how often the row backend beat the column backend
    (ties count half), with wins / comparisons written in each cell."""
    names = [row.backend for row in board.rated_rows]
    win_rates: list[list[float | None]] = []
    labels: list[list[str]] = []
    for backend in names:
        rate_row: list[float | None] = []
        label_row: list[str] = []
        for opponent in names:
            if backend == opponent:
                rate_row.append(None)
                label_row.append("")
                continue
            matchup = board.matchup(backend, opponent)
            rate_row.append(matchup.win_rate)
            label_row.append(f"{matchup.wins:g} / {matchup.comparisons}" if matchup.comparisons else "never met")
        win_rates.append(rate_row)
        labels.append(label_row)
    figure = go.Figure(
        go.Heatmap(
            z=win_rates,
            x=names,
            y=names,
            zmin=0.0,
            zmax=1.0,
            colorscale="RdBu",
            text=labels,
            texttemplate="%{text}",
            colorbar=dict(title=dict(text="Row win rate"), tickformat=".0%"),
            hovertemplate="%{y} vs %{x}: %{z:.0%} (%{text})<extra></extra>",
        )
    )
    figure.update_layout(
        title=dict(text="Head to head: share of comparisons the row won (ties count half)"),
        xaxis_title="Opponent (column)",
        yaxis_title="Backend (row)",
        yaxis=dict(autorange="reversed"),
    )
    return figure


def _index(backends: Sequence[str]) -> dict[str, int]:
    index = {name: i for i, name in enumerate(backends)}
    if len(index) != len(backends):
        raise ValueError(f"Rated backends must be distinct, got {list(backends)}.")
    return index


def _win_matrix(pairs: Iterable[PairOutcome], index: dict[str, int]) -> np.ndarray:
    """wins[i, j] = what backend i scored against backend j (ties as 0.5)."""
    wins = np.zeros((len(index), len(index)))
    for pair in pairs:
        for name in (pair.backend, pair.opponent):
            if name not in index:
                raise ValueError(f"Pair names {name!r}, which is not among the rated backends {list(index)}.")
        wins[index[pair.backend], index[pair.opponent]] += pair.backend_score
        wins[index[pair.opponent], index[pair.backend]] += 1.0 - pair.backend_score
    return wins


def _fit_log_strengths(wins: np.ndarray, prior_ties_per_pair: float) -> np.ndarray:
    """Bradley-Terry log-strengths (natural log, mean 0) for one win matrix
    (k, k) or a batch (..., k, k); wins[i, j] = score of i against j.

    Newton's method on the concave log-likelihood, with step halving so each
    step improves it. The prior's virtual ties make it strictly concave once
    the mean is fixed, so there is one answer and Newton finds it.
    """
    if not prior_ties_per_pair > 0:
        raise ValueError(
            f"prior_ties_per_pair must be positive (got {prior_ties_per_pair}); without it a backend "
            "that never lost would have an infinite rating."
        )
    size = wins.shape[-1]
    others = 1.0 - np.eye(size)
    wins = wins + others * prior_ties_per_pair / 2
    games = wins + np.swapaxes(wins, -1, -2)
    scores = wins.sum(axis=-1)
    # Adding the all-ones matrix / k pins the mean: the Laplacian alone is singular along it.
    pin_mean = np.full((size, size), 1.0 / size)

    def log_likelihood(log_strengths: np.ndarray) -> np.ndarray:
        gaps = log_strengths[..., :, None] - log_strengths[..., None, :]
        return -(wins * np.logaddexp(0.0, -gaps)).sum(axis=(-1, -2))

    log_strengths = np.zeros(wins.shape[:-1])
    for _ in range(_MAX_NEWTON_STEPS):
        gaps = log_strengths[..., :, None] - log_strengths[..., None, :]
        win_chance = 0.5 * (1.0 + np.tanh(gaps / 2))  # logistic, without overflow
        gradient = scores - (games * win_chance).sum(axis=-1)
        weights = games * win_chance * (1.0 - win_chance)
        laplacian = np.eye(size) * weights.sum(axis=-1)[..., None] - weights
        step = np.linalg.solve(laplacian + pin_mean, gradient[..., None])[..., 0]

        before = log_likelihood(log_strengths)
        scale = np.ones(step.shape[:-1] + (1,))
        for _ in range(_MAX_STEP_HALVINGS):
            worse = log_likelihood(log_strengths + scale * step) < before - 1e-12 * np.abs(before)
            if not worse.any():
                break
            scale[worse] /= 2
        log_strengths = log_strengths + scale * step
        if np.abs(scale * step).max() < _NEWTON_STEP_TOLERANCE:
            return log_strengths
    raise RuntimeError(
        f"Bradley-Terry fit did not settle in {_MAX_NEWTON_STEPS} Newton steps; "
        f"prior_ties_per_pair={prior_ties_per_pair} may be too small for these votes."
    )


def ratings_from_log_strengths(log_strengths: np.ndarray) -> np.ndarray:
    """Natural-log strengths (mean 0) -> rating points (mean 1000, 400 points = 10:1 odds)."""
    return RATING_MEAN + RATING_POINTS_PER_TENFOLD_ODDS * log_strengths / math.log(10)


def _row(
    name: str, votes: Sequence[RoundVote], reply_figures: Sequence[ReplyFigures], rating: Rating | None
) -> LeaderboardRow:
    taking_part = [vote for vote in votes if name in vote.backends]
    verdicts = [
        vote.verdicts[vote.backends.index(name)] for vote in taking_part if vote.verdicts
    ]
    figures = [f for f in reply_figures if f.backend == name]
    return LeaderboardRow(
        backend=name,
        votes=len(taking_part),
        wins=sum(1 for vote in taking_part if vote.winner == name),
        ties=sum(1 for vote in taking_part if vote.outcome != "win"),
        losses=sum(1 for vote in taking_part if vote.outcome == "win" and vote.winner != name),
        both_bad=sum(1 for vote in taking_part if vote.outcome == "both_bad"),
        good_verdicts=verdicts.count("good"),
        bad_verdicts=verdicts.count("bad"),
        rating=rating.rating if rating else None,
        ci_low=rating.ci_low if rating else None,
        ci_high=rating.ci_high if rating else None,
        median_first_token_s=median_of([f.first_token_s for f in figures]),
        median_decode_tokens_per_s=median_of([f.decode_tokens_per_s for f in figures]),
        replies=len(figures),
    )


def _matchups(votes: Sequence[RoundVote], rated: Sequence[str]) -> tuple[Matchup, ...]:
    """Head-to-head records of every ordered pair of rated backends, in one pass over the votes."""
    wins: dict[tuple[str, str], float] = defaultdict(float)
    comparisons: dict[tuple[str, str], int] = defaultdict(int)
    for vote in votes:
        for pair in pairwise_outcomes(vote):
            wins[pair.backend, pair.opponent] += pair.backend_score
            wins[pair.opponent, pair.backend] += 1.0 - pair.backend_score
            comparisons[pair.backend, pair.opponent] += 1
            comparisons[pair.opponent, pair.backend] += 1
    return tuple(Matchup(a, b, wins[a, b], comparisons[a, b]) for a in rated for b in rated if a != b)


def _notes(rows: Sequence[LeaderboardRow], total_votes: int) -> tuple[LeaderboardNote, ...]:
    notes: list[LeaderboardNote] = []
    if total_votes == 0:
        notes.append(LeaderboardNote("no_votes"))
    elif total_votes < FEW_VOTES_TOTAL:
        notes.append(LeaderboardNote("few_votes", {"votes": total_votes, "enough": FEW_VOTES_TOTAL}))
    for row in rows:
        if row.votes == 0:
            notes.append(LeaderboardNote("unvoted_backend", {"backend": row.backend}))
            continue
        if row.votes < FEW_VOTES_PER_BACKEND:
            notes.append(LeaderboardNote("few_backend_votes", {"backend": row.backend, "votes": row.votes,
                                                               "enough": FEW_VOTES_PER_BACKEND}))
        if row.wins == row.votes or row.losses == row.votes:
            # Only the prior keeps such a rating finite, so the real gap may be larger.
            key = "won_every_round" if row.wins == row.votes else "lost_every_round"
            notes.append(LeaderboardNote(key, {"backend": row.backend, "votes": row.votes}))
    return tuple(notes)


def _format(value: float | None, pattern: str) -> str:
    return "–" if value is None else pattern.format(value)
