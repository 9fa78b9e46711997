"""`python -m bench replay TRACE`: a class's recorded traffic sent to the engines again - would it fit?

    python -m bench replay TRACE [--backends vllm,llama_cpp] [--speed 1] [--users x1,x2]
                               [--slo ttft_ms=500] [--percentile 90] [--lang en|zh] [--output DIR]

TRACE is a class trace the app exported (/trace, core/load/trace.py documents the lines) or any
Mooncake/AIPerf trace with timestamps, input_length and hash_ids. Each chosen backend that is up
(one after another) gets the whole trace at its real pace (--speed 2: twice as fast), once for each
--users factor (x2: twice the students, each copy's conversations shifted by up to 30 s); every
reply as long as in class, greedy, measured by the app's own load engine. The answer, per engine, in
the capacity sweep's words: "Today's class (28 students, 412 messages, at most 9 at once) would have
met TTFT under 500 ms for 97% of replies on vLLM and 41% on llama.cpp; at twice the class, 88% and
12%." DIR (default bench/results/replay-<date-time>) gets replay.md, requests.csv and summary.json.

Verdict (exit 1, naming it): no engine measured; a backend named in --backends not measured. Exit 2
for bad arguments or a trace that cannot be read; 130 after Ctrl-C (what was measured is written).
"""

from __future__ import annotations

import argparse
import asyncio
import csv
import json
import os
import sys
from dataclasses import asdict
from datetime import datetime
from pathlib import Path

from backends.errors import UnknownBackend
from backends.registry import Registry
from bench.verdict import Goal, at_least, exit_status
from config import REPO, ConfigurationError, load_env
from core.load.class_fit import ClassFit
from core.load.slo import DEFAULT_PERCENTILE, SloError, parse_slo
from core.load.stats import REQUEST_COLUMNS, as_json, by_turn, request_row, summarise, turns_line
from core.load.trace import TraceError, read_trace

REPLAY_SLO = "ttft_ms=500"  # "would have met TTFT under 500 ms for 97% of replies"


