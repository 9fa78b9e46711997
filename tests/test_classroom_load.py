"""scripts/classroom_load.sh: its bounds, its summary, and one short real Locust run.

The real run starts its own app (and the paced test server) from this repo. It
lives in its own test module because stopping a Chainlit app deletes the app
root's `.files/`, which would break another app of the same root still running
(module-scoped app fixtures end with their module).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from config import REPO
from core.timing import percentile_of
from core.load.slo import Slo
from load.summary import configured, memory_from_samples, report_lines, slo_line, state_lines, summarize_records

SCRIPT = REPO / "scripts" / "classroom_load.sh"
LAST_LINE = re.compile(
    r"^users=(?P<users>\d+) messages=(?P<messages>\d+) replied=(?P<replied>\d+) errors=(?P<errors>\d+) "
    r"p50_reply_s=(?P<p50>[\d.]+|na) p99_reply_s=(?P<p99>[\d.]+|na) max_rss_mb=(?P<rss>[\d.]+|na)$"
)


def run_script(*args: str, env: dict[str, str] | None = None, timeout_s: float = 30) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(SCRIPT), *args], cwd=REPO, capture_output=True, text=True,
                          timeout=timeout_s, env=env)


# ---------------------------------------------------------------- bounds (nothing starts)


@pytest.mark.parametrize("args, complaint", [
    (["--users", "5", "--minutes", "1", "--host", "http://10.0.0.5:8000"], "loopback"),
    (["--users", "5", "--minutes", "1", "--host", "http://example.com"], "loopback"),
    (["--users", "61", "--minutes", "1"], "--users must be 1..60"),
    (["--users", "5", "--minutes", "16"], "--minutes must give 10 s .. 15 min"),
    (["--users", "5", "--minutes", "0.1"], "--minutes must give 10 s .. 15 min"),
    (["--users", "5", "--minutes", "1", "--paced-server", "--backend", "vllm"], "one backend, 'paced'"),
])
def test_the_script_refuses_what_is_out_of_bounds_before_starting_anything(args, complaint):
    result = run_script(*args)
    assert result.returncode == 2
    assert complaint in result.stderr
    assert "Starting" not in result.stdout and "Setting up" not in result.stdout


# ---------------------------------------------------------------- the summary


def test_the_summary_uses_the_timing_modules_percentiles():
    values = [float(v) for v in range(1, 101)]
    # Linear between ranks, as numpy, vllm bench serve and every other figure of the app.
    assert percentile_of(values, 50) == 50.5 and round(percentile_of(values, 99), 2) == 99.01
    assert percentile_of([3.0], 99) == 3.0 and percentile_of([], 50) is None and percentile_of([None, 2.0], 50) == 2.0


def test_summary_counts_every_message_once_and_ends_with_the_machine_line():
    records = [
        {"kind": "open", "ok": True}, {"kind": "open", "ok": True},
        {"kind": "open", "ok": False, "error": "the chat did not start within 60 s"},
        {"kind": "message", "outcome": "replied", "reply_s": 1.0, "first_token_s": 0.1, "queue_positions": []},
        {"kind": "message", "outcome": "replied", "reply_s": 3.0, "first_token_s": 2.0, "queue_positions": [2, 1]},
        {"kind": "message", "outcome": "timeout", "reply_s": None, "first_token_s": None, "queue_positions": [4, 4]},
        {"kind": "message", "outcome": "error", "error": "⚠️ **vLLM** could not answer.\n\nreason",
         "reply_s": 0.2, "first_token_s": None, "queue_positions": []},
        {"kind": "message", "outcome": "unfinished", "reply_s": None, "first_token_s": None, "queue_positions": []},
        {"kind": "health", "ok": True, "health_s": 0.004}, {"kind": "health", "ok": False, "health_s": 10.0},
        {"kind": "stopping"},  # when the run ended: not a message
    ]
    summary = summarize_records(records, users=3)
    summary.memory = memory_from_samples([(0.0, 100.0), (40.0, 300.0), (80.0, 310.0), (120.0, 305.0)])
    lines = report_lines(summary)
    assert lines[-1] == ("users=3 messages=5 replied=2 errors=2 p50_reply_s=2.00 p99_reply_s=2.98 "
                         "max_rss_mb=310.0")
    text = "\n".join(lines)
    assert "1 failed to open" in text
    assert "1 x timeout" in text and "1 x app error: ⚠️ **vLLM** could not answer." in text
    assert "1 still in flight" in text
    assert "highest place 4" in text and "1 of them got no whole reply, 1 of those never saw their place move" in text
    assert "2 probes, 1 failed" in text and "p99 4 ms" in text
    assert "warm-up 300 MB" in text and "growth after warm-up +10 MB" in text


def test_app_state_lines_flag_what_stayed_higher_after_the_students_left():
    before = {"threads": 3, "threads_by_kind": {"database": 0, "executor": 2, "model": 1, "other": 0},
              "tasks": 3, "tasks_by_kind": {"kept_sessions": 0, "socket_pings": 0, "other": 3},
              "open_files_by_kind": {"database": 3, "other": 1}, "backend_connections": 0,
              "client_connections": 1, "sessions": 0, "connected_sessions": 0, "session_timeout_s": 600}
    # Pools that filled and sessions kept for a reconnect are not leaks.
    pooled = {**before, "threads_by_kind": {"database": 10, "executor": 6, "model": 1, "other": 0},
              "tasks_by_kind": {"kept_sessions": 30, "socket_pings": 4, "other": 3}, "sessions": 30}
    lines = state_lines(before, pooled)
    assert "nothing left behind" in lines[0] and "database threads 0 -> 10" in lines[1]
    assert "sessions 0 -> 30 (0 connected; the others are kept 600 s" in lines[2]
    leaked = {**pooled, "tasks_by_kind": {"kept_sessions": 30, "socket_pings": 0, "other": 40},
              "backend_connections": 2}
    line = state_lines(before, leaked)[0]
    assert "LEAK? higher after the run: tasks, backend connections" in line and "tasks 3 -> 40" in line
    # A reply still being generated when the counts were taken (the run's drain wait gave up) is named.
    generating = {**pooled, "tasks_by_kind": {**pooled["tasks_by_kind"], "replies": 2, "reply_parts": 2}}
    assert "LEAK? higher after the run: replies still generating" in state_lines(before, generating)[0]
    assert "not read" in state_lines(None, before)[0]


# ---------------------------------------------------------------- a real run


@pytest.mark.slow
def test_a_short_real_run_against_the_paced_server(tmp_path: Path):
    env = {
        **dict(__import__("os").environ),
        "APP_VENV": sys.prefix,  # the app's venv is the one running these tests
        "LOAD_THINK_MIN_S": "1", "LOAD_THINK_MAX_S": "3",
        "PACED_RATE": "100", "PACED_TOKENS": "50",
    }
    results = tmp_path / "results"
    result = run_script("--users", "5", "--minutes", "0.34", "--spawn-rate", "5", "--paced-server",
                        "--results", str(results), env=env, timeout_s=400)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    last = LAST_LINE.match(result.stdout.strip().splitlines()[-1])
    assert last, result.stdout[-2000:]
    users, messages, replied, errors = (int(last[k]) for k in ("users", "messages", "replied", "errors"))
    assert users == 5
    assert errors == 0 and 5 <= replied <= messages
    assert float(last["p50"]) <= float(last["p99"]) < 10
    assert float(last["rss"]) > 50
    assert "p99" in result.stdout and "health" in result.stdout
    # The SLO share (the default objective; the paced server's replies easily meet it when 5 share it).
    assert re.search(r"SLO \(TTFT under 500 ms and at least 20 tokens/s each, as the students saw it\): "
                     r"\d+ of \d+ messages met it", result.stdout), result.stdout[-2000:]
    # The app's own counts were read before and after, and no thread or task outlived the students.
    assert "app state before -> after" in result.stdout, result.stdout[-2000:]
    after = json.loads((results / "state-after.json").read_text())
    before = json.loads((results / "state-before.json").read_text())
    assert after["sessions"] == 6 and after["connected_sessions"] == 0, after  # the warm-up chat and 5 students
    assert "nothing left behind" in result.stdout, (before, after)
    opens = [json.loads(line) for path in results.glob("chat-records-*.jsonl")
             for line in path.read_text().splitlines() if '"kind": "open"' in line]
    assert len(opens) == 5 and all(o["ok"] and o["transport"] == "websocket" for o in opens)
    # Locust's own final table counts the same replies. (Its _stats.csv can miss replies that
    # finished during --stop-timeout: Locust writes it before the last users stop.)
    table = (results / "locust.log").read_text()
    reply_row = next(line for line in table.splitlines() if re.match(r"^chat +reply ", line))
    assert int(reply_row.split()[2]) == replied


def test_the_summary_reports_the_share_of_messages_meeting_the_slo_as_the_students_saw_it(tmp_path, monkeypatch):
    def message(outcome, first_s, per_token_ms, reply_s, tokens=40):
        return {"kind": "message", "outcome": outcome, "first_token_s": first_s, "ms_per_token": per_token_ms,
                "reply_s": reply_s, "output_tokens": tokens, "queue_positions": []}

    records = [message("replied", 0.2, 30.0, 1.5), message("replied", 0.6, 30.0, 1.9),  # TTFT 600 ms: missed
               message("replied", 0.3, 60.0, 2.7),  # 60 ms per token (under 20 tokens/s): missed
               message("replied", 0.1, None, 0.2, tokens=1),  # one token: TPOT 0, as vLLM counts it
               message("timeout", None, None, None)]  # a failed message never meets it
    summary = summarize_records(records, users=2)
    slo = Slo(ttft_ms=500, tpot_ms=50, percentile=90)
    assert summary.slo_met(slo) == 2
    assert slo_line(summary, slo) == ("SLO (TTFT under 500 ms and at least 20 tokens/s each, as the students saw it): "
                                      "2 of 5 messages met it (40%), goal 90%: missed")
    assert slo_line(summary, Slo(e2el_ms=3000, percentile=80)).endswith("4 of 5 messages met it (80%), goal 80%: met")
    lines = report_lines(summary, slo)
    assert lines[-2].startswith("SLO (") and LAST_LINE.match(lines[-1])
    env_file = tmp_path / ".env"
    env_file.write_text("CAPACITY_SLO=ttft_ms=300\n", encoding="utf-8")
    monkeypatch.delenv("CAPACITY_SLO", raising=False)
    assert configured("CAPACITY_SLO", env_file) == "ttft_ms=300"
    monkeypatch.setenv("CAPACITY_SLO", "e2el_ms=9000")
    assert configured("CAPACITY_SLO", env_file) == "e2el_ms=9000"


@pytest.mark.slow
def test_a_burst_run_sends_nothing_once_the_run_has_ended(tmp_path: Path):
    """In a burst run (LOAD_BURST_EVERY_S) every student waits for the clock's next burst inside its
    task. Locust's graceful stop lets a task finish, so a student still waiting when the run ended
    used to send at the next burst anyway, after the run: a benchmark counting rows at the end then
    missed that burst's (bench/lecture_hall.py, 200 rows short). Every message is sent before the run
    ended (the locustfile notes that moment); control: the students were waiting for a burst when it
    ended (replies of 0.2 s, a burst every 4 s), and had sent in bursts before."""
    env = {
        **dict(__import__("os").environ),
        "APP_VENV": sys.prefix,
        "LOAD_BURST_EVERY_S": "4",
        "PACED_RATE": "100", "PACED_TOKENS": "20",
    }
    results = tmp_path / "results"
    result = run_script("--users", "3", "--minutes", "0.2", "--spawn-rate", "3", "--paced-server",
                        "--results", str(results), env=env, timeout_s=400)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    records = [json.loads(line) for path in results.glob("chat-records-*.jsonl")
               for line in path.read_text().splitlines() if line.strip()]
    (stopped_at,) = [r["at"] for r in records if r["kind"] == "stopping"]
    messages = [r for r in records if r["kind"] == "message"]
    assert len({r["burst_at"] for r in messages}) >= 2, messages
    late = [r for r in messages if r["sent_wall_s"] > stopped_at]
    assert late == [], (stopped_at, late)
    assert all(r["outcome"] == "replied" for r in messages), messages
