"""Ratings from blind votes, on vote sets whose right answers are known by hand."""

import math

import pytest

from core.ratings.ratings import (
    FEW_VOTES_PER_BACKEND,
    FEW_VOTES_TOTAL,
    PRIOR_TIES_PER_PAIR,
    LeaderboardNote,
    PairOutcome,
    ReplyFigures,
    RoundVote,
    bradley_terry,
    build_leaderboard,
    leaderboard_figure,
    leaderboard_table_markdown,
    pairwise_outcomes,
    rate_backends,
    win_matrix_figure,
)


def wins(winner: str, loser: str, times: int) -> list[RoundVote]:
    return [RoundVote((winner, loser), "win", winner)] * times


def ties(first: str, second: str, times: int) -> list[RoundVote]:
    return [RoundVote((first, second), "tie")] * times


def two_backend_gap(score_a: float, score_b: float, prior: float) -> float:
    """Closed form for two backends: each side's score plus half the prior's virtual ties."""
    return 400 * math.log10((score_a + prior / 2) / (score_b + prior / 2))


# A known order: x beats y 8 of 10, y beats z 8 of 10, x beats z 9 of 10.
ORDERED = (
    wins("x", "y", 8) + wins("y", "x", 2)
    + wins("y", "z", 8) + wins("z", "y", 2)
    + wins("x", "z", 9) + wins("z", "x", 1)
)


def test_a_known_order_gives_ordered_ratings_with_intervals_around_them():
    ratings = rate_backends(ORDERED, bootstrap_samples=500, seed=1)
    assert ratings["x"].rating > ratings["y"].rating > ratings["z"].rating
    for rating in ratings.values():
        assert rating.ci_low < rating.rating < rating.ci_high
    assert sum(r.rating for r in ratings.values()) / 3 == pytest.approx(1000.0, abs=1e-9)


@pytest.mark.parametrize(
    "votes",
    [
        wins("a", "b", 3) + wins("b", "a", 3) + wins("b", "c", 2) + wins("c", "b", 2) + wins("a", "c", 1) + wins("c", "a", 1),
        ties("a", "b", 4) + [RoundVote(("a", "b", "c"), "tie")] * 2 + [RoundVote(("c", "a"), "both_bad")],
        # a beats b, b beats c, c beats a: a cycle is as symmetric as a tie.
        wins("a", "b", 5) + wins("b", "c", 5) + wins("c", "a", 5),
    ],
    ids=["equal-wins-both-ways", "all-ties", "cycle"],
)
def test_symmetric_votes_give_equal_ratings_at_1000(votes):
    ratings = rate_backends(votes, bootstrap_samples=10)
    for rating in ratings.values():
        assert rating.rating == pytest.approx(1000.0, abs=1e-6)


@pytest.mark.parametrize(
    "wins_a, wins_b, tie_count, prior",
    [(1, 0, 0, PRIOR_TIES_PER_PAIR), (7, 3, 0, PRIOR_TIES_PER_PAIR), (1, 0, 2, 1.0), (5, 2, 3, 4.0), (6, 2, 2, 1e-6)],
)
def test_two_backends_match_the_closed_form(wins_a, wins_b, tie_count, prior):
    pairs = (
        [PairOutcome("a", "b", 1.0)] * wins_a
        + [PairOutcome("b", "a", 1.0)] * wins_b
        + [PairOutcome("a", "b", 0.5)] * tie_count
    )
    ratings = bradley_terry(pairs, ["a", "b"], prior_ties_per_pair=prior)
    expected = two_backend_gap(wins_a + tie_count / 2, wins_b + tie_count / 2, prior)
    assert ratings["a"] - ratings["b"] == pytest.approx(expected, abs=1e-6)
    assert (ratings["a"] + ratings["b"]) / 2 == pytest.approx(1000.0)


