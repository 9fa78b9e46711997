"""Controlled ratings on synthetic battles whose truth is known: who wins by speed, by quality, by length."""

import math
import random
from dataclasses import replace

import pytest

from core.ratings.battles import Battle, MarkdownCounts, Side
from core.ratings.controlled import (
    FEW_VOTES_CONTROLLED,
    covariate_value,
    normalised_difference,
    parse_controls,
    rate_with_controls,
)
from core.ratings.ratings import PairOutcome, bradley_terry, interval_ranks

BACKENDS = ("fast", "mid", "slow")
DECODE_TOKENS_PER_S = {"fast": 60.0, "mid": 30.0, "slow": 15.0}


def overlap(first, second) -> bool:
    return first.ci_low <= second.ci_high and second.ci_low <= first.ci_high


def battles(rounds: int, seed: int, *, chance_a_wins, reveal: str = "live", spread: float = 0.8,
            speeds=DECODE_TOKENS_PER_S, tie_share: float = 0.1) -> list[Battle]:
    """Two random backends per round, each reply's decode speed its backend's times a lognormal
    factor (load, prompt), so speed differs within a pair too; `chance_a_wins(a, b)` decides."""
    rng = random.Random(seed)
    made = []
    for number in range(rounds):
        first, second = rng.sample(sorted(speeds), 2)
        a = Side(first, tokens=rng.randint(80, 240), first_token_s=0.3 * math.exp(rng.gauss(0, 0.5)),
                 decode_tokens_per_s=speeds[first] * math.exp(rng.gauss(0, spread)))
        b = Side(second, tokens=rng.randint(80, 240), first_token_s=0.3 * math.exp(rng.gauss(0, 0.5)),
                 decode_tokens_per_s=speeds[second] * math.exp(rng.gauss(0, spread)))
        draw = rng.random()
        if draw < tie_share:
            winner = "tie"
        else:
            winner = "model_a" if rng.random() < chance_a_wins(a, b) else "model_b"
        made.append(Battle(f"round-{number}", a, b, winner, reveal=reveal))
    return made


def speed_decides(a: Side, b: Side) -> float:
    """Equal quality: twice the decode speed gives 80% of the votes."""
    return 1 / (1 + math.exp(-2.0 * math.log2(a.decode_tokens_per_s / b.decode_tokens_per_s)))


QUALITY = {"fast": -0.8, "mid": 0.0, "slow": 0.8}  # the slow engine serves the best model


def quality_decides(a: Side, b: Side) -> float:
    return 1 / (1 + math.exp(-(QUALITY[a.backend] - QUALITY[b.backend])))


@pytest.fixture(scope="module")
def won_by_speed():
    return battles(800, seed=11, chance_a_wins=speed_decides)


def test_when_speed_alone_decides_plain_ratings_separate_the_backends_and_controlled_ones_do_not(won_by_speed):
    plain = rate_with_controls(won_by_speed, (), bootstrap_samples=300, seed=1)
    controlled = rate_with_controls(won_by_speed, ("speed",), bootstrap_samples=300, seed=1)
    fast, slow = plain.ratings["fast"], plain.ratings["slow"]
    assert fast.ci_low > plain.ratings["mid"].ci_high and plain.ratings["mid"].ci_low > slow.ci_high
    assert plain.ranks == {"fast": 1, "mid": 2, "slow": 3}
    for first in BACKENDS:
        for second in BACKENDS:
            assert overlap(controlled.ratings[first], controlled.ratings[second]), (first, second)
    assert controlled.ranks == {"fast": 1, "mid": 1, "slow": 1}
    decode = controlled.effect("decode")
    assert decode.coefficient > 0 and decode.ci_low > 0 and decode.verdict == "favours"
    assert 0.65 < decode.win_share < 0.9  # the truth is 80% (ties aside)
    # First-token times were drawn the same for every backend: no clear effect.
    assert controlled.effect("first_token").ci_low < 0 < controlled.effect("first_token").ci_high


