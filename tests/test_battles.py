"""Votes as a dataset: battles from stored votes, the JSONL round trip, Arena logs, the offline
command and the leaderboard's views."""

import json
import re
import subprocess
import sys
from dataclasses import replace
from datetime import datetime, timezone
from pathlib import Path

import pytest

from config import REPO
from core.ratings.arena_convert import arena_records, convert
from core.ratings.battles import (
    Battle,
    BattleFileError,
    BattleView,
    MarkdownCounts,
    PromptCatalogue,
    Side,
    battle_to_json,
    battles_from_vote,
    battles_jsonl,
    markdown_counts,
    read_battles,
    rounds_from_battles,
    script_language,
    votes_by,
    write_battles,
)
from core.ratings.board import ViewError, board_json, board_markdown, build_board, parse_view
from core.ratings.ratings import ReplyFigures, RoundVote, rate_backends
from store import ColumnReply, RoundColumn, Vote, VoteRecord

ARENA_SAMPLE = REPO / "tests" / "recordings" / "arena-battles-sample.jsonl"
T0 = datetime(2025, 3, 1, 12, 0, tzinfo=timezone.utc)


def test_markdown_is_counted_like_arenas_style_control():
    reply = ("# Title\n## Part\n### Sub\nText with **bold** and __also bold__ and ** not bold\n"
             "1. first\n2. second\n- item\n  * nested\n+ plus\n"
             "```python\n# a comment, not a header\n- not a list\n**not bold**\n```\n#hashtag is no header\n")
    counts = markdown_counts(reply)
    assert counts.headers == {"h1": 1, "h2": 1, "h3": 1, "h4": 0, "h5": 0, "h6": 0}
    assert counts.lists == {"ordered": 2, "unordered": 3}
    assert counts.bold == {"**": 1, "__": 1}
    assert (counts.header_total, counts.list_total, counts.bold_total) == (3, 5, 2)
    assert markdown_counts("") == MarkdownCounts()


@pytest.mark.parametrize("prompt, language", [
    ("什么是KV缓存？", "zh"),
    ("请把 'hello world' 翻译成中文", "zh"),
    ("Translate 你好 into English", "en"),
    ("Explain batching.", "en"),
    ("1 + 1 = ?", "en"),
])
def test_a_typed_prompts_language_follows_its_script(prompt, language):
    assert script_language(prompt) == language


def test_the_shipped_prompt_sets_give_every_line_its_category_and_typed_prompts_are_free():
    from core.reports import prompt_catalogue
    from core.load.prompt_sets import load_prompt_set, prompt_text

    catalogue = prompt_catalogue()
    categories = set()
    for language in ("zh", "en"):
        for prompt in load_prompt_set(language):
            assert catalogue.classify(prompt_text(prompt)) == (prompt.category, language)
            categories.add(prompt.category)
    assert len(categories) >= 20
    assert catalogue.classify("  " + prompt_text(load_prompt_set("en")[0]) + "\n")[1] == "en"  # spaces aside
    assert catalogue.classify("my own question about GPUs") == ("free", "en")
    assert catalogue.classify("我自己的问题") == ("free", "zh")
    assert PromptCatalogue.from_sets({"en": [("Hi", None)]}).classify("Hi") == ("uncategorised", "en")


def reply(text: str, tokens: int, first_token_s: float, decode: float, label: str) -> ColumnReply:
    return ColumnReply(backend_label=label, model=f"{label}-model", reply_text=text, status="completed",
                       first_token_s=first_token_s, decode_tokens_per_s=decode, output_tokens=tokens, total_s=2.0,
                       settings_sent={"temperature": 0.7})


def record(outcome: str, winner: str | None = None, *, mode: str = "blind", reveal: str | None = "live",
           prompt: str = "Explain batching.", comment: str = "", unrated_reason: str | None = None) -> VoteRecord:
    columns = (RoundColumn("A", "vllm", "r1"), RoundColumn("B", "tgi", "r2"), RoundColumn("C", "llama_cpp", None))
    replies = (reply("## Batching\n- **one**\n- two", 40, 0.2, 50.0, "vLLM"),
               reply("Batching groups requests.", 20, 0.4, 25.0, "TGI"), None)
    vote = Vote(round_id="round-1", outcome=outcome, winner_label=winner, judgements={"A": "good", "C": "bad"},
                comment=comment, user_identifier="alice", created_at=T0, unrated_reason=unrated_reason)
    return VoteRecord(vote=vote, mode=mode, columns=columns, prompt=prompt, reveal=reveal, replies=replies)