def test_a_tie_counts_as_half_a_win_for_each_side():
    one_win_two_ties = rate_backends(wins("a", "b", 1) + ties("a", "b", 2), bootstrap_samples=1)
    two_wins_one_loss = rate_backends(wins("a", "b", 2) + wins("b", "a", 1), bootstrap_samples=1)
    assert one_win_two_ties["a"].rating == pytest.approx(two_wins_one_loss["a"].rating, abs=1e-9)
    assert one_win_two_ties["a"].rating - one_win_two_ties["b"].rating == pytest.approx(
        two_backend_gap(2, 1, PRIOR_TIES_PER_PAIR)
    )


def test_a_backend_that_never_lost_still_has_a_finite_rating():
    ratings = rate_backends(wins("a", "b", 3), bootstrap_samples=50)
    assert ratings["a"].rating - ratings["b"].rating == pytest.approx(two_backend_gap(3, 0, PRIOR_TIES_PER_PAIR))


def test_rounds_expand_to_the_right_pairwise_outcomes():
    four_column_win = pairwise_outcomes(RoundVote(("a", "b", "c", "d"), "win", "c"))
    assert sorted((p.backend, p.opponent, p.backend_score) for p in four_column_win) == [
        ("c", "a", 1.0), ("c", "b", 1.0), ("c", "d", 1.0)
    ]
    three_column_tie = pairwise_outcomes(RoundVote(("a", "b", "c"), "tie"))
    assert {(p.backend, p.opponent) for p in three_column_tie} == {("a", "b"), ("a", "c"), ("b", "c")}
    assert all(p.backend_score == 0.5 for p in three_column_tie)
    four_column_all_bad = pairwise_outcomes(RoundVote(("a", "b", "c", "d"), "both_bad"))
    assert len(four_column_all_bad) == 6 and all(p.backend_score == 0.5 for p in four_column_all_bad)


def test_both_bad_rates_like_a_tie_but_is_counted_on_its_own():
    base = wins("a", "b", 3) + wins("b", "a", 1)
    as_tie = build_leaderboard(base + ties("a", "b", 2), [], bootstrap_samples=1)
    as_both_bad = build_leaderboard(base + [RoundVote(("a", "b"), "both_bad")] * 2, [], bootstrap_samples=1)
    assert as_both_bad.row("a").rating == pytest.approx(as_tie.row("a").rating, abs=1e-9)
    assert as_tie.row("a").both_bad == 0 and as_tie.row("a").ties == 2
    assert as_both_bad.row("a").both_bad == 2 and as_both_bad.row("a").ties == 2


MIXED = [
    RoundVote(("a", "b", "c", "d"), "win", "a", verdicts=("good", "bad", "bad", None), comment="a was concise"),
    RoundVote(("b", "c", "a"), "win", "b"),
    RoundVote(("a", "b"), "tie"),
    RoundVote(("c", "d", "a"), "both_bad", verdicts=("bad", "bad", "bad")),
    RoundVote(("d", "a"), "win", "d", comment="  "),
]


def test_round_level_counts_and_head_to_head_records_are_exact():
    board = build_leaderboard(MIXED, [], bootstrap_samples=20)
    expected = {  # votes, wins, ties, losses, both_bad, good verdicts, bad verdicts
        "a": (5, 1, 2, 2, 1, 1, 1),
        "b": (3, 1, 1, 1, 0, 0, 1),
        "c": (3, 0, 1, 2, 1, 0, 2),
        "d": (3, 1, 1, 1, 1, 0, 1),
    }
    for name, figures in expected.items():
        row = board.row(name)
        assert (row.votes, row.wins, row.ties, row.losses, row.both_bad, row.good_verdicts, row.bad_verdicts) == figures
    # a vs b: a won round 1, lost round 2, tied round 3 -> 1.5 of 3.
    assert (board.matchup("a", "b").wins, board.matchup("a", "b").comparisons) == (1.5, 3)
    assert board.matchup("b", "a").wins == 1.5
    # a vs d: won round 1, tied round 4 (both_bad), lost round 5 -> 1.5 of 3.
    assert (board.matchup("a", "d").wins, board.matchup("a", "d").comparisons) == (1.5, 3)
    # c vs d: round 1 (a won: no c-d comparison), round 4 tie -> 0.5 of 1.
    assert (board.matchup("c", "d").wins, board.matchup("c", "d").comparisons) == (0.5, 1)
    assert board.matchup("c", "d").win_rate == 0.5
    assert len(board.matchups) == 4 * 3
    assert board.total_votes == 5 and board.commented_votes == 1