def test_when_speed_was_hidden_the_same_votes_carry_no_speed_effect(won_by_speed):
    hidden = [replace(battle, reveal="finished") for battle in won_by_speed]
    plain = rate_with_controls(hidden, (), bootstrap_samples=50, seed=1)
    controlled = rate_with_controls(hidden, ("speed",), bootstrap_samples=50, seed=1)
    assert {name: r.rating for name, r in controlled.ratings.items()} == pytest.approx(
        {name: r.rating for name, r in plain.ratings.items()}, abs=1e-6)
    assert [e.verdict for e in controlled.effects] == ["not_measured", "not_measured"]
    assert controlled.speed_hidden_votes == 800
    assert controlled.notes == ()  # the effects already say "not measured"
    half_hidden = rate_with_controls(hidden[:400] + won_by_speed[400:], ("speed",), bootstrap_samples=20)
    assert [(note.key, note.values) for note in half_hidden.notes] == [("speed_hidden", {"hidden": 400, "votes": 800})]


def test_when_quality_decides_and_speed_is_random_controlled_and_plain_agree():
    same_speed = {name: 30.0 for name in BACKENDS}
    votes = battles(800, seed=12, chance_a_wins=quality_decides, speeds=same_speed)
    plain = rate_with_controls(votes, (), bootstrap_samples=300, seed=2)
    controlled = rate_with_controls(votes, ("speed", "length"), bootstrap_samples=300, seed=2)
    order = sorted(BACKENDS, key=lambda name: -plain.ratings[name].rating)
    assert order == ["slow", "mid", "fast"]
    assert sorted(BACKENDS, key=lambda name: -controlled.ratings[name].rating) == order
    for name in BACKENDS:
        assert controlled.ratings[name].rating == pytest.approx(plain.ratings[name].rating, abs=15)
    assert controlled.ranks == plain.ranks == {"slow": 1, "mid": 2, "fast": 3}
    # No covariate sways the votes: each shows no clear effect (a 95% interval misses the truth
    # in about one seed in twenty, as it should; the effect must then at least be tiny).
    for covariate in ("first_token", "decode", "length"):
        effect = controlled.effect(covariate)
        assert effect.verdict == "no_clear_effect" or abs(effect.win_share - 0.5) < 0.05, effect


def test_a_longer_reply_winning_at_equal_quality_shows_as_a_length_effect():
    def longer_wins(a: Side, b: Side) -> float:
        return 1 / (1 + math.exp(-6.0 * normalised_difference(a.tokens, b.tokens)))

    votes = battles(600, seed=13, chance_a_wins=longer_wins, reveal="finished")
    controlled = rate_with_controls(votes, ("length", "style"), bootstrap_samples=200, seed=3)
    length = controlled.effect("length")
    assert length.ci_low > 0 and length.verdict == "favours"
    assert [controlled.effect(name).verdict for name in ("headers", "lists", "bold")] == ["not_measured"] * 3


def test_without_covariates_the_fit_is_the_plain_bradley_terry_fit(won_by_speed):
    controlled = rate_with_controls(won_by_speed, (), bootstrap_samples=1)
    pairs = [PairOutcome(b.a.backend, b.b.backend, b.score_a) for b in won_by_speed]
    plain = bradley_terry(pairs, list(BACKENDS))
    for name in BACKENDS:
        assert controlled.ratings[name].rating == pytest.approx(plain[name], abs=1e-6)
    assert controlled.effects == ()


def test_swapping_the_sides_of_every_battle_changes_nothing(won_by_speed):
    flipped = {"model_a": "model_b", "model_b": "model_a", "tie": "tie"}
    swapped = [replace(b, a=b.b, b=b.a, winner=flipped[b.winner]) for b in won_by_speed[:300]]
    first = rate_with_controls(won_by_speed[:300], bootstrap_samples=100, seed=4)
    second = rate_with_controls(swapped, bootstrap_samples=100, seed=4)
    for name in BACKENDS:
        assert second.ratings[name].rating == pytest.approx(first.ratings[name].rating, abs=1e-6)
        assert second.ratings[name].ci_low == pytest.approx(first.ratings[name].ci_low, abs=1e-6)
    for ours, theirs in zip(first.effects, second.effects):
        assert theirs.coefficient == pytest.approx(ours.coefficient, abs=1e-9) or ours.coefficient is None