def _factors(text: str) -> tuple[float, ...]:
    try:
        factors = tuple(float(part.strip().lstrip("x×")) for part in text.split(",") if part.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: give student factors like x1,x2") from None
    if not factors or any(not 0 < f <= 20 for f in factors):
        raise argparse.ArgumentTypeError("each --users factor must be above 0 and at most x20")
    return factors


def _speed(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not 0.05 <= value <= 100:
        raise argparse.ArgumentTypeError(f"{value:g} is outside 0.05..100")
    return value


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench replay", description=__doc__.splitlines()[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    parser.add_argument("trace", type=Path, help="a class trace (JSONL)")
    parser.add_argument("--backends", help="configured backend names, comma-separated (default: all)")
    parser.add_argument("--speed", type=_speed, default=1.0, help="pace: 2 = twice as fast (1)")
    parser.add_argument("--users", type=_factors, default=(1.0, 2.0), help="student factors, e.g. x1,x2 (x1,x2)")
    parser.add_argument("--slo", default=REPLAY_SLO, help=f"e.g. ttft_ms=500,tpot_ms=50 (default {REPLAY_SLO})")
    parser.add_argument("--percentile", type=float, default=DEFAULT_PERCENTILE, help="kept for the SLO's record")
    parser.add_argument("--lang", choices=("en", "zh"), default=None, help="the answer's language (both in replay.md)")
    parser.add_argument("--output", type=Path, help="folder for the files (default bench/results/replay-<time>)")
    return parser.parse_args(argv)


def replay_goals(fit: ClassFit, required: list[str]) -> list[Goal]:
    measured = {engine.name for engine in fit.engines if engine.shares}
    skipped = "; ".join(f"{name}: {why}" for name, why in fit.skipped.items())
    goals = [at_least("engines measured", len(measured) or None, 1, digits=0,
                      why_unmeasured=f"none ({skipped})" if skipped else "none")]
    for name in required:
        if name not in measured:
            why = fit.skipped.get(name) or next((e.problem for e in fit.engines if e.name == name and e.problem),
                                                "not run")
            goals.append(at_least(f"{name} measured", None, 1, digits=0, why_unmeasured=why))
    return goals


def write_replay(fit: ClassFit, directory: Path, trace_path: Path) -> dict[str, Path]:
    directory.mkdir(parents=True, exist_ok=True)
    paths = {name: directory / name for name in ("replay.md", "requests.csv", "summary.json")}
    lines = ["# Would today's class fit?", "", f"- {fit.answer('en')}", f"- {fit.answer('zh')}", "",
             "## TTFT by turn", ""]
    for engine in fit.engines:
        for factor, level in engine.levels.items():
            lines.append(f"- {engine.label} at x{factor:g}: {turns_line(by_turn(level.outcomes))}")
    shape = fit.shape
    lines += ["", "## Conditions", "",
              f"- Trace: `{trace_path.name}`: {shape.students} students, {shape.messages} messages in "
              f"{shape.conversations} conversations over {shape.duration_s:.0f} s; "
              + (f"at most {shape.most_at_once} at once in class." if shape.most_at_once is not None else
                 "how many were at once in class is not recorded (the trace has no durations)."),
              f"- Pace x{fit.speed:g}; students x{', x'.join(f'{f:g}' for f in fit.factors)}; every reply as long as "
              "in class (ignore_eos), greedy; a conversation's turn leaves at its time or after the turn before.",
              f"- SLO: {fit.slo.as_dict()}; a failed reply misses it.",
              *[f"- Not measured: {name}: {why}" for name, why in fit.skipped.items()],
              *[f"- {e.label}: {e.problem}" for e in fit.engines if e.problem]]
    if fit.interrupted:
        lines.append("- Interrupted: these are the replays measured so far.")
    paths["replay.md"].write_text("\n".join(lines) + "\n", encoding="utf-8")
    with open(paths["requests.csv"], "w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=("users_factor",) + REQUEST_COLUMNS)
        writer.writeheader()
        for engine in fit.engines:
            for factor, level in engine.levels.items():
                writer.writerows({"users_factor": factor} | request_row(level, o, stand_in=False)
                                 for o in level.outcomes)
    summary = {"trace": str(trace_path), "speed": fit.speed, "factors": list(fit.factors),
               "slo": fit.slo.as_dict(), "class": asdict(shape), "answers": {"en": fit.answer("en"),
                                                                             "zh": fit.answer("zh")},
               "skipped": fit.skipped, "interrupted": fit.interrupted,
               "engines": [{"backend": e.name, "label": e.label, "model": e.model, "problem": e.problem,
                            "slo_share": {f"x{f:g}": share for f, share in e.shares.items()},
                            "levels": {f"x{f:g}": as_json(summarise(level), level)
                                       for f, level in e.levels.items()}} for e in fit.engines]}
    paths["summary.json"].write_text(json.dumps(summary, indent=1, ensure_ascii=False), encoding="utf-8")
    return paths


async def _main(args, fit: ClassFit, registry: Registry, names: list[str], required: list[str]) -> int:
    from bench.progress import progress_bar, request_progress

    total = sum(len(fit.trace) * (int(f) + (1 if f % 1 else 0)) for f in fit.factors) * len(names)
    bar = progress_bar(total)
    progress = request_progress(bar)
    try:
        await fit.run(registry, names, on_done=progress)
    finally:
        bar.close()
        await registry.aclose()
    output = args.output or REPO / "bench" / "results" / datetime.now().strftime("replay-%Y%m%d-%H%M%S")
    paths = write_replay(fit, output, args.trace)
    lang = args.lang or ("zh" if os.environ.get("LANG", "").startswith("zh") else "en")
    print()
    print(fit.answer(lang))
    print("Wrote " + ", ".join(str(path) for path in paths.values()))
    if fit.interrupted:
        return 130
    return exit_status(replay_goals(fit, required))


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    load_env()
    try:
        slo = parse_slo(args.slo, percentile=args.percentile)
        trace = read_trace(args.trace)
        registry = Registry.from_env(dict(os.environ))
        names = [n.strip() for n in args.backends.split(",") if n.strip()] if args.backends else registry.names
        for name in names:
            registry.get(name)
    except (ConfigurationError, UnknownBackend, SloError, TraceError, ValueError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    fit = ClassFit(trace, slo, factors=args.users, speed=args.speed)
    try:
        return asyncio.run(_main(args, fit, registry, names, names if args.backends else []))
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
