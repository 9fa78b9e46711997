"""Ratings at equal speed, length and style: Bradley-Terry with covariates.

What people vote for is not only quality. Chatbot Arena's style control puts
the differences in length and markdown between the two sides of a battle into
the Bradley-Terry fit; this app adds speed, because every vote here comes with
both sides' measured TTFT and decode tokens/s. The model, for a battle of side
a against side b:

    P(a wins) = logistic(beta_a - beta_b + sum_j gamma_j * z_j)

`beta` are the backends' strengths (reported as ratings on the plain ratings'
scale: 400 points = 10:1 odds, mean 1000) and `z_j` the battle's covariates,
each a difference between the two sides, positive when side a has more of it:

| covariate | raw difference | control |
|---|---|---|
| first_token | log2(TTFT_b / TTFT_a): +1 = a's first token came in half the time | speed |
| decode | log2(decode_a / decode_b): +1 = a decoded twice as fast | speed |
| length | (tokens_a - tokens_b) / (tokens_a + tokens_b + 1) | length |
| headers, lists, bold | the same normalised difference of the markdown counts | style |

The length and markdown differences are Arena's (with its +1, so two replies
without markdown differ by 0). Speed is a log-ratio, so "twice as fast" means
the same at 10 and at 100 tokens/s. Speed counts only where the voter could
see it: a blind round with reveal "finished" shows no text before every column
has ended, so its speed differences are 0 (as are unknown figures, e.g. an
Arena log's). Each covariate is divided by its root mean square over the
battles (Arena standardises too) so that one prior fits all; it is not
centred, so that swapping a and b only flips the signs and the model stays
symmetric. A covariate that never differs is left out and reported as not
measured.

Ties and both-bad count half a win each side, as in the plain ratings and in
Arena's published code. A Davidson tie parameter would model how often ties
happen, but it moves the strengths onto another scale than the plain ratings',
and both-bad ties are mostly about the prompt, not about the pair; half a win
keeps the controlled and plain ratings comparable number for number.

The fit maximises the log-likelihood with the plain ratings' prior (one
virtual tie per pair of backends) plus a weak Gaussian prior on each
standardised coefficient, by Newton's method; with no covariates it gives the
plain ratings exactly. The 95% intervals come from a bootstrap over rounds
(the battles of one round are not independent), all resamples fitted at once
as matrix products, warm-started from the point estimate.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, Mapping, Sequence

import numpy as np

from core.ratings.battles import SPEED_SHOWN_IN, Battle, Side, vote_count  # noqa: F401 (SPEED_SHOWN_IN re-exported)
from core.ratings.ratings import (
    BOOTSTRAP_SAMPLES,
    INTERVAL_PERCENT,
    PRIOR_TIES_PER_PAIR,
    LeaderboardNote,
    Rating,
    interval_ranks,
    ratings_from_log_strengths,
)

CONTROLS: dict[str, tuple[str, ...]] = {
    "speed": ("first_token", "decode"),
    "length": ("length",),
    "style": ("headers", "lists", "bold"),
}
DEFAULT_CONTROLS = ("speed", "length", "style")


def normalised_difference(a, b):
    """Arena's style difference: (a - b) / (a + b + 1), of numbers or numpy arrays."""
    return (a - b) / (a + b + 1)


# The raw difference each plain-words statement is about ("a side twice as fast wins X%").
REFERENCE_DIFFERENCES: dict[str, float] = {
    "first_token": 1.0,  # first token in half the time
    "decode": 1.0,  # twice the decode speed
    "length": normalised_difference(200, 100),  # twice as long: 200 against 100 tokens
    "headers": normalised_difference(3, 0),  # 3 headers against none
    "lists": normalised_difference(5, 0),  # 5 list items against none
    "bold": normalised_difference(3, 0),  # 3 bold phrases against none
}