CATALOGUE = PromptCatalogue({"Explain batching.": ("serving", "en")})


def test_a_win_in_three_columns_is_two_battles_in_column_order():
    first, second = battles_from_vote(record("win", "B"), CATALOGUE)
    assert (first.a.backend, first.b.backend, first.winner) == ("vllm", "tgi", "model_b")
    assert (second.a.backend, second.b.backend, second.winner) == ("tgi", "llama_cpp", "model_a")
    a = first.a
    assert (a.column, a.label, a.model, a.tokens, a.first_token_s, a.decode_tokens_per_s, a.judged) == (
        "A", "vLLM", "vLLM-model", 40, 0.2, 50.0, "good")
    assert (a.markdown.header_total, a.markdown.list_total, a.markdown.bold_total) == (1, 2, 1)
    empty = second.b  # column C has no reply
    assert (empty.reply, empty.tokens, empty.decode_tokens_per_s, empty.judged) == ("", None, None, "bad")
    assert (first.category, first.language, first.reveal, first.judge, first.tstamp) == (
        "serving", "en", "live", "alice", T0.timestamp())
    assert first.counted and first.round_id == second.round_id == "round-1"


def test_ties_and_both_bad_tie_every_pair_and_odd_votes_are_not_counted():
    ties = battles_from_vote(record("tie"), CATALOGUE)
    assert [(b.a.backend, b.b.backend, b.winner) for b in ties] == [
        ("vllm", "tgi", "tie"), ("vllm", "llama_cpp", "tie"), ("tgi", "llama_cpp", "tie")]
    both_bad = battles_from_vote(record("both_bad", prompt="我的问题"), CATALOGUE)
    assert {b.winner for b in both_bad} == {"tie (bothbad)"}
    assert (both_bad[0].category, both_bad[0].language) == ("free", "zh")
    named = battles_from_vote(record("win", "A", mode="compare", reveal=None), CATALOGUE)
    assert not any(b.counted or b.anony for b in named)
    set_apart = battles_from_vote(record("win", "A", comment="A is vLLM", unrated_reason="comment_names_backend"),
                                  CATALOGUE)
    assert set_apart and all(b.anony and not b.rated and not b.counted for b in set_apart)


def test_battles_go_back_to_the_rounds_they_came_from():
    battles = [b for outcome, winner in (("win", "B"), ("tie", None), ("both_bad", None))
               for b in battles_from_vote(replace(record(outcome, winner), vote=replace(
                   record(outcome, winner).vote, round_id=f"round-{outcome}")), CATALOGUE)]
    assert rounds_from_battles(battles) == [
        RoundVote(("vllm", "tgi", "llama_cpp"), "win", "tgi", verdicts=("good", None, "bad")),
        RoundVote(("vllm", "tgi", "llama_cpp"), "tie", verdicts=("good", None, "bad")),
        RoundVote(("vllm", "tgi", "llama_cpp"), "both_bad", verdicts=("good", None, "bad")),
    ]
    a, b, c = Side("a"), Side("b"), Side("c")
    with pytest.raises(ValueError, match="Round r mixes results that one vote cannot give"):
        rounds_from_battles([Battle("r", a, b, "model_a"), Battle("r", b, c, "model_a")])
    with pytest.raises(ValueError, match="mixes results"):
        rounds_from_battles([Battle("r", a, b, "model_a"), Battle("r", a, c, "tie")])


