"""Does `python -m bench replay` agree with AIPerf's trace replay? One class trace, one real vLLM, a verdict.

A class trace in the app's format (core/load/trace.py) is built from the shipped conversation set:
`--students` students, each talking through one conversation (`--turns` turns, `--gap` s apart,
students starting `--stagger` s apart), each reply `--output-tokens` long, the texts kept (so both
tools send exactly the same messages). Then, against one vLLM (started here, ~1 min, unless
`--base-url`), interleaved `--runs` times, vLLM's prefix cache emptied before every run
(`/reset_prefix_cache`, vLLM's dev mode) so neither tool finds the other's prompts cached:

- `python -m bench replay TRACE --users x1` (the app's load engine and timing module), and
- AIPerf (PyPI `aiperf`, in its own venv `.venv-aiperf`) on the same file:
  `aiperf profile --custom-dataset-type mooncake_trace --fixed-schedule --streaming
  --use-server-token-count --extra-inputs ignore_eos:true temperature:0 top_p:1`.

Goals (exit 1 naming each miss): both tools completed every request; request count, total input
tokens and total output tokens equal (vLLM's own usage on both sides); mean TTFT, mean TPOT and
output tokens/s each within 5 % (ours / AIPerf's, on the mean of the runs). vLLM's own mean TTFT and
TPOT for each run's requests (its /metrics histograms) are printed beside both tools: the server's
truth, which tells which tool a gap comes from.

Run: `.venv/bin/python -m experiments.trace_agreement [--students 6] [--turns 4] [--runs 2] [--pin]
      [--base-url http://127.0.0.1:8001/v1]` (a --base-url server must run with VLLM_SERVER_DEV_MODE=1);
      `--pin` runs the vLLM it starts on CPU 0 and each tool on CPU 1.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import urllib.request
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from backends.base import ChatMessage
from backends.llamacpp import PromptTokenizer
from bench.verdict import Goal, all_of, exit_status, within_ratio
from config import REPO
from core.load.prompt_sets import load_conversation_set
from core.load.trace import BlockHasher, TraceRequest, trace_jsonl
from scripts.vllm_launch import BUNDLED_MODEL_DIR, BUNDLED_MODEL_NAME, server_command, server_env
from servers.app import backend_env
from servers.process import ServerProcess, free_port

TOLERANCE = 0.05
# vLLM's own histograms, read before and after each run: the server's truth beside both tools.
VLLM_OWN = {"mean_ttft_ms": "vllm:time_to_first_token_seconds",
            "mean_tpot_ms": "vllm:request_time_per_output_token_seconds"}
AIPERF = REPO / ".venv-aiperf" / "bin" / "aiperf"
AIPERF_SETUP = "python3 -m venv .venv-aiperf && .venv-aiperf/bin/pip install aiperf==0.13.0"


def class_trace(students: int, turns: int, gap_s: float, stagger_s: float, output_tokens: int) -> list[TraceRequest]:
    """A class of `students`, one conversation each from the shipped English set, replies of a fixed
    length standing in for the engine's (their words do not matter to a replay: only what is sent)."""
    tokenizer = PromptTokenizer()
    hasher = BlockHasher()
    conversations = load_conversation_set("en")
    trace = []
    for student in range(students):
        conversation = conversations[student % len(conversations)]
        replies = [f"Here is a short answer to: {question} It depends on the model and the server."
                   for question in conversation.turns]
        for turn in range(min(turns, len(conversation.turns))):
            messages = conversation.messages(replies[:turn])
            tokens = tokenizer.tokens(messages)
            trace.append(TraceRequest(
                timestamp_ms=(student * stagger_s + turn * gap_s) * 1000, session_id=f"c{student + 1}",
                user=f"s{student + 1}", turn=turn + 1, input_length=len(tokens), output_length=output_tokens,
                hash_ids=hasher.hash_ids(tokens), messages=tuple(messages)))
    return sorted(trace, key=lambda r: r.timestamp_ms)


def vllm_histogram_mean_ms(root_url: str, name: str) -> tuple[float, float]:
    """(sum in s, count) of one of vLLM's own histograms (e.g. its TTFT), over all its label sets."""
    with urllib.request.urlopen(f"{root_url}/metrics", timeout=10) as response:
        text = response.read().decode("utf-8")
    total = count = 0.0
    for family in text_string_to_metric_families(text):
        if family.name == name:
            for sample in family.samples:
                total += sample.value if sample.name == f"{name}_sum" else 0.0
                count += sample.value if sample.name == f"{name}_count" else 0.0
    return total, count


def reset_prefix_cache(root_url: str) -> None:
    request = urllib.request.Request(f"{root_url}/reset_prefix_cache", data=b"", method="POST")
    with urllib.request.urlopen(request, timeout=30) as response:
        response.read()