@pytest.mark.parametrize(
    "make_vote, message",
    [
        (lambda: RoundVote(("a", "b"), "win", "c"), "Winner 'c' is not one of this round's backends"),
        (lambda: RoundVote(("a", "b"), "win"), "needs the winning backend's name"),
        (lambda: RoundVote(("a", "b", "a"), "tie"), "'a' appears more than once"),
        (lambda: RoundVote(("a",), "tie"), "2 to 4 columns, got 1"),
        (lambda: RoundVote(("a", "b", "c", "d", "e"), "tie"), "2 to 4 columns, got 5"),
        (lambda: RoundVote(("a", "b"), "tie", "a"), "has no winner"),
        (lambda: RoundVote(("a", "b"), "draw"), "Unknown outcome 'draw'"),
        (lambda: RoundVote(("a", ""), "tie"), "non-empty strings"),
        (lambda: RoundVote(("a", "b"), "tie", verdicts=("good",)), "one verdict per column"),
        (lambda: RoundVote(("a", "b"), "tie", verdicts=("good", "meh")), "Unknown verdict 'meh'"),
    ],
)
def test_invalid_votes_fail_with_a_clear_message(make_vote, message):
    with pytest.raises(ValueError, match=message):
        make_vote()


def test_a_vote_given_lists_is_stored_as_tuples():
    vote = RoundVote(["a", "b"], "win", "a", verdicts=["good", None])
    assert vote.backends == ("a", "b") and vote.verdicts == ("good", None)
    hash(vote)


def test_nothing_to_rate_gives_no_ratings():
    assert bradley_terry([], []) == {}
    assert rate_backends([]) == {}


def test_fitting_rejects_names_outside_the_rated_set_and_a_missing_prior():
    with pytest.raises(ValueError, match="'c', which is not among the rated backends"):
        bradley_terry([PairOutcome("a", "c", 1.0)], ["a", "b"])
    with pytest.raises(ValueError, match="prior_ties_per_pair must be positive"):
        bradley_terry([PairOutcome("a", "b", 1.0)], ["a", "b"], prior_ties_per_pair=0.0)


def test_the_point_rating_is_the_fit_of_the_expanded_pairs():
    ratings = rate_backends(MIXED, bootstrap_samples=1)
    direct = bradley_terry([p for vote in MIXED for p in pairwise_outcomes(vote)], ["a", "b", "c", "d"])
    for name, rating in ratings.items():
        assert rating.rating == pytest.approx(direct[name], abs=1e-9)


def test_the_bootstrap_is_reproducible_with_a_seed():
    first = rate_backends(ORDERED, bootstrap_samples=200, seed=7)
    again = rate_backends(ORDERED, bootstrap_samples=200, seed=7)
    other = rate_backends(ORDERED, bootstrap_samples=200, seed=8)
    assert first == again
    assert first != other


def test_the_interval_narrows_with_more_votes():
    few = rate_backends(ORDERED, bootstrap_samples=500, seed=3)
    many = rate_backends(ORDERED * 10, bootstrap_samples=500, seed=3)
    for name in ("x", "y", "z"):
        width_few = few[name].ci_high - few[name].ci_low
        width_many = many[name].ci_high - many[name].ci_low
        # About 1/sqrt(10) as wide; the margin keeps bootstrap noise out of it.
        assert width_many < 0.5 * width_few


def test_identical_rounds_leave_no_uncertainty_to_resample():
    ratings = rate_backends(wins("a", "b", 6), bootstrap_samples=100)
    for rating in ratings.values():
        assert rating.ci_low == pytest.approx(rating.rating) and rating.ci_high == pytest.approx(rating.rating)


