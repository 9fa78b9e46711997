"""A class's traffic as a trace (core/load/trace.py) and "would today's class fit?" (core/load/class_fit.py):
the trace rebuilt from stored replies, its shared-prefix blocks, its two shapes (with and without texts),
scaling, and replaying it on a fake engine at its pace with each conversation's turns in order."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone

import pytest

from backends.llamacpp import PromptTokenizer
from core.load.class_fit import ClassFit, replay_trace
from core.load.slo import parse_slo
from core.load.trace import (BLOCK_SIZE, TraceError, TraceRequest, busiest_window, class_session, class_shape,
                             read_trace, scaled, trace_from_replies, trace_jsonl)
from store import StoredReply
from tests.fakes import FakeBackend, FakeReply

SYSTEM = ("You are the teaching assistant of an introductory course on how computers run language models. "
          "Answer in plain language, in three to five sentences, with one everyday example. ") * 2
START = datetime(2026, 12, 1, 9, 0, tzinfo=timezone.utc)


@pytest.fixture(scope="module")
def tokenizer():
    return PromptTokenizer()


def reply(student: str, thread: str, at_s: float, prompt: str, text: str, messages: int, *,
          mode: str = "chat", status: str = "completed", tokens: int = 20) -> StoredReply:
    started = START + timedelta(seconds=at_s)
    return StoredReply(
        id=f"{thread}-{at_s}", thread_id=thread, user_identifier=student, created_at=started + timedelta(seconds=2),
        backend="vllm", backend_label="vLLM", model="m", mode=mode, round_id=None, column_label=None, prompt=prompt,
        reply_text=text, status=status, first_token_s=0.25, decode_tokens_per_s=20.0, output_tokens=tokens,
        total_s=2.0, ms_per_output_token=50.0, settings_sent={},
        record={"started_at_unix_s": started.timestamp(), "server": {"cached_prompt_tokens": 0},
                "request": {"messages": messages, "system_prompt": SYSTEM}})


def class_replies() -> list[StoredReply]:
    return [
        reply("alice", "t1", 0.0, "What is a token?", "A token is a piece of text.", 2),
        reply("bob", "t2", 1.0, "What is the KV cache?", "It keeps keys and values.", 2),
        reply("alice", "t1", 10.0, "Is one word one token?", "Not always.", 4),
        reply("bob", "t2", 12.0, "Why does it grow?", "Each new token adds to it.", 4, tokens=30),
        reply("carol", "t3", 13.0, "replayed prompt", "x", 2, mode="replay"),  # not class traffic
    ]


def test_a_trace_rebuilds_each_request_and_its_shared_prefix_blocks(tokenizer):
    trace = trace_from_replies(class_replies(), tokenizer.tokens)
    assert [(r.user, r.session_id, r.turn) for r in trace] == [("s1", "c1", 1), ("s2", "c2", 1), ("s1", "c1", 2),
                                                               ("s2", "c2", 2)]
    assert [r.timestamp_ms for r in trace] == [0.0, 1000.0, 10000.0, 12000.0]
    second = trace[2]
    assert [m.content for m in second.messages] == [SYSTEM, "What is a token?", "A token is a piece of text.",
                                                    "Is one word one token?"]
    assert second.input_length == len(tokenizer.tokens(second.messages))
    assert len(second.hash_ids) == -(-second.input_length // BLOCK_SIZE)
    # The class's system prompt: the same leading blocks for both students.
    system_blocks = len(tokenizer.tokens(trace[0].messages[:1])) // BLOCK_SIZE
    assert system_blocks >= 1 and trace[0].hash_ids[:system_blocks] == trace[1].hash_ids[:system_blocks]
    assert trace[0].hash_ids[-1] != trace[1].hash_ids[-1]
    # Turn 2 reuses turn 1's whole blocks, then goes on with its own.
    whole = trace[0].input_length // BLOCK_SIZE
    assert second.hash_ids[:whole] == trace[0].hash_ids[:whole] and set(second.hash_ids[whole + 1:]).isdisjoint(
        trace[0].hash_ids)
    assert class_shape(trace).students == 2 and class_shape(trace).conversations == 2


def test_with_texts_its_lines_carry_messages_without_them_lengths_and_hash_ids_and_both_read_back(tokenizer, tmp_path):
    replies = class_replies()
    with_texts = [json.loads(line) for line in trace_jsonl(trace_from_replies(replies, tokenizer.tokens)).splitlines()]
    without = [json.loads(line) for line in
               trace_jsonl(trace_from_replies(replies, tokenizer.tokens, texts=False)).splitlines()]
    # AIPerf's mooncake_trace takes either messages or input_length/hash_ids, never both.
    assert with_texts and len(without) == len(with_texts)
    assert all("messages" in line and "input_length" not in line and "hash_ids" not in line for line in with_texts)
    assert all("messages" not in line and line["input_length"] >= 1 and line["hash_ids"] for line in without)
    assert all(line["serving_lab"]["hash_ids"] for line in with_texts)
    assert not any("token?" in json.dumps(line) for line in without)  # no student's words
    for name, lines in (("texts.jsonl", with_texts), ("notext.jsonl", without)):
        path = tmp_path / name
        path.write_text("".join(json.dumps(line) + "\n" for line in lines), encoding="utf-8")
        read = read_trace(path)
        assert [(r.session_id, r.turn, r.input_length, r.output_length) for r in read] == \
            [(line["session_id"], line["serving_lab"]["turn"], line["serving_lab"]["input_length"],
              line["output_length"]) for line in lines]
    path = tmp_path / "bad.jsonl"
    path.write_text('{"timestamp": 0, "output_length": 5}\n', encoding="utf-8")
    with pytest.raises(TraceError, match="bad.jsonl:1: needs \"messages\" or an \"input_length\""):
        read_trace(path)


def test_the_latest_class_session_ends_at_a_quiet_half_hour(tokenizer):
    earlier = reply("dan", "t0", -3 * 3600, "yesterday's question", "old", 2)
    session = class_session([earlier, *class_replies()])
    assert {r.thread_id for r in session} == {"t1", "t2"}


def test_twice_the_class_copies_each_conversation_sharing_only_the_system_prompt(tokenizer):
    trace = trace_from_replies(class_replies(), tokenizer.tokens)
    doubled = scaled(trace, users=2)
    assert len(doubled) == 8 and len({r.user for r in doubled}) == 4 and len({r.session_id for r in doubled}) == 4
    copy = next(r for r in doubled if r.session_id == "c1x2" and r.turn == 1)
    original = trace[0]
    shared = [h for h in original.hash_ids if h in trace[1].hash_ids]
    assert shared and all(h in copy.hash_ids for h in shared)
    assert set(copy.hash_ids) - set(shared) and (set(copy.hash_ids) - set(shared)).isdisjoint(original.hash_ids)
    assert copy.messages[1].content.startswith("(2) ") and copy.messages[0].content == SYSTEM
    faster = scaled(trace, speed=2)
    assert [r.timestamp_ms for r in faster] == [0.0, 500.0, 5000.0, 6000.0]
    assert len(busiest_window(trace, 5.0)) == 2  # two requests within any 5 s


async def test_a_replay_keeps_each_conversations_turns_in_order_and_at_their_time(tokenizer):
    trace = [TraceRequest(0.0, "c1", "s1", 1, 40, 3, (0, 1)), TraceRequest(100.0, "c1", "s1", 2, 60, 3, (0, 1, 2)),
             TraceRequest(50.0, "c2", "s2", 1, 40, 3, (0, 3))]
    backend = FakeBackend("fake", replies=[FakeReply(["a ", "b ", "c "], interval_s=0.1) for _ in range(3)])
    level = await replay_trace(backend, trace)
    assert [o.ok for o in level.outcomes] == [True] * 3
    starts = {(o.conversation, o.turn): o.record.started_at_unix_s for o in level.outcomes}
    ends = {(o.conversation, o.turn): o.record.started_at_unix_s + o.record.total_s for o in level.outcomes}
    first = min(starts.values())
    # Turn 2 was due at 100 ms, but its turn 1 took ~300 ms: it left after that reply ended.
    assert starts[(0, 2)] >= ends[(0, 1)] - 0.01
    assert starts[(1, 1)] - first >= 0.045  # c2 at its own time
    assert backend.requests and all(request.params.ignore_eos and request.params.max_new_tokens == 3
                                    for request in backend.requests)


def test_the_answer_reads_like_the_capacity_sweep(tokenizer):
    from core.load.class_fit import EngineReplay

    trace = trace_from_replies(class_replies(), tokenizer.tokens)
    fit = ClassFit(trace, parse_slo("ttft_ms=500"))
    fit.engines = [EngineReplay("vllm", "vLLM", "m", shares={1.0: 0.97, 2.0: 0.88}),
                   EngineReplay("llama_cpp", "llama.cpp", "m", shares={1.0: 0.41, 2.0: 0.12})]
    assert fit.answer("en") == ("Today's class (2 students, 4 messages, at most 2 at once) would have met TTFT "
                                "under 500 ms for 97% of replies on vLLM and 41% of replies on llama.cpp; "
                                "at twice the class, 88% and 12%.")
    assert "今天的课" in fit.answer("zh") and "vLLM 上有 97%" in fit.answer("zh")


def test_bench_replay_sends_the_class_to_a_real_server_and_answers_per_engine(tokenizer, tmp_path):
    """`python -m bench replay` over real HTTP (the paced stand-in): every request of the trace reaches
    the server once per student factor, a conversation's later turn carries its earlier ones, and
    the answer names the engine in the capacity sweep's words."""
    trace = trace_from_replies(class_replies(), tokenizer.tokens)
    path = tmp_path / "class.jsonl"
    path.write_bytes(trace_jsonl(trace))
    done, sent = bench_replay_on_a_paced_server(path, tmp_path / "out")
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert len(sent) == len(trace) == 4
    by_text = {entry["last_user_text"]: entry for entry in sent}
    assert by_text["Is one word one token?"]["messages_count"] > by_text["What is a token?"]["messages_count"]
    assert "Today's class (2 students, 4 messages" in done.stdout and "Paced" in done.stdout, done.stdout[-1500:]
    assert "Paced" in (tmp_path / "out" / "replay.md").read_text()
    assert json.loads((tmp_path / "out" / "summary.json").read_text())  # written, and JSON