# A weak prior on each standardised coefficient (as one pseudo-battle's worth of information):
# it keeps a coefficient finite when a covariate alone decides every vote, and is negligible
# beside tens of votes.
COEFFICIENT_PRIOR_PRECISION = 1.0
# Below this many votes in a view the controlled ratings carry a "too few votes" note.
FEW_VOTES_CONTROLLED = 50
# An effect whose interval spans more than this share of the votes (e.g. 35% to 70%) is
# "too few votes to tell" rather than "no clear effect".
WIDE_WIN_SHARE_INTERVAL = 0.3
BOOTSTRAP_CHUNK = 250  # resamples fitted together: bounds memory (chunk x battles floats per array)

_MAX_NEWTON_STEPS = 100
# In log-odds: 1e-7 is 0.00002 rating points. Newton halves the digits left each step, so a
# warm start settles in about three.
_NEWTON_STEP_TOLERANCE = 1e-7
_STEP_CHECK_ABOVE = 1e-4  # a shorter step cannot overshoot by more than rounding
_MAX_STEP_HALVINGS = 30

Verdict = str  # favours | disfavours | no_clear_effect | too_few_votes | not_measured


@dataclass(frozen=True)
class Effect:
    """What one covariate does to the odds of winning, at equal quality.

    `coefficient` is the change in log-odds per unit of the raw difference (see the module's
    table); `win_share` is the chance that the side with the reference difference
    (REFERENCE_DIFFERENCES) wins against an equal backend, 0.5 = no effect. None where the
    covariate never differed (`verdict` "not_measured").
    """

    covariate: str
    coefficient: float | None
    ci_low: float | None
    ci_high: float | None
    win_share: float | None
    win_share_low: float | None
    win_share_high: float | None
    battles_with_difference: int
    verdict: Verdict


@dataclass(frozen=True)
class ControlledRatings:
    """Ratings with speed, length and/or style held apart, their ranks, and each covariate's effect."""

    controls: tuple[str, ...]
    ratings: Mapping[str, Rating]
    ranks: Mapping[str, int]
    effects: tuple[Effect, ...]
    votes: int
    battles: int
    speed_hidden_votes: int
    notes: tuple[LeaderboardNote, ...] = field(default_factory=tuple)

    def effect(self, covariate: str) -> Effect:
        """The effect of one covariate; an unknown name fails with the fitted ones."""
        for effect in self.effects:
            if effect.covariate == covariate:
                return effect
        raise ValueError(f"No covariate {covariate!r} in this fit; fitted: {[e.covariate for e in self.effects]}.")


def parse_controls(spec: str) -> tuple[str, ...]:
    """"speed,length" -> ("speed", "length"); "none" or "" -> (). Unknown names fail with the known ones."""
    names = tuple(dict.fromkeys(part.strip().lower() for part in spec.split(",") if part.strip()))
    if names in ((), ("none",)):
        return ()
    unknown = [name for name in names if name not in CONTROLS]
    if unknown:
        raise ValueError(f"Unknown control {unknown[0]!r}: choose from {', '.join(CONTROLS)} "
                         "(comma-separated), or none.")
    return names


# What each covariate compares between the two sides.
_SIDE_FIGURE: dict[str, Callable[[Side], float | None]] = {
    "first_token": lambda side: side.first_token_s,
    "decode": lambda side: side.decode_tokens_per_s,
    "length": lambda side: side.tokens,
    "headers": lambda side: side.markdown.header_total,
    "lists": lambda side: side.markdown.list_total,
    "bold": lambda side: side.markdown.bold_total,
}


def covariate_matrix(battles: Sequence[Battle], covariates: Sequence[str]) -> np.ndarray:
    """The raw differences (side a minus side b, see the module's table), one row per battle and
    one column per covariate; 0 where the voter could not see a difference or it is unknown."""
    unknown = [name for name in covariates if name not in _SIDE_FIGURE]
    if unknown:
        raise ValueError(f"Unknown covariate {unknown[0]!r}; known: {', '.join(_SIDE_FIGURE)}.")
    speed_shown = np.array([battle.speed_shown for battle in battles], dtype=bool)
    columns = []
    for name in covariates:
        figure = _SIDE_FIGURE[name]
        a = np.array([_known(figure(battle.a)) for battle in battles], dtype=float)
        b = np.array([_known(figure(battle.b)) for battle in battles], dtype=float)
        with np.errstate(divide="ignore", invalid="ignore"):
            if name in ("first_token", "decode"):
                usable = speed_shown & (a > 0) & (b > 0)  # NaN (unknown) compares False
                # Sooner first token, faster decoding: positive when side a is quicker.
                column = np.log2(b / a) if name == "first_token" else np.log2(a / b)
            else:
                usable = ~(np.isnan(a) | np.isnan(b))
                column = normalised_difference(a, b)
        columns.append(np.where(usable, column, 0.0))
    return np.column_stack(columns) if columns else np.zeros((len(battles), 0))