# With --pin: the engine on CPU 0, each measuring tool on CPU 1 (Linux `taskset`), so neither tool's own
# processes take CPU from the engine it measures (on 2 shared cores AIPerf's did: vLLM's own TPOT was
# 7-9 % higher while AIPerf ran than while `bench replay` did).
ENGINE_CPUS = "0"
TOOL_CPUS = "1"


def ours(base_url: str, trace_path: Path, out: Path, pin: list[str]) -> dict:
    """`python -m bench replay` on the trace; `pin`: the command's prefix (`taskset`, or nothing)."""
    env = {**os.environ, "BACKENDS": "vllm", **backend_env("vllm", kind="vllm", base_url=base_url, label="vLLM")}
    result = subprocess.run([*pin, sys.executable, "-m", "bench", "replay", str(trace_path), "--backends", "vllm",
                             "--users", "x1", "--output", str(out)], cwd=REPO, env=env, capture_output=True,
                            text=True, timeout=900)
    if result.returncode != 0:
        raise RuntimeError(f"bench replay failed ({result.returncode}): {result.stderr[-2000:]}")
    summary = json.loads((out / "summary.json").read_text(encoding="utf-8"))
    level = summary["engines"][0]["levels"]["x1"]
    sent = len([line for line in trace_path.read_text(encoding="utf-8").splitlines() if line.strip()])
    return {"requests": sent, "completed": level["completed"], "input_tokens": level["total_input_tokens"],
            "output_tokens": level["total_output_tokens"], "mean_ttft_ms": level["mean_ttft_ms"],
            "mean_tpot_ms": level["mean_tpot_ms"], "output_tokens_per_s": level["output_throughput"]}


def aiperf(base_url: str, trace_path: Path, out: Path, pin: list[str]) -> dict:
    root = base_url.removesuffix("/v1")
    command = [str(AIPERF), "profile", "--model", BUNDLED_MODEL_NAME, "--tokenizer", str(BUNDLED_MODEL_DIR),
               "--endpoint-type", "chat", "--streaming", "--url", root, "--input-file", str(trace_path),
               "--custom-dataset-type", "mooncake_trace", "--fixed-schedule", "--use-server-token-count",
               "--extra-inputs", "ignore_eos:true", "--extra-inputs", "temperature:0", "--extra-inputs", "top_p:1",
               "--ui-type", "none", "--no-server-metrics", "--artifact-dir", str(out),
               # One worker and one record processor: on 2 cores AIPerf's own processes otherwise take
               # CPU from the engine it measures (seen: its TPOT 9 % above ours with its defaults).
               "--workers-max", "1", "--record-processors", "1"]
    # Not HF_HUB_OFFLINE: AIPerf 0.13 then looks a tokenizer up in the hub's cache only, and a local
    # folder fails ("Repo id must be in the form 'repo_name'"); a folder path needs no network.
    env = {key: value for key, value in os.environ.items() if key != "HF_HUB_OFFLINE"}
    result = subprocess.run([*pin, *command], cwd=out.parent, env=env, capture_output=True, text=True, timeout=900)
    if result.returncode != 0:
        raise RuntimeError(f"aiperf failed ({result.returncode}): {(result.stdout + result.stderr)[-3000:]}")
    export = next(out.rglob("profile_export_aiperf.json"))
    data = json.loads(export.read_text(encoding="utf-8"))
    metrics = data.get("records") or data

    def avg(name: str) -> float | None:
        value = metrics.get(name)
        return value.get("avg") if isinstance(value, dict) else None

    def total(name: str) -> float | None:
        value = metrics.get(name)
        if isinstance(value, dict):
            return value.get("sum") if value.get("sum") is not None else value.get("avg")
        return None

    count = avg("request_count")
    return {"requests": None if count is None else int(count),
            "completed": None if count is None else int(count) - int(avg("error_request_count") or 0),
            "input_tokens": total("total_isl") or total("input_sequence_length"),
            "output_tokens": total("total_osl") or total("output_sequence_length"),
            "mean_ttft_ms": avg("time_to_first_token"), "mean_tpot_ms": avg("inter_token_latency"),
            "output_tokens_per_s": avg("output_token_throughput"), "raw": export}