def test_the_same_battles_and_seed_give_the_same_result(won_by_speed):
    votes = won_by_speed[:200]
    assert rate_with_controls(votes, bootstrap_samples=60, seed=9) == rate_with_controls(
        votes, bootstrap_samples=60, seed=9)
    assert rate_with_controls(votes, bootstrap_samples=60, seed=9) != rate_with_controls(
        votes, bootstrap_samples=60, seed=10)


def test_the_bootstrap_resamples_rounds_not_battles():
    # One round of three columns gives three battles; copies of it are one kind of round, so
    # resampling rounds leaves no uncertainty while resampling battles would.
    a, b, c = Side("a", tokens=100), Side("b", tokens=50), Side("c", tokens=10)
    rounds = []
    for number in range(30):
        rounds += [Battle(f"r{number}", a, b, "tie"), Battle(f"r{number}", a, c, "tie"),
                   Battle(f"r{number}", b, c, "tie")]
    result = rate_with_controls(rounds, ("length",), bootstrap_samples=50)
    assert result.votes == 30 and result.battles == 90
    for rating in result.ratings.values():
        assert rating.ci_low == pytest.approx(rating.rating, abs=1e-6)
        assert rating.ci_high == pytest.approx(rating.rating, abs=1e-6)


def test_few_votes_are_said_to_be_too_few_to_tell():
    votes = battles(12, seed=14, chance_a_wins=speed_decides)
    result = rate_with_controls(votes, ("speed",), bootstrap_samples=100)
    assert result.notes[0].key == "controlled_few_votes"
    assert result.notes[0].values == {"votes": 12, "enough": FEW_VOTES_CONTROLLED}
    assert result.effect("decode").verdict in ("too_few_votes", "favours")
    assert result.effect("first_token").verdict == "too_few_votes"


def test_votes_not_blind_or_set_apart_are_not_counted():
    votes = battles(40, seed=15, chance_a_wins=speed_decides)
    named = [replace(battle, anony=False) for battle in votes[:10]]
    set_apart = [replace(battle, rated=False, unrated_reason="comment_names_backend") for battle in votes[10:20]]
    result = rate_with_controls(named + set_apart + votes[20:], bootstrap_samples=20)
    assert (result.votes, result.battles) == (20, 20)
    assert rate_with_controls(named, bootstrap_samples=5).ratings == {}


@pytest.mark.parametrize("covariate, a, b, reveal, expected", [
    ("decode", dict(decode_tokens_per_s=40.0), dict(decode_tokens_per_s=20.0), "live", 1.0),
    ("decode", dict(decode_tokens_per_s=40.0), dict(decode_tokens_per_s=20.0), "finished", 0.0),
    ("decode", dict(decode_tokens_per_s=40.0), dict(decode_tokens_per_s=None), "live", 0.0),
    ("first_token", dict(first_token_s=0.25), dict(first_token_s=1.0), "live", 2.0),
    ("first_token", dict(first_token_s=0.25), dict(first_token_s=1.0), None, 0.0),
    ("length", dict(tokens=200), dict(tokens=100), "finished", 100 / 301),
    ("length", dict(tokens=None), dict(tokens=100), "finished", 0.0),
    ("bold", dict(markdown=MarkdownCounts(bold={"**": 2, "__": 1})), dict(), None, 3 / 4),
    ("lists", dict(), dict(markdown=MarkdownCounts(lists={"ordered": 1, "unordered": 4})), None, -5 / 6),
])
def test_each_covariate_is_the_difference_the_voter_could_see(covariate, a, b, reveal, expected):
    battle = Battle("r", Side("x", **a), Side("y", **b), "tie", reveal=reveal)
    assert covariate_value(covariate, battle) == pytest.approx(expected)


def test_controls_are_named_and_unknown_ones_fail_with_the_known_ones():
    assert parse_controls("speed, style") == ("speed", "style")
    assert parse_controls("none") == parse_controls("") == ()
    with pytest.raises(ValueError, match="Unknown control 'colour': choose from speed, length, style"):
        parse_controls("speed,colour")
    with pytest.raises(ValueError, match="Unknown control"):
        rate_with_controls([], ("colour",))


def test_controlled_ranks_use_the_same_rule_as_the_plain_ones(won_by_speed):
    result = rate_with_controls(won_by_speed, ("length",), bootstrap_samples=100)
    assert result.ranks == interval_ranks({n: (r.ci_low, r.ci_high) for n, r in result.ratings.items()})