def aiperf_lines(with_texts: bool) -> list[dict]:
    """A plain Mooncake/AIPerf trace: no `serving_lab`, no turn field, no durations; two conversations,
    the first of three turns (its lines in the file's order), the second of one."""
    lines = []
    for at_ms, session, question in ((0, "conv-0", "What is a token?"), (200, "conv-1", "What is a GPU?"),
                                     (400, "conv-0", "Is one word one token?"), (800, "conv-0", "And in Chinese?")):
        line = {"timestamp": at_ms, "session_id": session, "output_length": 4}
        if with_texts:
            line["messages"] = [{"role": "user", "content": question}]
        else:
            line.update(input_length=40, hash_ids=[0, 1])
        lines.append(line)
    return lines


@pytest.mark.parametrize("with_texts", [True, False], ids=["with texts", "lengths and hash ids"])
def test_a_plain_aiperf_trace_numbers_each_conversations_turns_in_its_file_order(tmp_path, with_texts):
    path = tmp_path / "aiperf.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in aiperf_lines(with_texts)))
    trace = read_trace(path)
    assert [(r.session_id, r.turn) for r in trace] == [("conv-0", 1), ("conv-1", 1), ("conv-0", 2), ("conv-0", 3)]
    assert class_shape(trace).most_at_once is None  # not recorded: never 0