def notes_with(board, *keys):
    return [note for note in board.notes if note.key in keys]


def test_the_few_votes_note_disappears_at_the_threshold():
    balanced = wins("a", "b", 1) + wins("b", "a", 1)
    below = build_leaderboard((balanced * FEW_VOTES_TOTAL)[: FEW_VOTES_TOTAL - 1], [], bootstrap_samples=1)
    at = build_leaderboard((balanced * FEW_VOTES_TOTAL)[:FEW_VOTES_TOTAL], [], bootstrap_samples=1)
    assert notes_with(below, "few_votes") == [
        LeaderboardNote("few_votes", {"votes": FEW_VOTES_TOTAL - 1, "enough": FEW_VOTES_TOTAL})]
    assert notes_with(at, "few_votes") == []


def test_a_backend_with_few_votes_is_named_until_it_has_enough():
    crowd = wins("a", "b", 10) + wins("b", "a", 10)
    newcomer = wins("new", "a", 1) + wins("a", "new", 1)
    short = build_leaderboard(crowd + newcomer * 2, [], bootstrap_samples=1)  # 4 votes
    enough = build_leaderboard(crowd + newcomer * 2 + ties("new", "b", 1), [], bootstrap_samples=1)  # 5 votes
    assert notes_with(short, "few_backend_votes") == [
        LeaderboardNote("few_backend_votes", {"backend": "new", "votes": 4, "enough": FEW_VOTES_PER_BACKEND})]
    assert notes_with(enough, "few_backend_votes") == []


def test_a_backend_that_only_won_or_only_lost_gets_a_note_until_it_does_not():
    one_sided = build_leaderboard(wins("a", "b", 6), [], bootstrap_samples=1)
    assert notes_with(one_sided, "won_every_round", "lost_every_round") == [
        LeaderboardNote("won_every_round", {"backend": "a", "votes": 6}),
        LeaderboardNote("lost_every_round", {"backend": "b", "votes": 6}),
    ]
    with_a_tie = build_leaderboard(wins("a", "b", 6) + ties("a", "b", 1), [], bootstrap_samples=1)
    assert notes_with(with_a_tie, "won_every_round", "lost_every_round") == []


def test_an_empty_leaderboard_says_how_to_start():
    board = build_leaderboard([], [ReplyFigures("tgi", 0.2, 30.0)])
    assert board.notes == (LeaderboardNote("no_votes"), LeaderboardNote("unvoted_backend", {"backend": "tgi"}))
    assert board.matchups == ()
    row = board.row("tgi")
    assert (row.rating, row.ci_low, row.ci_high, row.votes) == (None, None, None, 0)


def test_the_leaderboard_message_speaks_the_persons_language():
    from core.ratings.board import plain_markdown

    board = build_leaderboard(MIXED + wins("a", "new", 1), [ReplyFigures("idle", 0.1, 10.0)], bootstrap_samples=1)
    english = plain_markdown(board, unrated_votes=2, lang="en")
    chinese = plain_markdown(board, unrated_votes=2, lang="zh")
    assert "Only 6 vote(s) so far" in english and "new lost every round it was in (1)" in english
    assert "idle has replies but no votes yet" in english
    assert "1 of 6 blind vote(s) came with a comment." in english
    assert "| Judged good | Judged bad |" in english
    assert "目前只有 6 票" in chinese and "new 输了它参加的每一轮（1 轮）" in chinese
    assert "idle 有回复但还没有投票" in chinese and "6 次盲评投票中有 1 次附有评论。" in chinese
    assert "| 评为好 | 评为差 |" in chinese
    for english_words in ("Only", "every round", "no votes yet", "comment", "Judged", "Backend"):
        assert english_words not in chinese, english_words
    # Every note the ratings can give has both texts.
    from core.texts import STRINGS

    for key in ("no_votes", "few_votes", "unvoted_backend", "few_backend_votes", "won_every_round",
                "lost_every_round"):
        assert f"leaderboard_note_{key}" in STRINGS["en"] and f"leaderboard_note_{key}" in STRINGS["zh"]