def test_the_jsonl_round_trip_keeps_every_field(tmp_path):
    battles = (battles_from_vote(record("win", "B", comment="B was clearer"), CATALOGUE)
               + battles_from_vote(replace(record("tie", prompt="什么是批处理？", mode="compare", reveal=None),
                                           vote=replace(record("tie").vote, round_id="round-2")), CATALOGUE))
    path = tmp_path / "votes.jsonl"
    with open(path, "w", encoding="utf-8") as stream:
        assert write_battles(battles, stream) == 5
    assert path.read_bytes() == battles_jsonl(battles)
    assert "什么是批处理" in path.read_text(encoding="utf-8")  # UTF-8 as is, not \\u escapes
    assert read_battles(path) == battles
    line = json.loads(path.read_text(encoding="utf-8").splitlines()[0])
    assert list(line)[:4] == ["round_id", "model_a", "model_b", "winner"]
    assert line["conv_metadata"]["sum_assistant_a_tokens"] == 40
    assert line["conv_metadata"]["list_count_a"] == {"ordered": 0, "unordered": 2}
    assert line["conversation_b"] == [{"role": "user", "content": "Explain batching."},
                                      {"role": "assistant", "content": "Batching groups requests."}]
    assert line["side_a"]["settings"] == {"temperature": 0.7} and line["reveal"] == "live"


@pytest.mark.parametrize("content, message", [
    ('{"round_id": "r", "model_a": "a", "model_b": "b", "winner": "model_a"}\nnot json\n', r"line 2: not valid JSON"),
    ('{"round_id": "r", "model_a": "a", "winner": "model_a"}\n', r'line 1: "model_b" must be a non-empty string'),
    ('{"round_id": "r", "model_a": "a", "model_b": "b", "winner": "a"}\n', r"line 1: \"winner\" is 'a'; expected"),
    ('{"round_id": "r", "model_a": "a", "model_b": "a", "winner": "tie"}\n', "two different backends"),
    ('[1, 2]\n', "line 1: expected a JSON object"),
    ('{"round_id": "r", "model_a": "a", "model_b": "b", "winner": "tie", "conv_metadata": '
     '{"sum_assistant_a_tokens": -3}}\n', "whole number of 0 or more"),
    ('{"round_id": "r", "model_a": "a", "model_b": "b", "winner": "model_a"}\n'
     '{"round_id": "r", "model_a": "a", "model_b": "c", "winner": "model_b"}\n', "mixes results"),
    ("\n\n", "holds no battles"),
])
def test_a_bad_battle_file_names_the_line_and_the_problem(tmp_path, content, message):
    path = tmp_path / "bad.jsonl"
    path.write_text(content, encoding="utf-8")
    with pytest.raises(BattleFileError, match=message):
        read_battles(path)


def test_a_battle_file_with_a_byte_order_mark_loads_and_a_broken_character_is_named(tmp_path):
    line = '{"round_id": "r", "model_a": "a", "model_b": "b", "winner": "tie"}\n'
    marked = tmp_path / "marked.jsonl"
    marked.write_bytes(b"\xef\xbb\xbf" + line.encode() * 2)
    assert len(read_battles(marked)) == 2
    broken = tmp_path / "broken.jsonl"
    broken.write_bytes(line.encode() + b'{"round_id": "\xff"}\n')
    with pytest.raises(BattleFileError, match="line 2: not UTF-8 text"):
        read_battles(broken)


def test_an_arena_log_converts_and_keeps_its_fields():
    battles = convert(arena_records(ARENA_SAMPLE.read_text(encoding="utf-8"), "sample"))
    assert len(battles) == 12
    first = battles[0]
    assert (first.round_id, first.a.backend, first.b.backend, first.winner, first.judge) == (
        "q1", "model-x", "model-y", "model_a", "arena_user_1")
    assert (first.a.tokens, first.a.markdown.header_total, first.a.markdown.list_total,
            first.a.markdown.bold_total, first.b.tokens) == (30, 1, 2, 2, 3)
    assert (first.language, first.category, first.reveal, first.prompt) == ("en", "free", None, "What is a KV cache?")
    assert battles[1].language == "zh"
    assert battles[2].category == "code" and battles[2].a.markdown.header_total == 0  # inside a code block
    newer = battles[8]
    assert (newer.round_id, newer.category, newer.prompt, newer.a.reply) == (
        "5f1c-newer-1", "math", "What is 12*12?", "**144**")
    assert newer.tstamp == datetime(2025, 5, 29, 14, 48, 41, 602925, tzinfo=timezone.utc).timestamp()
    assert battles[9].category == "creative"
    assert battles[10].winner == "tie (bothbad)"
    assert not battles[11].anony and sum(b.counted for b in battles) == 11


