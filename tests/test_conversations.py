"""Multi-turn workloads: the shipped conversation sets, the load engine running people through whole
conversations (turn after turn, their replies carried, a think time between), TTFT by turn number,
and `python -m bench --conversations` against the real vLLM, whose later turns come from its cache."""

from __future__ import annotations

import csv
import os
import subprocess
import sys

import pytest

from backends.base import GenerationParams
from config import REPO
from core.load.prompt_sets import PromptSetError, load_conversation_set
from core.load.runner import RequestOutcome, conversations_needed, planned_requests, run_level
from core.load.stats import by_turn, turns_line
from servers.app import backend_env
from tests.fakes import FakeBackend, FakeReply
from tests.test_openai_parsing import parse_all, record_of, recorded_chunks

PARAMS = GenerationParams(temperature=0.0, top_p=1.0, max_new_tokens=8)


@pytest.mark.parametrize("language", ["en", "zh"])
def test_each_shipped_set_is_a_class_several_turns_each_under_one_system_prompt(language):
    conversations = load_conversation_set(language)
    assert len(conversations) >= 8
    assert all(len(c.turns) >= 4 for c in conversations)
    assert len({c.system for c in conversations}) == 1 and conversations[0].system
    if language == "zh":
        assert all(any("\u4e00" <= ch <= "\u9fff" for ch in turn) for c in conversations for turn in c.turns)


def test_a_conversation_line_without_turns_is_refused_naming_the_line(tmp_path):
    path = tmp_path / "mine.jsonl"
    path.write_text('{"system": "s", "turns": ["a", "b"]}\n{"system": "s", "turns": []}\n', encoding="utf-8")
    with pytest.raises(PromptSetError, match="line 2: needs a \"turns\" list"):
        load_conversation_set(str(path))


async def test_people_talk_turn_after_turn_carrying_the_engines_replies_and_reading_them():
    backend = FakeBackend("fake", replies=[FakeReply([f"reply{n} "]) for n in range(8)])
    conversations = load_conversation_set("en")[:2]
    level = await run_level(backend, conversations, concurrency=2, requests=8, params=PARAMS, think_time_s=0.2)
    assert [o.ok for o in level.outcomes] == [True] * 8
    assert sorted((o.conversation, o.turn) for o in level.outcomes) == [(c, t) for c in (0, 1) for t in (1, 2, 3, 4)]
    # Turn 3 of a conversation carries turns 1 and 2 with the replies the engine really gave.
    for request in backend.requests:
        messages = request.messages
        assert messages[0].role == "system" and messages[0].content == conversations[0].system
        turn = (len(messages) - 1) // 2 + 1
        conversation = next(c for c in conversations if c.turns[turn - 1] == messages[-1].content)
        assert [m.content for m in messages[1:-1:2]] == list(conversation.turns[:turn - 1])
        assert all(m.role == "assistant" and m.content.startswith("reply") for m in messages[2:-1:2])
    # Each person reads for the think time before their next turn: at most two in flight, never more.
    by_person: dict[int, list[RequestOutcome]] = {}
    for outcome in level.outcomes:
        by_person.setdefault(outcome.conversation, []).append(outcome)
    for outcomes in by_person.values():
        ordered = sorted(outcomes, key=lambda o: o.turn)
        for earlier, later in zip(ordered, ordered[1:]):
            ended = earlier.record.started_at_unix_s + earlier.record.total_s
            assert later.record.started_at_unix_s - ended >= 0.19


def test_a_level_of_conversations_takes_whole_ones_at_least_one_per_person():
    conversations = load_conversation_set("en")
    assert conversations_needed(conversations, 5, 1) == 2  # 4 turns do not make 5 requests
    assert conversations_needed(conversations, 1, 3) == 3
    assert planned_requests(conversations, 5, 1) == 8 and planned_requests(conversations, 1, 3) == 12
    assert planned_requests([object()], 5, 3) == 5  # single prompts: exactly the requests asked


def test_ttft_by_turn_shows_what_the_cache_took():
    first = record_of(parse_all(recorded_chunks("vllm-0.32-prompt-tokens-details-turn1.sse")))
    second = record_of(parse_all(recorded_chunks("vllm-0.32-prompt-tokens-details-turn2.sse")))
    outcomes = [RequestOutcome(0, "en:1", first, input_tokens=98, turn=1, conversation=0),
                RequestOutcome(1, "en:1", second, input_tokens=125, turn=2, conversation=0)]
    turns = by_turn(outcomes)
    assert [t.turn for t in turns] == [1, 2]
    assert turns[0].cached_share == 0 and turns[1].cached_share == pytest.approx(96 / 125)
    line = turns_line(turns)
    assert "turn 1:" in line and "0% of the prompt cached" in line and "77% of the prompt cached" in line


@pytest.mark.slow
def test_bench_with_conversations_reports_ttft_by_turn_and_later_turns_come_from_vllms_cache(tmp_path, vllm_base_url):
    env = {"BACKENDS": "vllm", **backend_env("vllm", kind="vllm", base_url=vllm_base_url, label="vLLM")}
    result = subprocess.run([sys.executable, "-m", "bench", "--backends", "vllm", "--conversations", "en",
                             "--concurrency", "2", "--requests", "8", "--max-new-tokens", "16", "--think-time", "0.2",
                             "--warmup", "1", "--output", str(tmp_path)],
                            cwd=REPO, env={**os.environ, **env}, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    table = (tmp_path / "table.md").read_text(encoding="utf-8")
    assert "TTFT (ms) of turn 1" in table and "TTFT (ms) of turn 4" in table
    assert "Conversation set: en" in table and "TTFT by turn" in result.stdout
    rows = list(csv.DictReader(open(tmp_path / "requests.csv", encoding="utf-8")))
    assert len(rows) == 8 and {row["turn"] for row in rows} == {"1", "2", "3", "4"}
    later = [row for row in rows if row["turn"] != "1"]
    # Every later turn found the turns before it in vLLM's prefix cache.
    assert all(int(row["cached_input_len"]) >= 32 for row in later), later
    print(result.stdout[-1500:])
