"""`python -m bench`: the article's table on this hardware (`python -m bench sweep`: capacity, see bench/sweep.py).

    python -m bench [--backends vllm,tgi,llama_cpp] [--concurrency 1,8] [--requests 16]
                    [--max-new-tokens 128] [--prompts en|zh|FILE.jsonl | --conversations en|zh|FILE.jsonl
                    [--think-time 1]] [--warmup 1] [--output DIR]
    python -m bench sweep ...      the capacity sweep (bench/sweep.py)
    python -m bench replay TRACE   a class's recorded traffic on the engines (bench/replay.py)

With --conversations each person at a level talks through whole conversations
(prompts/conversations/: a class's system prompt and several turns), reading each
reply for --think-time seconds before the next turn; the table adds TTFT by turn
number and how much of each turn's prompt the engine took from its cache.

Measures every chosen backend of `.env` that is up (default: all configured)
at each concurrency, one backend at a time, with the app's own load engine and
timing module, and writes DIR/table.md, requests.csv, summary.json and
chart.png (DIR defaults to bench/results/<date-time>). A progress bar shows the
requests; a backend that is down or fails is reported and the others still
run; Ctrl-C writes what was measured so far (exit 130). It exits 1, naming
why, when nothing was measured, a backend named in --backends was not, or a
measured level has failed requests; 2 for bad arguments.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from datetime import datetime
from pathlib import Path

from backends.errors import UnknownBackend
from backends.registry import Registry
from core.load.article import BenchmarkRun, RunSettings, article_table, run_benchmark, turn_lines, write_outputs
from core.load.prompt_sets import PromptSetError, load_conversation_set, load_prompt_set
from core.load.runner import planned_requests
from bench.verdict import Goal, all_of, at_least, exit_status
from config import REPO, ConfigurationError, load_env

MAX_REQUESTS = 10_000
MAX_CONCURRENCY = 512


def _levels(text: str) -> tuple[int, ...]:
    try:
        levels = tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: give concurrency levels as whole numbers, e.g. 1,8") from None
    if not levels or not all(1 <= level <= MAX_CONCURRENCY for level in levels):
        raise argparse.ArgumentTypeError(f"concurrency levels must be 1..{MAX_CONCURRENCY}")
    return levels


def _whole(low: int, high: int):
    """An argparse type: a whole number in low..high, else a clear error (never quietly changed)."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"{value} is outside {low}..{high}")
        return value
    return parse


def benchmark_goals(run: BenchmarkRun, required: list[str] | tuple[str, ...] = ()) -> list[Goal]:
    """What a run must achieve to be a measurement: at least one engine measured; every backend
    named in `required` (asked for by name) measured, not skipped; and every request of every
    measured level completed (a level with failures would show figures of a subset)."""
    measured = {engine.name for engine in run.engines}
    skipped = "; ".join(f"{name}: {reason}" for name, reason in run.skipped.items())
    goals = [at_least("engines measured", len(run.engines) or None, 1, digits=0,
                      why_unmeasured=f"none ({skipped})" if skipped else "none")]
    for name in required:
        if name not in measured or name in run.skipped:
            goals.append(at_least(f"{name} measured", None, 1, digits=0,
                                  why_unmeasured=f"skipped ({run.skipped.get(name, 'not run')})"))
    for engine in run.engines:
        for summary in engine.summaries:
            goals.append(all_of(f"{engine.label} at {summary.concurrency} concurrent: requests completed",
                                summary.completed, summary.completed + summary.failed))
    return goals



def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__.splitlines()[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    parser.add_argument("--backends", help="configured backend names, comma-separated (default: all)")
    parser.add_argument("--concurrency", type=_levels, default=(1, 8), help="levels, e.g. 1,8 (default 1,8)")
    parser.add_argument("--requests", type=_whole(1, MAX_REQUESTS), default=16, help="requests per level (16)")
    parser.add_argument("--max-new-tokens", type=_whole(1, 4096), default=128, help="per request (128)")
    add_workload_arguments(parser)
    parser.add_argument("--warmup", type=_whole(0, 100), default=1, help="warm-up requests per backend (1)")
    parser.add_argument("--output", type=Path, help="folder for the four files (default bench/results/<time>)")
    return parser.parse_args(argv)


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not 0 <= value <= 600:
        raise argparse.ArgumentTypeError(f"{value:g} is outside 0..600 seconds")
    return value


def add_workload_arguments(parser: argparse.ArgumentParser) -> None:
    """--prompts or --conversations (with --think-time): what each level sends (bench and bench sweep)."""
    workload = parser.add_mutually_exclusive_group()
    workload.add_argument("--prompts", default=None, help="zh, en or a JSONL file of single prompts (default en)")
    workload.add_argument("--conversations", default=None,
                          help="zh, en or a JSONL file of conversations (prompts/conversations/): multi-turn")
    parser.add_argument("--think-time", type=_seconds, default=1.0,
                        help="conversations: seconds a person reads a reply before the next turn (1)")


def load_workload(args: argparse.Namespace):
    """The prompts or conversations the arguments name (raises PromptSetError)."""
    if args.conversations:
        return load_conversation_set(args.conversations)
    return load_prompt_set(args.prompts or "en")


async def _main(args: argparse.Namespace, names: list[str], registry: Registry, prompts,
                required: list[str]) -> int:
    from bench.progress import progress_bar, request_progress

    settings = RunSettings(concurrency=args.concurrency, requests=args.requests,
                           max_new_tokens=args.max_new_tokens, warmup=args.warmup,
                           prompt_set=args.conversations or args.prompts or "en",
                           conversations=bool(args.conversations),
                           think_time_s=args.think_time if args.conversations else 0.0)
    total = len(names) * (settings.warmup + sum(
        planned_requests(prompts, settings.requests, level) for level in settings.concurrency))
    bar = progress_bar(total)
    progress = request_progress(bar)

    try:
        run = await run_benchmark(registry, names, prompts, settings, progress)
    finally:
        bar.close()
        await registry.aclose()
    output = args.output or REPO / "bench" / "results" / datetime.now().strftime("%Y%m%d-%H%M%S")
    paths = write_outputs(run, output)
    print()
    print(article_table(run))
    if run.settings.conversations:
        print("TTFT by turn (mean):")
        for line in turn_lines(run):
            print(f"  {line}")
    print("Wrote " + ", ".join(str(path) for path in paths.values()))
    if run.interrupted:
        return 130
    return exit_status(benchmark_goals(run, required))


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["sweep"]:  # python -m bench sweep ...: the capacity sweep (bench/sweep.py)
        from bench.sweep import main as sweep_main
        return sweep_main(argv[1:])
    if argv[:1] == ["replay"]:  # python -m bench replay TRACE: a class's traffic (bench/replay.py)
        from bench.replay import main as replay_main
        return replay_main(argv[1:])
    args = parse_args(argv)
    load_env()
    try:
        registry = Registry.from_env(dict(os.environ))
        prompts = load_workload(args)
        names = [n.strip() for n in args.backends.split(",") if n.strip()] if args.backends else registry.names
        for name in names:
            registry.get(name)
    except (ConfigurationError, PromptSetError, UnknownBackend) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    try:
        # Backends asked for by name must be measured; of all configured ones, any that are up.
        required = names if args.backends else []
        return asyncio.run(_main(args, names, registry, prompts, required))
    except KeyboardInterrupt:  # a second Ctrl-C while writing
        return 130


if __name__ == "__main__":
    sys.exit(main())