def goals(ours_runs: list[dict], theirs_runs: list[dict], sent: int) -> list[Goal]:
    result: list[Goal] = []
    for name, runs in (("ours", ours_runs), ("AIPerf", theirs_runs)):
        for index, run in enumerate(runs, 1):
            result.append(all_of(f"{name} run {index}: requests completed", run["completed"], sent))
    for index, (mine, theirs) in enumerate(zip(ours_runs, theirs_runs), 1):
        for key in ("requests", "input_tokens", "output_tokens"):
            result.append(Goal(f"run {index}: {key}, ours vs AIPerf", mine[key], low=theirs[key] or 0,
                               high=theirs[key] or 0, digits=0, stated=f"= AIPerf's {theirs[key]}",
                               why_unmeasured="no figure"))

    def mean(runs: list[dict], key: str) -> float | None:
        values = [run[key] for run in runs if run[key] is not None]
        return statistics.fmean(values) if values else None

    for key in ("mean_ttft_ms", "mean_tpot_ms", "output_tokens_per_s"):
        mine, theirs = mean(ours_runs, key), mean(theirs_runs, key)
        result.append(within_ratio(f"{key}, ours / AIPerf", mine / theirs if mine is not None and theirs else None,
                                   TOLERANCE, why_unmeasured=f"ours {mine}, AIPerf's {theirs}"))
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--students", type=int, default=6)
    parser.add_argument("--turns", type=int, default=4)
    parser.add_argument("--gap", type=float, default=8.0, help="seconds between a student's turns")
    parser.add_argument("--stagger", type=float, default=1.5, help="seconds between students' first turns")
    parser.add_argument("--output-tokens", type=int, default=24)
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--base-url", help="a running vLLM (VLLM_SERVER_DEV_MODE=1) serving the bundled model")
    parser.add_argument("--keep", type=Path, help="keep the trace and both tools' files here")
    parser.add_argument("--pin", action="store_true",
                        help=f"the engine on CPU {ENGINE_CPUS}, the tools on CPU {TOOL_CPUS} (taskset; started here only)")
    args = parser.parse_args(argv)
    if args.pin and args.base_url:
        parser.error("--pin pins the vLLM it starts: leave out --base-url")
    pin = ["taskset", "-c", TOOL_CPUS] if args.pin else []  # the prefix of each tool's command
    if not AIPERF.is_file():
        print(f"AIPerf is not installed: create its own venv with `{AIPERF_SETUP}`.", file=sys.stderr)
        return 2
    trace = class_trace(args.students, args.turns, args.gap, args.stagger, args.output_tokens)
    server = None
    base_url = args.base_url
    if base_url is None:
        port = free_port()
        command = server_command(model=BUNDLED_MODEL_DIR, served_model_name=BUNDLED_MODEL_NAME, port=port, cpu=True)
        env = {**server_env(cpu=True), "VLLM_SERVER_DEV_MODE": "1"}
        if args.pin:
            command = ["taskset", "-c", ENGINE_CPUS, *command]
            env["VLLM_CPU_OMP_THREADS_BIND"] = ENGINE_CPUS
        server = ServerProcess("vllm-trace-agreement", command, env=env)
        server.start_serving(f"http://127.0.0.1:{port}/health", 600)
        base_url = f"http://127.0.0.1:{port}/v1"
    root = base_url.removesuffix("/v1")
    ours_runs, theirs_runs = [], []
    try:
        with tempfile.TemporaryDirectory() as work:
            work_dir = args.keep or Path(work)
            work_dir.mkdir(parents=True, exist_ok=True)
            trace_path = work_dir / "class-trace.jsonl"
            trace_path.write_bytes(trace_jsonl(trace))
            print(f"trace: {len(trace)} requests of {args.students} students, "
                  f"{sum(r.input_length for r in trace)} prompt tokens (SmolLM2 tokenizer); "
                  f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}", flush=True)
            for run in range(1, args.runs + 1):
                order = (("ours", ours), ("aiperf", aiperf)) if run % 2 else (("aiperf", aiperf), ("ours", ours))
                for name, tool in order:
                    reset_prefix_cache(root)
                    before = {key: vllm_histogram_mean_ms(root, metric) for key, metric in VLLM_OWN.items()}
                    figures = tool(base_url, trace_path, work_dir / f"{name}-{run}", pin)
                    for key, metric in VLLM_OWN.items():  # vLLM's own figure for exactly this run's requests
                        (total, count), (total_0, count_0) = vllm_histogram_mean_ms(root, metric), before[key]
                        figures[f"vllm_own_{key}"] = (total - total_0) / (count - count_0) * 1000 if count > count_0 else None
                    (ours_runs if name == "ours" else theirs_runs).append(figures)
                    print(f"run {run} {name}: " + ", ".join(f"{k} {v:.1f}" if isinstance(v, float) else f"{k} {v}"
                                                             for k, v in figures.items() if k != "raw"), flush=True)
    finally:
        if server is not None:
            server.stop()
    return exit_status(goals(ours_runs, theirs_runs, len(trace)))


if __name__ == "__main__":
    sys.exit(main())