def test_bench_replay_of_a_plain_aiperf_trace_lists_every_turn_and_says_at_once_is_not_recorded(tmp_path):
    """The CLI on a trace it did not write (over real HTTP, the paced stand-in): requests.csv labels
    each line with its own turn, "TTFT by turn" has turns 1, 2 and 3, and replay.md and the
    answer say how many were at once is not recorded."""
    import csv

    path = tmp_path / "aiperf.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in aiperf_lines(with_texts=True)))
    done, _ = bench_replay_on_a_paced_server(path, tmp_path / "out")
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    with (tmp_path / "out" / "requests.csv").open() as handle:
        rows = list(csv.DictReader(handle))
    assert sorted((row["conversation"], row["turn"]) for row in rows) == [("0", "1"), ("0", "2"), ("0", "3"),
                                                                          ("1", "1")]
    report = (tmp_path / "out" / "replay.md").read_text()
    assert "turn 1:" in report and "turn 2:" in report and "turn 3:" in report
    assert "at most 0" not in report and "at once in class is not recorded" in report
    assert "how many at once was not recorded" in done.stdout


def bench_replay_on_a_paced_server(trace_path, out_dir):
    """`python -m bench replay` of `trace_path` against the paced stand-in, once per student (x1,
    4 times the pace): the finished process and the requests the server got."""
    import os
    import subprocess
    import sys

    from config import REPO
    from servers.app import backend_env
    from servers.paced_openai import start_paced_server

    server = start_paced_server(400, 50, name="paced-replay")
    try:
        env = {**os.environ, "BACKENDS": "paced", "DEFAULT_BACKEND": "paced",
               **backend_env("paced", kind="openai", base_url=server.base_url, label="Paced")}
        done = subprocess.run([sys.executable, "-m", "bench", "replay", str(trace_path), "--backends", "paced",
                               "--users", "x1", "--speed", "4", "--output", str(out_dir)],
                              cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
        return done, server.requests()
    finally:
        server.stop()
