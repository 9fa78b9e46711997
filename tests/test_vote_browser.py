"""The whole vote in a real browser, and the compare, vote and leaderboard screens in Chinese.

Three paced OpenAI-protocol servers at three speeds stand in for three engines, in a blind round
run all at once. The person clicks what a voter clicks - a good or bad mark per column (changing
one), a comment, "All bad" or a column's "better" - and the vote stored in the database is asserted
whole: outcome, winner, every mark, the comment. The reveal modes are told apart by what the page
showed while the columns streamed: "live" shows each column's text as it comes, "finished" none
before every column is done (each the other's control). A column marked bad cannot win: the
vote bar says so and nothing is stored until the mark changes. In a Chinese browser the round, its
vote bar and the leaderboard show the Chinese strings, and none of the English ones they replace.
"""

from __future__ import annotations

import re
from typing import Iterator

import pytest
from playwright.sync_api import Page, expect

from core.ratings.texts import STRINGS as LEADERBOARD_STRINGS
from servers.app import AppServer, backend_env
from servers.paced_openai import PacedServer, start_paced_server
from tests.fixtures_app import stored_when
from tests.test_chinese_strings import SAME_IN_BOTH, element_tables
from tests.test_compare_browser import SNAPSHOT_JS, open_chat, send, watch_round

pytestmark = pytest.mark.slow

NAMES = {"alpha": "Alpha Engine", "beta": "Beta Engine", "gamma": "Gamma Engine"}  # no word a comment below uses
RATES = (20.0, 12.0, 8.0)  # tokens/s: 30 tokens take 1.5, 2.5 and 3.75 s
MODEL = "paced-test-model"


@pytest.fixture(scope="module")
def three_engines() -> Iterator[list[PacedServer]]:
    servers = []
    try:
        for name, rate in zip(NAMES, RATES):
            servers.append(start_paced_server(rate_tokens_per_s=rate, tokens=30, name=f"paced-vote-{name}"))
        yield servers
    finally:
        for server in servers:
            server.stop()


def vote_app(app_factory, engines: list[PacedServer], database: str, reveal: str) -> AppServer:
    env = {"BACKENDS": ",".join(NAMES), "DEFAULT_MODE": "blind", "DEFAULT_COMPARE_BACKENDS": ",".join(NAMES),
           "DEFAULT_RUN_ORDER": "concurrent", "DEFAULT_REVEAL": reveal, "DEFAULT_SYSTEM_PROMPT": "none",
           "DATABASE_URL": database}
    for (name, label), server in zip(NAMES.items(), engines):
        env.update(backend_env(name, kind="openai", base_url=server.base_url, label=label))
    return app_factory(env, name=f"chainlit-vote-{reveal}")


@pytest.fixture(scope="module")
def live_db(tmp_path_factory) -> str:
    return f"sqlite:///{tmp_path_factory.mktemp('vote-live') / 'lab.db'}"


@pytest.fixture(scope="module")
def finished_db(tmp_path_factory) -> str:
    return f"sqlite:///{tmp_path_factory.mktemp('vote-finished') / 'lab.db'}"


@pytest.fixture(scope="module")
def live_app(app_factory, three_engines, live_db) -> AppServer:
    return vote_app(app_factory, three_engines, live_db, "live")


@pytest.fixture(scope="module")
def finished_app(app_factory, three_engines, finished_db) -> AppServer:
    return vote_app(app_factory, three_engines, finished_db, "finished")


def shown_before_the_end(snapshots: list[dict]) -> list[str]:
    """Column texts the page showed while some column was still generating."""
    return [column["text"] for snapshot in snapshots if not all(c["state"] == "completed" for c in snapshot["columns"])
            for column in snapshot["columns"] if column["text"]]


def votes_of(database: str, round_count: int) -> list:
    return stored_when(database, "votes", until=lambda rows: len(rows) == round_count)


def test_live_reveal_shows_text_as_it_streams_and_all_bad_stores_each_mark_and_the_comment(
        page: Page, live_app: AppServer, live_db: str):
    open_chat(page, live_app, MODEL)
    send(page, "Name three rivers.")
    snapshots = watch_round(page, 0)
    # Live: text on the page while a slower column still generates; never a name before the vote.
    assert shown_before_the_end(snapshots), "no text was shown before every column had finished"
    assert all(s["blind"] and not s["revealed"] and all(c["backend"] is None for c in s["columns"]) for s in snapshots)
    assert [c["label"] for c in snapshots[-1]["columns"]] == ["A", "B", "C"]

    expect(page.locator('[data-testid="vote-both-bad"]')).to_have_text("All bad")  # three columns
    page.locator('[data-testid="judge-A-good"]').check()
    page.locator('[data-testid="judge-A-bad"]').check()  # a change of mind: one mark per column
    expect(page.locator('[data-testid="judge-A-good"]')).not_to_be_checked()
    page.locator('[data-testid="judge-B-bad"]').check()
    page.locator('[data-testid="vote-comment"]').fill("All of them stop mid-sentence; A repeats itself.")
    page.locator('[data-testid="vote-both-bad"]').click()
    expect(page.locator('[data-testid="vote-summary"]')).to_contain_text("All bad")

    (record,) = votes_of(live_db, 1)
    vote = record.vote
    assert (vote.outcome, vote.winner_label, vote.judgements, vote.comment) == (
        "both_bad", None, {"A": "bad", "B": "bad"}, "All of them stop mid-sentence; A repeats itself.")
    assert (record.mode, record.reveal, vote.unrated_reason) == ("blind", "live", None)
    assert [column.label for column in record.columns] == ["A", "B", "C"]
    assert sorted(column.backend for column in record.columns) == sorted(NAMES)
    # Revealed after the vote: each column under its own backend's label.
    revealed = page.evaluate(SNAPSHOT_JS, False)
    assert revealed["revealed"]
    assert {c["label"]: c["backend"] for c in revealed["columns"]} == {
        column.label: NAMES[column.backend] for column in record.columns}


