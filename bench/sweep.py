"""`python -m bench sweep`: how many people can each engine serve at once under an SLO?

    python -m bench sweep [--backends vllm,llama_cpp] [--concurrency 1,2,4,8,16 | --rates 0.5,1,2,4
                          [--burstiness 1.0] [--max-concurrency N]] [--slo ttft_ms=500,tpot_ms=50]
                          [--percentile 90] [--requests 16] [--max-seconds 90] [--max-new-tokens 64]
                          [--prompts en|zh|FILE.jsonl | --conversations en|zh|FILE.jsonl [--think-time 1]]
                          [--seed 0] [--expect-capacity N] [--output DIR]

With --conversations a level's people talk through whole conversations (turn after
turn, reading each reply --think-time seconds): a level of N is N people in
conversation at once, and capacity.md adds TTFT by turn number.

Each chosen backend that is up (one at a time) gets the levels in order until it
saturates (achieved/offered request rate below 0.98, tokens/s no longer rising
with more people, or TTFT and the queue both still rising through a level); the
run ends with the plain answer per engine in English and Chinese and writes
DIR/capacity.md, sweep.csv, requests.csv, summary.json (vLLM's names, e.g.
request_goodput), latency.html/png and pareto.html/png (DIR defaults to
bench/results/sweep-<date-time>). `--goodput ttft:500 tpot:50` (vLLM's form) is
the same as `--slo`. Bounded: at most --requests per level (default 16; at least
one per person), no request sent after --max-seconds of a level; the defaults
finish in a few minutes per engine on a 2-core CPU. Ctrl-C writes what was
measured (exit 130).

Verdict (exit 1, naming it): no engine measured; a backend named in --backends
not measured; an engine whose lowest level had failed requests (the lowest load
must work); with --expect-capacity N, an engine holding the SLO at less than N
(people, or requests/s). Exit 2 for bad arguments.
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
from bench.verdict import Goal, all_of, at_least, exit_status
from bench.__main__ import add_workload_arguments, load_workload
from config import REPO, ConfigurationError, load_env
from core.load.prompt_sets import PromptSetError
from core.load.runner import planned_requests
from core.load.slo import SloError, parse_slo
from core.load.sweep import (DEFAULT_CONCURRENCY, DEFAULT_MAX_NEW_TOKENS, DEFAULT_MAX_SECONDS, DEFAULT_REQUESTS,
                             SweepRun, SweepSettings, capacity, run_sweep)

MAX_LEVEL_REQUESTS = 2000
MAX_LEVELS = 20


def _numbers(kind: str, whole: bool):
    def parse(text: str) -> tuple[float, ...]:
        try:
            values = tuple((int if whole else float)(part) for part in text.split(",") if part.strip())
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r}: give {kind} as numbers separated by commas, "
                                             f"e.g. {'1,2,4,8' if whole else '0.5,1,2'}") from None
        if not values or len(values) > MAX_LEVELS or any(value <= 0 for value in values):
            raise argparse.ArgumentTypeError(f"give 1..{MAX_LEVELS} {kind}, each above 0")
        if list(values) != sorted(set(values)):
            raise argparse.ArgumentTypeError(f"give the {kind} in increasing order, each once")
        return values
    return parse


def _bounded(kind, low: float, high: float):
    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"{value} is outside {low:g}..{high:g}")
        return value
    return parse


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench sweep", description=__doc__.splitlines()[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    parser.add_argument("--backends", help="configured backend names, comma-separated (default: all)")
    load = parser.add_mutually_exclusive_group()
    load.add_argument("--concurrency", type=_numbers("concurrency levels", True),
                      help="people at once, e.g. 1,2,4,8,16 (the default)")
    load.add_argument("--rates", "--request-rate", dest="rates", type=_numbers("request rates", False),
                      help="requests per second, e.g. 0.5,1,2,4 (gamma arrivals)")
    parser.add_argument("--burstiness", type=_bounded(float, 0.01, 100), default=1.0,
                        help="rate mode: gamma shape (1.0 = Poisson, as vLLM's --burstiness)")
    parser.add_argument("--max-concurrency", type=_bounded(int, 1, 1024),
                        help="rate mode: at most this many in flight (vLLM's --max-concurrency)")
    objective = parser.add_mutually_exclusive_group()
    objective.add_argument("--slo", default=None, help="e.g. ttft_ms=500,tpot_ms=50[,e2el_ms=3000] (that default)")
    objective.add_argument("--goodput", nargs="+", help="vLLM's form: ttft:500 tpot:50")
    parser.add_argument("--percentile", type=_bounded(float, 1, 100), default=90.0,
                        help="share of replies that must meet the SLO, in %% (90)")
    parser.add_argument("--requests", type=_bounded(int, 1, MAX_LEVEL_REQUESTS), default=DEFAULT_REQUESTS,
                        help=f"requests per level ({DEFAULT_REQUESTS}; at least one per person)")
    parser.add_argument("--max-seconds", type=_bounded(float, 1, 3600), default=DEFAULT_MAX_SECONDS,
                        help=f"per level: no request is sent after this ({DEFAULT_MAX_SECONDS:g})")
    parser.add_argument("--max-new-tokens", type=_bounded(int, 1, 4096), default=DEFAULT_MAX_NEW_TOKENS,
                        help=f"per request ({DEFAULT_MAX_NEW_TOKENS})")
    add_workload_arguments(parser)
    parser.add_argument("--warmup", type=_bounded(int, 0, 100), default=1, help="warm-up requests per engine (1)")
    parser.add_argument("--seed", type=_bounded(int, 0, 2 ** 31), default=0, help="arrival schedule seed (0)")
    parser.add_argument("--expect-capacity", type=_bounded(float, 0.001, 100000),
                        help="goal: every engine holds the SLO at least at this level")
    parser.add_argument("--lang", choices=("en", "zh"), default=None,
                        help="language of the answer printed at the end (default: from LANG; both go to capacity.md)")
    parser.add_argument("--output", type=Path, help="folder for the files (default bench/results/sweep-<time>)")
    args = parser.parse_args(argv)
    if args.rates is None and (args.max_concurrency is not None or args.burstiness != 1.0):
        parser.error("--burstiness and --max-concurrency belong to a rate sweep: give --rates too")
    return args


def settings_from(args: argparse.Namespace) -> SweepSettings:
    """Raises SloError for an objective that cannot be read."""
    slo = parse_slo(" ".join(args.goodput) if args.goodput else (args.slo or "ttft_ms=500,tpot_ms=50"),
                    percentile=args.percentile)
    mode = "rate" if args.rates else "concurrency"
    levels = args.rates or args.concurrency or DEFAULT_CONCURRENCY
    return SweepSettings(mode=mode, levels=tuple(float(level) for level in levels), slo=slo, requests=args.requests,
                         max_seconds=args.max_seconds, max_new_tokens=args.max_new_tokens,
                         burstiness=args.burstiness, max_concurrency=args.max_concurrency, warmup=args.warmup,
                         seed=args.seed, prompt_set=args.conversations or args.prompts or "en",
                         conversations=bool(args.conversations),
                         think_time_s=args.think_time if args.conversations else 0.0)


def sweep_goals(run: SweepRun, required: list[str] | tuple[str, ...] = (),
                expect_capacity: float | None = None) -> list[Goal]:
    """What a sweep must achieve: an engine measured; each backend asked for by name measured; at each
    engine's lowest level every request completed; with `expect_capacity`, each engine's capacity."""
    measured = {engine.name for engine in run.engines}
    skipped = "; ".join(f"{name}: {reason}" for name, reason in run.skipped.items())
    goals = [at_least("engines swept", len(run.engines) or None, 1, digits=0,
                      why_unmeasured=f"none ({skipped})" if skipped else "none")]
    for name in required:
        if name not in measured:
            goals.append(at_least(f"{name} swept", None, 1, digits=0,
                                  why_unmeasured=f"skipped ({run.skipped.get(name, 'not run')})"))
    for engine in run.engines:
        if engine.levels:
            lowest = engine.levels[0].summary
            goals.append(all_of(f"{engine.label} at its lowest level: requests completed", lowest.completed,
                                lowest.completed + lowest.failed))
        if expect_capacity is not None:
            answer = capacity(run.settings.mode, engine)
            held = answer.holds_up_to if answer else None
            goals.append(at_least(f"{engine.label}: load holding the SLO", held, expect_capacity, digits=2,
                                  why_unmeasured="no level held it"))
    return goals


async def _main(args: argparse.Namespace, settings: SweepSettings, names: list[str], registry: Registry,
                prompts, required: list[str]) -> int:
    from bench.progress import progress_bar, request_progress
    from core.load.article import hardware_summary
    from core.load.sweep_report import answers, levels_table, write_sweep

    total = len(names) * (settings.warmup + sum(planned_requests(
        prompts, settings.requests_at(level), int(level) if settings.mode == "concurrency" else 1)
        for level in settings.levels))
    bar = progress_bar(total)
    progress = request_progress(bar)

    def on_level(engine, figures) -> None:
        share = "–" if figures.slo_share is None else f"{figures.slo_share:.0%}"
        bar.write(f"{engine.label} at {settings.level_label(figures.level)}: SLO met by {share}, "
                  f"{figures.summary.output_throughput:.1f} tokens/s"
                  + (f"; saturated: {figures.saturation}" if figures.saturation else ""))

    try:
        run = await run_sweep(registry, names, prompts, settings, hardware_summary(), progress=progress,
                              on_level=on_level)
    finally:
        bar.close()
        await registry.aclose()
    output = args.output or REPO / "bench" / "results" / datetime.now().strftime("sweep-%Y%m%d-%H%M%S")
    paths = write_sweep(run, output)
    lang = args.lang or ("zh" if os.environ.get("LANG", "").startswith("zh") else "en")
    print()
    print(levels_table(run))
    print()
    for line in answers(run, lang):
        print(line)
    print("Wrote " + ", ".join(str(path) for path in paths.values()))
    if run.interrupted:
        return 130
    return exit_status(sweep_goals(run, required, args.expect_capacity))


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    load_env()
    try:
        settings = settings_from(args)
        registry = Registry.from_env(dict(os.environ))
        prompts = load_workload(args)
        names = [n.strip() for n in args.backends.split(",") if n.strip()] if args.backends else registry.names
        for name in names:
            registry.get(name)
    except (ConfigurationError, PromptSetError, UnknownBackend, SloError, ValueError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    try:
        required = names if args.backends else []
        return asyncio.run(_main(args, settings, names, registry, prompts, required))
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