def covariate_value(covariate: str, battle: Battle) -> float:
    """The raw difference of one covariate in one battle (see covariate_matrix)."""
    return float(covariate_matrix([battle], [covariate])[0, 0])


def _known(value: float | None) -> float:
    return math.nan if value is None else float(value)


def rate_with_controls(
    battles: Sequence[Battle],
    controls: Sequence[str] = DEFAULT_CONTROLS,
    *,
    bootstrap_samples: int = BOOTSTRAP_SAMPLES,
    seed: int = 0,
    prior_ties_per_pair: float = PRIOR_TIES_PER_PAIR,
) -> ControlledRatings:
    """Fit the controlled ratings on the counted battles (blind, rated) with a bootstrap over
    rounds. The same battles and seed always give the same result."""
    if bootstrap_samples < 1:
        raise ValueError(f"bootstrap_samples must be at least 1, got {bootstrap_samples}.")
    if not prior_ties_per_pair > 0:
        raise ValueError(f"prior_ties_per_pair must be positive, got {prior_ties_per_pair}.")
    for control in controls:
        if control not in CONTROLS:
            raise ValueError(f"Unknown control {control!r}: choose from {', '.join(CONTROLS)}.")
    controls = tuple(dict.fromkeys(controls))
    covariates = [name for control in controls for name in CONTROLS[control]]
    counted = [battle for battle in battles if battle.counted]
    votes = vote_count(counted)
    speed_hidden = vote_count(b for b in counted if not b.speed_shown) if "speed" in controls else 0
    if not counted:
        return ControlledRatings(controls, {}, {}, tuple(_unmeasured(name, 0) for name in covariates), 0, 0,
                                 speed_hidden)

    backends = sorted({name for battle in counted for name in (battle.a.backend, battle.b.backend)})
    index = {name: i for i, name in enumerate(backends)}
    round_of = {round_id: i for i, round_id in enumerate(dict.fromkeys(battle.round_id for battle in counted))}
    raw = covariate_matrix(counted, covariates)
    scale = np.sqrt(np.mean(raw ** 2, axis=0))
    measured = scale > 1e-12
    design, outcomes = _design(counted, index, raw[:, measured] / scale[measured], prior_ties_per_pair)
    size, extra = len(backends), int(measured.sum())
    ridge = np.concatenate([np.zeros(size), np.full(extra, COEFFICIENT_PRIOR_PRECISION)])
    pseudo_rows = len(outcomes) - len(counted)

    def weights_for(round_counts: np.ndarray) -> np.ndarray:
        """Per-row weights of each resample: a battle weighs as often as its round was drawn;
        the prior's virtual ties keep their weight."""
        rows = round_counts[:, [round_of[battle.round_id] for battle in counted]]
        prior = np.full((len(round_counts), pseudo_rows), prior_ties_per_pair)
        return np.concatenate([rows, prior], axis=1)

    point = _fit(design, outcomes, weights_for(np.ones((1, len(round_of)))), np.zeros((1, size + extra)),
                 ridge, size)[0]
    resampled_rounds = _resample_rounds(len(round_of), bootstrap_samples, seed)
    resampled = np.concatenate([
        _fit(design, outcomes, weights_for(chunk), np.tile(point, (len(chunk), 1)), ridge, size)
        for chunk in np.array_split(resampled_rounds, math.ceil(bootstrap_samples / BOOTSTRAP_CHUNK))
    ])
    tail = (100.0 - INTERVAL_PERCENT) / 2
    low, high = np.percentile(resampled, [tail, 100.0 - tail], axis=0)

    point_ratings = ratings_from_log_strengths(point[:size])
    low_ratings, high_ratings = ratings_from_log_strengths(low[:size]), ratings_from_log_strengths(high[:size])
    ratings = {name: Rating(name, float(point_ratings[i]), float(low_ratings[i]), float(high_ratings[i]))
               for name, i in index.items()}
    effects = []
    fitted = iter(range(size, size + extra))
    for column, name in enumerate(covariates):
        differing = int(np.count_nonzero(raw[:, column]))
        if not measured[column]:
            effects.append(_unmeasured(name, differing))
            continue
        position = next(fitted)
        per_unit = 1.0 / scale[column]
        effects.append(_effect(name, point[position] * per_unit, resampled[:, position] * per_unit,
                               differing, votes))
    notes = []
    if votes < FEW_VOTES_CONTROLLED:
        notes.append(LeaderboardNote("controlled_few_votes", {"votes": votes, "enough": FEW_VOTES_CONTROLLED}))
    if "speed" in controls and 0 < speed_hidden < votes:  # all hidden: the effects say "not measured"
        notes.append(LeaderboardNote("speed_hidden", {"hidden": speed_hidden, "votes": votes}))
    return ControlledRatings(
        controls=controls,
        ratings=ratings,
        ranks=interval_ranks({name: (r.ci_low, r.ci_high) for name, r in ratings.items()}),
        effects=tuple(effects),
        votes=votes,
        battles=len(counted),
        speed_hidden_votes=speed_hidden,
        notes=tuple(notes),
    )