def test_median_figures_skip_unknown_values_and_unrated_backends_come_last():
    figures = [
        ReplyFigures("a", 0.3, 20.0),
        ReplyFigures("a", 0.1, None),
        ReplyFigures("a", None, 40.0),
        ReplyFigures("a", 0.2, 10.0),
        ReplyFigures("b", None, None),
        ReplyFigures("solo", 0.5, 99.0),
    ]
    board = build_leaderboard(wins("b", "a", 3) + wins("a", "b", 1), figures, bootstrap_samples=1)
    a, b, solo = board.row("a"), board.row("b"), board.row("solo")
    assert a.median_first_token_s == pytest.approx(0.2)  # of 0.1, 0.2, 0.3
    assert a.median_decode_tokens_per_s == pytest.approx(20.0)  # of 10, 20, 40
    assert a.replies == 4
    assert (b.median_first_token_s, b.median_decode_tokens_per_s, b.replies) == (None, None, 1)
    assert (solo.median_first_token_s, solo.median_decode_tokens_per_s, solo.rating) == (0.5, 99.0, None)
    assert [row.backend for row in board.rows] == ["b", "a", "solo"]
    assert [row.backend for row in board.rated_rows] == ["b", "a"]


def test_unknown_names_fail_with_the_known_ones():
    board = build_leaderboard(wins("a", "b", 1), [], bootstrap_samples=1)
    with pytest.raises(ValueError, match=r"known: \['a', 'b'\]"):
        board.row("c")
    with pytest.raises(ValueError, match="rated backends"):
        board.matchup("a", "c")


def test_the_markdown_table_has_units_and_one_line_per_backend():
    figures = [ReplyFigures("vllm|fast", 0.25, 41.26), ReplyFigures("tgi", 0.5, 20.0), ReplyFigures("idle", None, None)]
    board = build_leaderboard(wins("vllm|fast", "tgi", 3) + wins("tgi", "vllm|fast", 1), figures, bootstrap_samples=50)
    lines = leaderboard_table_markdown(board).splitlines()
    assert "Median TTFT (ms)" in lines[0] and "Median decode (tokens/s)" in lines[0]
    assert len(lines) == 2 + 3
    top = board.rows[0]
    cells = [cell.strip() for cell in lines[2].strip("|").split(" | ")]
    assert cells[:4] == ["1", "vllm\\|fast", f"{top.rating:.0f}", f"{top.ci_low:.0f} – {top.ci_high:.0f}"]
    assert cells[4:] == ["4", "3", "0", "1", "0", "0", "0", "250", "41.3", "1"]
    assert lines[4].startswith("| – | idle | – | – | 0 |")


def test_the_table_shows_each_backends_good_and_bad_judgements():
    board = build_leaderboard(MIXED, [], bootstrap_samples=1)
    lines = leaderboard_table_markdown(board).splitlines()
    titles = [cell.strip() for cell in lines[0].strip("|").split(" | ")]
    good, bad = titles.index("Judged good"), titles.index("Judged bad")
    judged = {}
    for line in lines[2:]:
        cells = [cell.strip() for cell in line.strip("|").split(" | ")]
        judged[cells[1]] = (int(cells[good]), int(cells[bad]))
    assert judged == {"a": (1, 1), "b": (0, 1), "c": (0, 2), "d": (0, 1)}
    with pytest.raises(ValueError, match="14 columns"):
        leaderboard_table_markdown(board, ["#", "Backend"])


