"""`python -m bench` against real engines: the embedded model, the real vLLM server, the TGI stand-in;
and its arguments (no server)."""

from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from bench.__main__ import parse_args
from config import REPO
from servers.app import backend_env
from servers.paced_openai import start_paced_server
from tests.fixtures_app import closed_loopback_url


def run_bench(env: dict[str, str], *args: str, timeout_s: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "bench", *args], cwd=REPO, env={**os.environ, **env},
                          capture_output=True, text=True, timeout=timeout_s)


@pytest.mark.slow
def test_the_cli_measures_three_engines_and_writes_four_consistent_files(tmp_path, vllm_base_url, tgi_server):
    env = {"BACKENDS": "llama_cpp,vllm,tgi,down", "VLLM_BASE_URL": vllm_base_url, "TGI_BASE_URL": tgi_server.url,
           **backend_env("down", kind="openai", base_url=closed_loopback_url(), label="Down server")}
    result = run_bench(env, "--concurrency", "1,2", "--requests", "3", "--max-new-tokens", "16", "--warmup", "1",
                       "--prompts", "zh", "--output", str(tmp_path))
    assert result.returncode == 0, result.stderr[-3000:]
    assert "| | llama.cpp (embedded) | vLLM | TGI † |" in result.stdout  # the table is printed too
    assert "req" in result.stderr  # the progress bar
    files = sorted(path.name for path in tmp_path.iterdir())
    assert files == ["chart.png", "requests.csv", "summary.json", "table.md"]
    rows = list(csv.DictReader(open(tmp_path / "requests.csv", encoding="utf-8")))
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert [engine["backend"] for engine in summary["engines"]] == ["llama_cpp", "vllm", "tgi"]
    assert "down" in summary["skipped"] and "not reachable" in summary["skipped"]["down"]
    for engine in summary["engines"]:
        assert [level["max_concurrency"] for level in engine["levels"]] == [1, 2]
        for level in engine["levels"]:
            mine = [r for r in rows if r["backend"] == engine["backend"] and int(r["max_concurrency"]) ==
                    level["max_concurrency"]]
            assert len(mine) == 3 and all(r["success"] == "True" for r in mine), mine
            assert level["completed"] == 3 and level["failed"] == 0
            assert level["total_output_tokens"] == sum(int(r["output_len"]) for r in mine)
            assert level["total_input_tokens"] == sum(int(r["input_len"]) for r in mine) > 0
            assert all(r["tokens_exact"] == "True" for r in mine)
            assert level["mean_ttft_ms"] > 0 and level["output_throughput"] > 0
    vllm = summary["engines"][1]
    assert vllm["memory"]["cpu_rss_mib"] > 100  # the real server's processes, found by its port
    assert "port" in vllm["memory"]["cpu_note"]
    assert summary["engines"][2]["stand_in"] and summary["engines"][0]["stand_in"] is None
    table = (tmp_path / "table.md").read_text()
    assert "† TGI is a stand-in" in table and "Prompt set: zh; 3 requests per level" in table
    assert "Not measured: down" in table


def _ctrl_c_as_in_a_terminal() -> None:
    """A shell that starts a job in the background (`cmd &`, as a CI runner may) hands it SIGINT
    ignored, and Python then never raises KeyboardInterrupt; a person's terminal does not."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.mark.slow
def test_ctrl_c_writes_what_was_measured_so_far(tmp_path):
    paced = start_paced_server(rate_tokens_per_s=20, tokens=60, name="paced-bench-interrupt")
    try:
        env = {"BACKENDS": "paced", **backend_env("paced", kind="openai", base_url=paced.base_url, label="Paced")}
        process = subprocess.Popen([sys.executable, "-m", "bench", "--concurrency", "1,4", "--requests", "4",
                                    "--max-new-tokens", "60", "--warmup", "0", "--output", str(tmp_path)],
                                   cwd=REPO, env={**os.environ, **env}, stdout=subprocess.PIPE,
                                   stderr=subprocess.PIPE, text=True, preexec_fn=_ctrl_c_as_in_a_terminal)
        deadline = time.monotonic() + 60
        while len(paced.requests()) < 2:  # the first request finished, the second is running
            assert time.monotonic() < deadline and process.poll() is None, "the benchmark did not start"
            time.sleep(0.2)
        process.send_signal(signal.SIGINT)
        stdout, stderr = process.communicate(timeout=60)
        assert process.returncode == 130, stderr[-2000:]
        table = (tmp_path / "table.md").read_text()
        assert "Interrupted" in table
        rows = list(csv.DictReader(open(tmp_path / "requests.csv", encoding="utf-8")))
        assert len(rows) >= 1 and rows[0]["success"] == "True"
        # The stream in flight was closed: the server saw the client go.
        deadline = time.monotonic() + 10
        while not paced.requests()[-1]["closed_by_client"]:
            assert time.monotonic() < deadline, paced.requests()[-1]
            time.sleep(0.2)
    finally:
        paced.stop()


@pytest.mark.parametrize("option, value", [("--requests", "0"), ("--requests", "-3"), ("--max-new-tokens", "0"),
                                           ("--max-new-tokens", "-1"), ("--requests", "many")])
def test_no_requests_or_no_new_tokens_is_refused_not_quietly_made_one(option, value, capsys):
    with pytest.raises(SystemExit) as exit_info:
        parse_args([option, value])
    assert exit_info.value.code == 2
    error = capsys.readouterr().err
    assert f"argument {option}" in error and (f"{value} is outside 1.." in error or "not a whole number" in error)


def test_the_smallest_run_and_no_warm_up_are_accepted():
    args = parse_args(["--requests", "1", "--max-new-tokens", "1", "--warmup", "0"])
    assert (args.requests, args.max_new_tokens, args.warmup) == (1, 1, 0)