def test_a_converted_arena_log_is_rated_in_its_order_on_the_command_line(tmp_path):
    """model-x beats model-y 3 of 4 (and model-z twice), model-y beats model-z 3 of 4: the
    file's order, whatever the tool."""
    converted = tmp_path / "arena.jsonl"
    run = subprocess.run([sys.executable, "-m", "core.ratings.arena_convert", str(ARENA_SAMPLE), str(converted)],
                         cwd=REPO, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert "12 battle(s) written" in run.stdout
    rated = subprocess.run([sys.executable, "-m", "core.ratings", "--votes", str(converted), "--format", "json",
                            "--control", "length,style", "--bootstrap", "200"],
                           cwd=REPO, capture_output=True, text=True, timeout=120)
    assert rated.returncode == 0, rated.stderr
    board = json.loads(rated.stdout)
    assert [row["backend"] for row in board["plain"]] == ["model-x", "model-y", "model-z"]
    assert [row["wins"] for row in board["plain"]] == [5, 4, 0]
    assert board["votes_in_view"] == 11 and board["votes_names_visible"] == 1
    assert [e["covariate"] for e in board["controlled"]["effects"]] == ["length", "headers", "lists", "bold"]
    plain = rate_backends(rounds_from_battles([b for b in read_battles(converted) if b.counted]), seed=0)
    assert {row["backend"]: round(row["rating"], 6) for row in board["plain"]} == {
        name: round(rating.rating, 6) for name, rating in plain.items()}
    again = subprocess.run([sys.executable, "-m", "core.ratings", "--votes", str(converted), "--format", "json",
                            "--control", "length,style", "--bootstrap", "200"],
                           cwd=REPO, capture_output=True, text=True, timeout=120)
    assert again.stdout == rated.stdout  # reproducible


def export_file(tmp_path) -> Path:
    battles = []
    for number in range(6):
        outcome, winner = ("win", "A") if number % 3 else ("tie", None)
        made = record(outcome, winner, prompt="Explain batching." if number < 4 else "写一首诗")
        battles += battles_from_vote(replace(made, vote=replace(made.vote, round_id=f"round-{number}")), CATALOGUE)
    path = tmp_path / "votes.jsonl"
    path.write_bytes(battles_jsonl(battles))
    return path


def test_the_command_rates_an_export_in_markdown_with_a_category_filter(tmp_path):
    path = export_file(tmp_path)
    run = subprocess.run([sys.executable, "-m", "core.ratings", "--votes", str(path), "--category", "serving",
                          "--control", "speed", "--bootstrap", "100"],
                         cwd=REPO, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert "This view: category **serving**, 4 of 6 rated vote(s)." in run.stdout
    assert "**Ratings at equal speed** (from the same 4 vote(s))" in run.stdout
    assert "A side that decodes twice as fast wins" in run.stdout
    assert "Votes by category: serving (4), free (2). By language: en (4), zh (2)." in run.stdout
    chinese = subprocess.run([sys.executable, "-m", "core.ratings", "--votes", str(path), "--lang", "zh",
                              "--bootstrap", "50"], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert "**排行榜**" in chinese.stdout and "**在速度、长度、Markdown 格式相同时的评分**" in chinese.stdout


@pytest.mark.parametrize("arguments, code, message", [
    (["--votes", "missing.jsonl"], 1, "Cannot read the battle file missing.jsonl"),
    (["--votes", "x.jsonl", "--control", "colour"], 2, "Unknown control 'colour'"),
    (["--votes", "x.jsonl", "--bootstrap", "0"], 2, "--bootstrap must be at least 1"),
    (["--format", "json"], 2, "the following arguments are required: --votes"),
    (["--votes", "{export}", "--category", "poetry"], 1, "has category 'poetry'; its category values: serving, free"),
    (["--votes", "{export}", "--language", "fr"], 1, "has language 'fr'; its language values: en, zh"),
])
def test_the_command_says_what_is_wrong(tmp_path, arguments, code, message):
    export = str(export_file(tmp_path))
    arguments = [argument.format(export=export) for argument in arguments]
    run = subprocess.run([sys.executable, "-m", "core.ratings", *arguments], cwd=tmp_path, capture_output=True,
                         text=True, timeout=120, env={"PYTHONPATH": str(REPO)})
    assert run.returncode == code and message in run.stderr


@pytest.mark.parametrize("typed, expected", [
    ("", BattleView()),
    ("category=code lang=zh", BattleView("code", "zh")),
    ("language=EN", BattleView(None, "en")),
    ("Code", BattleView("code")),
    ("zh free", BattleView("free", "zh")),
    ("category=all lang=*", BattleView()),
])
def test_a_typed_view_is_read_plainly(typed, expected):
    assert parse_view(typed, ["code", "free", "math"], ["en", "zh"]) == expected


@pytest.mark.parametrize("typed, key", [
    ("category=cod", "view_unknown_category"),
    ("lang=fr", "view_unknown_language"),
    ("colour=red", "view_unknown_filter"),
    ("poetry", "view_unknown_category"),
])
def test_a_view_that_does_not_exist_is_named_with_the_ones_that_do(typed, key):
    with pytest.raises(ViewError) as raised:
        parse_view(typed, ["code", "free", "math"], ["en", "zh"])
    assert raised.value.key == key
    from core.texts import text

    english, chinese = text(key, "en", **raised.value.values), text(key, "zh", **raised.value.values)
    assert ("code, free, math" in english and "code, free, math" in chinese) or key != "view_unknown_category"
    assert "category=" in text("view_unknown_filter", "en", word="x")


def test_the_board_counts_votes_per_view_and_renders_in_both_languages(tmp_path):
    battles = read_battles(export_file(tmp_path)) + battles_from_vote(
        replace(record("win", "A", mode="compare"), vote=replace(record("win", "A").vote, round_id="named")),
        CATALOGUE)
    figures = [ReplyFigures("vllm", 0.2, 50.0), ReplyFigures("unvoted", 0.1, 99.0)]
    everything = build_board(battles, figures, bootstrap_samples=50, controlled_bootstrap_samples=50)
    assert (everything.votes_in_view, everything.votes_rated, everything.names_visible) == (6, 6, 1)
    assert everything.categories == (("serving", 4), ("free", 2))
    assert [row.backend for row in everything.plain.rows][-1] == "unvoted"
    zh = build_board(battles, figures, BattleView(language="zh"), bootstrap_samples=50,
                     controlled_bootstrap_samples=50)
    assert zh.votes_in_view == 2 and "unvoted" not in [row.backend for row in zh.plain.rows]
    english, chinese = board_markdown(zh, "en"), board_markdown(zh, "zh")
    assert english.startswith("This view: language **zh**, 2 of 6 rated vote(s).")
    assert "**#** respects the intervals" in english and "| Controlled rating |" in english
    assert chinese.startswith("当前视图：语言 **zh**，共 2 票") and "| 控制后评分 |" in chinese
    for english_words in ("This view", "Ratings at equal", "What sways", "Votes by category", "wins", "Backend"):
        assert english_words not in chinese, english_words
    data = board_json(zh)
    assert data["view"] == {"category": None, "language": "zh"} and data["votes_in_view"] == 2
    assert data["controlled"]["controls"] == ["speed", "length", "style"]
    assert {e["covariate"] for e in data["controlled"]["effects"]} >= {"decode", "length"}
    assert json.dumps(data)  # plain data all the way down


def test_every_leaderboard_sentence_is_in_both_languages():
    from core.ratings.texts import STRINGS

    assert set(STRINGS["en"]) == set(STRINGS["zh"])
    for key, english in STRINGS["en"].items():
        assert set(re.findall(r"{(\w+)}", english)) == set(re.findall(r"{(\w+)}", STRINGS["zh"][key])), key


def test_votes_by_counts_rounds_not_battles():
    a, b, c = Side("a"), Side("b"), Side("c")
    three = [Battle("r1", a, b, "tie", category="code"), Battle("r1", a, c, "tie", category="code"),
             Battle("r1", b, c, "tie", category="code"), Battle("r2", a, b, "tie", category="math")]
    assert votes_by(three, "category") == [("code", 1), ("math", 1)]
    assert battle_to_json(three[0])["category"] == "code"