def _resample_rounds(rounds: int, samples: int, seed: int) -> np.ndarray:
    """How often each round is drawn in each bootstrap sample: `samples` rows of `rounds` draws
    with replacement. (Counting uniform draws is the same multinomial as rng.multinomial,
    and many times faster with thousands of rounds.)"""
    draws = np.random.default_rng(seed).integers(0, rounds, size=(samples, rounds))
    offsets = np.arange(samples)[:, None] * rounds
    return np.bincount((draws + offsets).ravel(), minlength=samples * rounds).reshape(samples, rounds).astype(float)


def _design(battles: Sequence[Battle], index: Mapping[str, int], covariates: np.ndarray,
            prior_ties_per_pair: float) -> tuple[np.ndarray, np.ndarray]:
    """Rows [+1 for a, -1 for b | covariates] and outcomes (a's score), then one virtual tie per
    pair of backends (no covariates): the prior of the plain ratings."""
    size = len(index)
    strengths = np.zeros((len(battles), size))
    rows = np.arange(len(battles))
    strengths[rows, [index[battle.a.backend] for battle in battles]] = 1.0
    strengths[rows, [index[battle.b.backend] for battle in battles]] = -1.0
    pairs = [(i, j) for i in range(size) for j in range(i + 1, size)]
    prior = np.zeros((len(pairs), size + covariates.shape[1]))
    for row, (i, j) in enumerate(pairs):
        prior[row, i], prior[row, j] = 1.0, -1.0
    design = np.concatenate([np.concatenate([strengths, covariates], axis=1), prior])
    outcomes = np.concatenate([[battle.score_a for battle in battles], np.full(len(pairs), 0.5)])
    return design, outcomes


