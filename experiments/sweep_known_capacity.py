"""Does a capacity sweep measure a real engine's known capacity, fast replies and all?

The paced OpenAI-protocol server generates at most 2 replies at once (`--rate` tokens/s each,
`--tokens` tokens); the rest wait before their first token, and its /metrics says so under vLLM's
names. `python -m bench sweep` runs against it at 1, 2, 4 and 8 people, under an objective set just
above one reply's length (`--slo`), and this prints its throughput per level and judges:

- tokens/s at 2 people over tokens/s at 1: two slots serve twice one. Goal: 2.0 within 15 %.
- tokens/s at the last level over tokens/s at 2: past 2 people nothing more. Goal: 1.0 within 10 %.
- capacity: the sweep's answer. Goal: exactly 2 people.

With short replies (0.4 s by default) the gaps between a person's requests and the machine's
load decide how close the ratios come, which is why these are goals here, with a verdict (exit 1
on a miss), and not in tests/test_sweep.py: that test runs 1 s replies under a wide objective and
checks what the construction fixes (levels, gauges, the answer), not how fast a machine is.

Run: `.venv/bin/python -m experiments.sweep_known_capacity [--rate 100] [--tokens 40] [--requests 8]`
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from bench.verdict import Goal, exit_status, within_ratio
from config import REPO
from servers.app import backend_env
from servers.paced_openai import start_paced_server


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rate", type=float, default=100.0, help="tokens/s per reply (default 100)")
    parser.add_argument("--tokens", type=int, default=40, help="tokens per reply (default 40)")
    parser.add_argument("--requests", type=int, default=8, help="requests per level (default 8)")
    parser.add_argument("--slo", default="ttft_ms=250,tpot_ms=20", help="the sweep's objective")
    args = parser.parse_args()

    paced = start_paced_server(rate_tokens_per_s=args.rate, tokens=args.tokens, name="bench-paced-sweep")
    try:
        paced.set_faults(slots=2)
        env = {"BACKENDS": "paced", **backend_env("paced", kind="openai", base_url=paced.base_url, label="Paced")}
        with tempfile.TemporaryDirectory() as output:
            result = subprocess.run(
                [sys.executable, "-m", "bench", "sweep", "--concurrency", "1,2,4,8", "--requests", str(args.requests),
                 "--max-new-tokens", str(args.tokens), "--warmup", "0", "--slo", args.slo, "--output", output],
                cwd=REPO, env={**os.environ, **env}, capture_output=True, text=True, timeout=600)
            rows = list(csv.DictReader(open(Path(output) / "sweep.csv", encoding="utf-8"))) \
                if (Path(output) / "sweep.csv").exists() else []
            summary = json.loads((Path(output) / "summary.json").read_text()) \
                if (Path(output) / "summary.json").exists() else {"engines": []}
    finally:
        paced.stop()
    if result.returncode not in (0, 1):
        print(result.stdout[-2000:] + result.stderr[-2000:], file=sys.stderr)
    print(f"paced server: 2 slots, {args.rate:g} tokens/s, {args.tokens} tokens; objective {args.slo}")
    print(f"{'people':>7} {'tokens/s':>10} {'SLO share':>10}  saturation")
    for row in rows:
        print(f"{float(row['level']):>7g} {float(row['output_throughput']):>10.1f} {float(row['slo_share']):>10.2f}  "
              f"{row['saturation']}")
    throughput = [float(row["output_throughput"]) for row in rows]
    capacity = summary["engines"][0]["capacity"]["holds_up_to"] if summary["engines"] else None
    goals = [
        within_ratio("tokens/s at 2 people / (2 x at 1)", throughput[1] / throughput[0] / 2 if len(rows) > 1 else None,
                     0.15),
        within_ratio("tokens/s at the last level / at 2", throughput[-1] / throughput[1] if len(rows) > 2 else None,
                     0.10),
        Goal("capacity, people", capacity, low=2, high=2, digits=0, stated="exactly 2"),
    ]
    return exit_status(goals)


if __name__ == "__main__":
    sys.exit(main())