def test_finished_reveal_hides_text_until_the_end_and_a_win_keeps_its_marks_and_comment(
        page: Page, finished_app: AppServer, finished_db: str):
    open_chat(page, finished_app, MODEL)
    send(page, "Name three rivers.")
    snapshots = watch_round(page, 0)
    assert len([s for s in snapshots if not s["final"]]) >= 3, "the round was not watched while it streamed"
    assert shown_before_the_end(snapshots) == []  # the control for "live"
    assert all(c["text"].strip() for c in snapshots[-1]["columns"])
    # The Chinese test's scan finds the English strings where they are: on this English page.
    labels = element_tables()["LABELS"]
    english = english_fragments((value["source"] for value in labels["en"].values()),
                                (value["source"] for value in labels["zh"].values()))
    grid = page.evaluate(GRID_TEXT_JS)
    assert {"Blind round", "all at once", "Which answer is better", "text shown when every column has finished"} <= {
        fragment for fragment in english if fragment in grid}, grid

    # A column marked bad cannot win: said on the vote bar, nothing stored.
    page.locator('[data-testid="judge-B-bad"]').check()
    page.locator('[data-testid="vote-B"]').click()
    expect(page.locator('[data-testid="vote-answer"]')).to_contain_text("cannot both win and be judged bad")
    page.locator('[data-testid="judge-B-good"]').check()
    page.locator('[data-testid="judge-C-bad"]').check()
    page.locator('[data-testid="vote-comment"]').fill("B answers it; C wanders off.")
    page.locator('[data-testid="vote-B"]').click()
    expect(page.locator('[data-testid="vote-summary"]')).to_contain_text("B better")

    (record,) = votes_of(finished_db, 1)
    vote = record.vote
    assert (vote.outcome, vote.winner_label, vote.judgements, vote.comment) == (
        "win", "B", {"B": "good", "C": "bad"}, "B answers it; C wanders off.")
    assert (record.mode, record.reveal, vote.unrated_reason) == ("blind", "finished", None)


def english_fragments(templates, chinese) -> set[str]:
    """The fixed parts of English UI strings (between placeholders and markup) of two words or more,
    less any the Chinese strings hold too (a command's syntax): what a Chinese screen must not show
    where a Chinese string exists."""
    chinese = list(chinese)
    fragments = set()
    for template in templates:
        for part in re.split(r"\$\{[^}]*\}|\{[^}]*\}|[*`#|()\[\]:;.,?!·=–—]", template):
            part = part.strip()
            if re.fullmatch(r"[A-Za-z][A-Za-z' -]*", part) and len(part.split()) >= 2 and part not in SAME_IN_BOTH:
                fragments.add(part)
    return {fragment for fragment in fragments if not any(fragment in text for text in chinese)}


GRID_TEXT_JS = """
() => {
  const grids = [...document.querySelectorAll('[data-testid="compare"]')];
  const grid = grids[grids.length - 1].cloneNode(true);
  grid.querySelectorAll('[data-testid="column-text"]').forEach((e) => e.remove());  // the engines' own text
  const comment = grid.querySelector('[data-testid="vote-comment"]');
  return grid.innerText + "\\n" + (comment ? comment.getAttribute("placeholder") : "");
}
"""


def test_the_compare_vote_and_leaderboard_screens_in_a_chinese_browser(
        chromium, finished_app: AppServer, finished_db: str):
    context = chromium.new_context(locale="zh-CN", viewport={"width": 1400, "height": 1000})
    try:
        page = context.new_page()
        open_chat(page, finished_app, MODEL)
        send(page, "说出三条河流。")
        watch_round(page, 0)
        labels = element_tables()["LABELS"]
        zh, en = labels["zh"], labels["en"]
        grid = page.evaluate(GRID_TEXT_JS)
        # The round and its vote bar: Chinese where the element has Chinese ...
        for key in ("blindRound", "concurrent", "revealFinished", "voteHint", "tie", "allBad", "good", "bad",
                    "comment", "completed"):
            assert zh[key]["source"] in grid, (key, zh[key]["source"], grid)
        expect(page.locator('[data-testid="vote-B"]')).to_have_text("B 更好")
        # ... and none of the English strings it replaces.
        english = english_fragments((value["source"] for value in en.values()),
                                    (value["source"] for value in zh.values()))
        assert english, "no English fragments to look for"
        assert [fragment for fragment in english if fragment in grid] == [], grid

        page.locator('[data-testid="vote-tie"]').click()
        expect(page.locator('[data-testid="vote-summary"]')).to_contain_text(zh["tie"]["source"])
        stored_when(finished_db, "votes", until=lambda rows: any(r.vote.outcome == "tie" for r in rows))
        send(page, "/leaderboard")
        board = page.locator(".step", has_text="排行榜").last
        expect(board).to_contain_text("次盲评投票", timeout=30_000)
        shown = board.inner_text()
        assert "后端" in shown and "评分" in shown, shown
        leaderboard_english = english_fragments(LEADERBOARD_STRINGS["en"].values(), LEADERBOARD_STRINGS["zh"].values())
        assert [fragment for fragment in leaderboard_english if fragment in shown] == [], shown
    finally:
        context.close()