def _fit(design: np.ndarray, outcomes: np.ndarray, weights: np.ndarray, start: np.ndarray,
         ridge: np.ndarray, strengths: int) -> np.ndarray:
    """Maximise each row of `weights`' penalised log-likelihood by Newton's method; returns one
    parameter row (strengths, then coefficients) per row of `weights`.

    The strengths' mean stays where `start` has it: their Hessian block is singular along the
    all-ones direction, and adding ones/k there makes each step keep the mean (the gradient has
    no component along it).

    A full Newton step is kept when the objective still rises at its end (the gradient there
    points along the step: by concavity it rose all the way), which is every step near the
    optimum, as in a warm-started bootstrap. Otherwise the step is halved until the objective
    improves, checked on the objective itself; that costs a second pass over the battles,
    so it is only done for the rows that need it.
    """
    rows, parameters = weights.shape[0], design.shape[1]
    outer = (design[:, :, None] * design[:, None, :]).reshape(len(design), parameters * parameters)
    pin = np.zeros((parameters, parameters))
    pin[:strengths, :strengths] = 1.0 / strengths
    fixed_curvature = np.diag(ridge) + pin
    losses = 1.0 - outcomes

    def win_chances(theta: np.ndarray) -> np.ndarray:
        return 0.5 * (1.0 + np.tanh(0.5 * (theta @ design.T)))  # logistic, without overflow

    def gradient_at(theta: np.ndarray, win_chance: np.ndarray, row_weights: np.ndarray) -> np.ndarray:
        return (row_weights * (outcomes - win_chance)) @ design - ridge * theta

    def objective(theta: np.ndarray, row_weights: np.ndarray) -> np.ndarray:
        # A score y (1, 0.5, 0) adds y log p + (1 - y) log(1 - p) = -log(1 + e^-s) - (1 - y) s.
        scores = theta @ design.T
        fit = -(row_weights * (np.logaddexp(0.0, -scores) + losses * scores)).sum(axis=1)
        return fit - 0.5 * (ridge * theta * theta).sum(axis=1)

    theta = start.astype(float).copy()
    win_chance = win_chances(theta)
    gradient = gradient_at(theta, win_chance, weights)
    for _ in range(_MAX_NEWTON_STEPS):
        curvature = (weights * win_chance * (1.0 - win_chance)) @ outer
        hessian = curvature.reshape(rows, parameters, parameters) + fixed_curvature
        step = np.linalg.solve(hessian, gradient[..., None])[..., 0]
        candidate = theta + step
        new_win_chance = win_chances(candidate)
        new_gradient = gradient_at(candidate, new_win_chance, weights)
        # Past the top along the step, and not by a rounding error at the optimum: check it.
        overshot = np.flatnonzero(((new_gradient * step).sum(axis=1) < 0)
                                  & (np.abs(step).max(axis=1) > _STEP_CHECK_ABOVE))
        if overshot.size:
            held = weights[overshot]
            before = objective(theta[overshot], held)
            scale = np.ones(overshot.size)
            for _ in range(_MAX_STEP_HALVINGS):
                worse = objective(candidate[overshot], held) < before - 1e-12 * np.abs(before)
                if not worse.any():
                    break
                scale[worse] /= 2
                candidate[overshot[worse]] = theta[overshot[worse]] + scale[worse, None] * step[overshot[worse]]
            new_win_chance[overshot] = win_chances(candidate[overshot])
            new_gradient[overshot] = gradient_at(candidate[overshot], new_win_chance[overshot], held)
        moved = np.abs(candidate - theta).max()
        theta, win_chance, gradient = candidate, new_win_chance, new_gradient
        if moved < _NEWTON_STEP_TOLERANCE:
            return theta
    raise RuntimeError(f"The controlled Bradley-Terry fit did not settle in {_MAX_NEWTON_STEPS} Newton steps.")


def _win_share(coefficient: float | np.ndarray, covariate: str) -> float | np.ndarray:
    return 1.0 / (1.0 + np.exp(-coefficient * REFERENCE_DIFFERENCES[covariate]))


def _effect(name: str, coefficient: float, resampled: np.ndarray, differing: int, votes: int) -> Effect:
    tail = (100.0 - INTERVAL_PERCENT) / 2
    low, high = (float(value) for value in np.percentile(resampled, [tail, 100.0 - tail]))
    share_low, share_high = float(_win_share(low, name)), float(_win_share(high, name))
    if low > 0:
        verdict = "favours"
    elif high < 0:
        verdict = "disfavours"
    elif share_high - share_low > WIDE_WIN_SHARE_INTERVAL or votes < FEW_VOTES_CONTROLLED:
        verdict = "too_few_votes"
    else:
        verdict = "no_clear_effect"
    return Effect(name, float(coefficient), low, high, float(_win_share(coefficient, name)), share_low, share_high,
                  differing, verdict)


def _unmeasured(name: str, differing: int) -> Effect:
    return Effect(name, None, None, None, None, None, None, differing, "not_measured")