def test_the_rating_figure_shows_each_rating_with_its_interval():
    figures = [ReplyFigures("idle", 0.1, 10.0)]  # unrated: not on the rating axis
    board = build_leaderboard(ORDERED, figures, bootstrap_samples=200)
    figure = leaderboard_figure(board)
    assert len(figure.data) == 1
    dots = figure.data[0]
    rated = board.rated_rows
    assert list(dots.y) == ["x", "y", "z"]
    assert list(dots.x) == pytest.approx([row.rating for row in rated])
    assert list(dots.error_x.array) == pytest.approx([row.ci_high - row.rating for row in rated])
    assert list(dots.error_x.arrayminus) == pytest.approx([row.rating - row.ci_low for row in rated])
    assert "Rating (points" in figure.layout.xaxis.title.text


def test_the_win_matrix_figure_shows_row_versus_column_win_rates():
    votes = wins("a", "b", 3) + wins("b", "a", 1) + ties("b", "c", 2)
    board = build_leaderboard(votes, [], bootstrap_samples=1)
    figure = win_matrix_figure(board)
    assert len(figure.data) == 1
    heatmap = figure.data[0]
    names = list(heatmap.y)
    assert names == [row.backend for row in board.rated_rows] == list(heatmap.x)
    z = {(names[i], names[j]): heatmap.z[i][j] for i in range(3) for j in range(3)}
    assert z[("a", "b")] == pytest.approx(0.75) and z[("b", "a")] == pytest.approx(0.25)
    assert z[("b", "c")] == pytest.approx(0.5)
    assert z[("a", "c")] is None and z[("a", "a")] is None  # never met; itself
    assert figure.layout.xaxis.title.text == "Opponent (column)"


@pytest.mark.parametrize("intervals, expected", [
    # Overlapping intervals share a rank.
    ({"a": (1000, 1100), "b": (1050, 1150), "c": (990, 1060)}, {"a": 1, "b": 1, "c": 1}),
    # b's whole interval is above a's: a is second; c is behind both.
    ({"a": (950, 1000), "b": (1010, 1080), "c": (800, 900)}, {"b": 1, "a": 2, "c": 3}),
    # c overlaps a but not b: one backend wholly above it, so rank 2, like a.
    ({"b": (1100, 1200), "a": (1000, 1090), "c": (950, 1050)}, {"b": 1, "a": 2, "c": 2}),
    # Touching bounds overlap (a lower bound must be strictly above).
    ({"a": (1000, 1100), "b": (1100, 1200)}, {"a": 1, "b": 1}),
    ({"solo": (900, 1100)}, {"solo": 1}),
    ({}, {}),
])
def test_ranks_respect_the_intervals(intervals, expected):
    from core.ratings.ratings import interval_ranks

    assert interval_ranks(intervals) == expected


def test_the_table_shows_the_interval_rank_so_overlapping_backends_share_it():
    votes = wins("a", "b", 6) + wins("b", "a", 5) + wins("a", "c", 30) + wins("b", "c", 30)
    board = build_leaderboard(votes, [], bootstrap_samples=300, seed=2)
    a, b, c = board.row("a"), board.row("b"), board.row("c")
    assert a.ci_low < b.ci_high and b.ci_low < a.ci_high  # a and b overlap
    assert (a.rank, b.rank, c.rank) == (1, 1, 3)
    lines = leaderboard_table_markdown(board).splitlines()[2:]
    assert [line.split(" | ")[0].strip("| ") for line in lines] == ["1", "1", "3"]


def test_the_rating_figure_shows_the_controlled_ratings_beside_the_plain_ones():
    from core.ratings.ratings import Rating

    board = build_leaderboard(ORDERED, [], bootstrap_samples=50)
    controlled = {"x": Rating("x", 1010.0, 990.0, 1030.0), "z": Rating("z", 995.0, 980.0, 1010.0)}
    figure = leaderboard_figure(board, controlled)
    plain, held = figure.data
    assert list(held.y) == ["x", "z"] and list(held.x) == [1010.0, 995.0]
    assert list(held.error_x.array) == [20.0, 15.0] and list(held.error_x.arrayminus) == [20.0, 15.0]
    assert "equal speed, length and style" in held.name and figure.layout.showlegend
