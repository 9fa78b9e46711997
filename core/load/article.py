"""The article's benchmark on any hardware: run it, and write its table, requests, summary and chart.

`run_benchmark` measures every chosen backend that is up at each concurrency
level with the one load engine (`core.load.runner`) and the one measurement module
(`timing`); `write_outputs` writes `table.md` (the article's layout: engines as
columns, its six rows, and the run's conditions), `requests.csv` (one row per
request), `summary.json` (per backend and level, under `vllm bench serve`'s
field names) and `chart.png`. `python -m bench` and the chat's `/bench` both
use them.
"""

from __future__ import annotations

import asyncio
import csv
import json
import os
import platform
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable, Sequence

import psutil

from backends.base import GenerationParams, display_label
from backends.errors import BackendError
from backends.registry import Registry
from core.load.engine_memory import MemoryReading, measure_memory
from core.load.runner import LevelResult, RequestOutcome, Workload, run_level, warm_up_prompts
from core.load.stats import REQUEST_COLUMNS, LevelSummary, as_json, by_turn, request_row, summarise, turns_line


@dataclass(frozen=True)
class RunSettings:
    """What was asked of the run (it goes into the table as the run's conditions)."""

    concurrency: tuple[int, ...] = (1, 8)
    requests: int = 16
    max_new_tokens: int = 128
    warmup: int = 1
    prompt_set: str = "en"
    conversations: bool = False  # `prompt_set` names a conversation set: people talk turn after turn
    think_time_s: float = 0.0  # between a person's turns (conversations only)

    def workload_text(self) -> str:
        if not self.conversations:
            return f"Prompt set: {self.prompt_set}"
        return (f"Conversation set: {self.prompt_set}, each person one whole conversation at a time "
                f"({self.think_time_s:g} s reading each reply before the next turn)")


@dataclass
class EngineResult:
    """One engine's column: what it is, its memory after load, and each level's figures."""

    name: str
    label: str
    model: str
    server_version: str | None
    stand_in: str | None
    memory: MemoryReading | None = None
    levels: list[LevelResult] = field(default_factory=list)
    summaries: list[LevelSummary] = field(default_factory=list)

    def at(self, concurrency: int) -> LevelSummary | None:
        return next((s for s in self.summaries if s.concurrency == concurrency), None)


@dataclass
class BenchmarkRun:
    """Everything one run measured (possibly interrupted), and the backends it skipped and why."""

    settings: RunSettings
    engines: list[EngineResult]
    skipped: dict[str, str]
    hardware: str
    started_at: datetime
    interrupted: bool = False


def hardware_summary() -> str:
    """CPU model, cores and memory, and the GPUs NVML sees (or that there is none)."""
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as cpuinfo:
            cpu = next((line.split(":", 1)[1].strip() for line in cpuinfo if line.startswith("model name")), cpu)
    except OSError:
        pass
    memory_gib = psutil.virtual_memory().total / 1024 ** 3
    gpus = _gpu_names()
    return f"{cpu}, {os.cpu_count()} cores, {memory_gib:.0f} GiB RAM; {gpus}"


def _gpu_names() -> str:
    try:
        import pynvml
    except ImportError:
        return "no GPU seen (nvidia-ml-py is not installed)"
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return "no GPU (NVML not available)"
    try:
        names = [pynvml.nvmlDeviceGetName(pynvml.nvmlDeviceGetHandleByIndex(i))
                 for i in range(pynvml.nvmlDeviceGetCount())]
        return ", ".join(str(n) for n in names) or "no GPU"
    finally:
        pynvml.nvmlShutdown()


ProgressCallback = Callable[[str, RequestOutcome | None], None]


async def run_benchmark(
    registry: Registry,
    names: Sequence[str],
    prompts: Workload,
    settings: RunSettings,
    progress: ProgressCallback | None = None,
) -> BenchmarkRun:
    """Warm up, read memory, then run every level on every backend that is up, one backend at a time.

    A backend that is down or fails is reported in `skipped` and the run goes on.
    Cancelled (Ctrl-C), it returns what was measured so far, marked `interrupted`.
    """
    params = GenerationParams(temperature=0.0, top_p=1.0, max_new_tokens=settings.max_new_tokens)
    run = BenchmarkRun(settings, [], {}, hardware_summary(), datetime.now(timezone.utc))
    try:
        for name in names:
            await _run_engine(registry, name, prompts, settings, params, run, progress)
    except asyncio.CancelledError:
        run.interrupted = True
    return run


async def _run_engine(registry: Registry, name: str, prompts: Workload, settings: RunSettings,
                      params: GenerationParams, run: BenchmarkRun, progress: ProgressCallback | None) -> None:
    backend = registry.get(name)
    status = await registry.status(name)
    if not status.available or status.info is None:
        run.skipped[name] = status.reason or "not available"
        return
    info = status.info
    engine = EngineResult(name, backend.label, info.model_id, info.server_version, info.stand_in)
    run.engines.append(engine)
    token_cache: dict[str, int | None] = {}

    def report(stage: str):
        return (lambda outcome: progress(stage, outcome)) if progress else None

    try:
        await backend.warm_up()
        if settings.warmup:
            await run_level(backend, warm_up_prompts(prompts), concurrency=1, requests=settings.warmup, params=params,
                            model=info.model_id, on_done=report(f"{backend.label}: warm-up"), token_cache=token_cache)
        engine.memory = measure_memory(backend)
        for concurrency in settings.concurrency:
            level = await run_level(backend, prompts, concurrency=concurrency, requests=settings.requests,
                                    params=params, model=info.model_id, token_cache=token_cache,
                                    on_done=report(f"{backend.label}: {concurrency} concurrent"),
                                    think_time_s=settings.think_time_s)
            engine.levels.append(level)
            engine.summaries.append(summarise(level))
            if level.interrupted:
                raise asyncio.CancelledError
    except BackendError as error:
        run.skipped[name] = f"failed during the run: {error.describe()}"


# ---------------------------------------------------------------- outputs


def _number(value: float | None, digits: int = 1) -> str:
    return "–" if value is None else f"{value:,.{digits}f}"


def _memory_cell(value: float | None, note: str) -> str:
    return f"{value:,.0f} MiB" if value is not None else note


def article_table(run: BenchmarkRun) -> str:
    """The article's table: engines as columns, its six rows (plus one per extra level), and the conditions."""
    engines = run.engines
    levels = list(run.settings.concurrency)
    first = levels[0]

    def header(engine: EngineResult) -> str:
        mark = " †" if engine.stand_in else ""
        return f"{engine.label}{mark}".replace("|", "\\|")

    rows = [
        ("GPU memory after load", [_memory_cell(e.memory.gpu_mib, e.memory.gpu_note) if e.memory else "–"
                                   for e in engines]),
        ("CPU memory (RSS of the serving process)", [_memory_cell(e.memory.cpu_rss_mib, e.memory.cpu_note)
                                                     if e.memory else "–" for e in engines]),
        (f"TTFT (ms), mean at {first} concurrent", [_number(s.ttft_ms.mean) if (s := e.at(first)) else "–"
                                                    for e in engines]),
        (f"ms per output token (TPOT), mean at {first} concurrent",
         [_number(s.tpot_ms.mean, 2) if (s := e.at(first)) else "–" for e in engines]),
    ]
    for level in levels:
        rows.append((f"tokens/s at {level} concurrent (all requests)",
                     [_number(s.output_throughput) if (s := e.at(level)) else "–" for e in engines]))
    rows.append(("mean input length (tokens, each engine's own tokenizer)",
                 [_number(e.summaries[0].mean_input_tokens, 0) if e.summaries else "–" for e in engines]))
    if run.settings.conversations:
        turns = sorted({t.turn for e in engines for level in e.levels[:1] for t in by_turn(level.outcomes)})
        for turn in turns:
            rows.append((f"TTFT (ms) of turn {turn}, mean at {first} concurrent (prompt tokens from cache)",
                         [_turn_cell(e, turn) for e in engines]))
    failures = [sum(s.failed for s in e.summaries) for e in engines]
    if any(failures):
        rows.append(("failed requests", [str(count) for count in failures]))
    lines = ["| | " + " | ".join(header(e) for e in engines) + " |",
             "|---|" + "---|" * len(engines)]
    lines += [f"| {label} | " + " | ".join(cells) + " |" for label, cells in rows]
    settings = run.settings
    conditions = [
        "",
        f"Hardware: {run.hardware}.",
        "Models: " + "; ".join(f"{e.label}: `{e.model}`" + (f" ({e.server_version})" if e.server_version else "")
                               for e in engines) + ".",
        f"{settings.workload_text()}; {settings.requests} requests per level, "
        f"{settings.warmup} warm-up request(s) per engine; at most {settings.max_new_tokens} new tokens, greedy.",
        f"Measured {run.started_at:%Y-%m-%d %H:%M} UTC by `python -m bench` with the app's own timing module.",
    ]
    for engine in engines:
        if engine.stand_in:
            conditions.append(f"† {engine.label} is a stand-in: {engine.stand_in}. Its numbers are not that engine's.")
    for name, reason in run.skipped.items():
        conditions.append(f"Not measured: {name}: {reason}")
    if run.interrupted:
        conditions.append("Interrupted: the run was stopped before the end; these are the figures measured so far.")
    return "\n".join(lines + conditions) + "\n"


def _turn_cell(engine: EngineResult, turn: int) -> str:
    """'412.3 (88%)': a turn's mean TTFT at the first level, and the share of its prompt the engine
    took from its cache ('cache not reported' where it does not say)."""
    figures = next((t for level in engine.levels[:1] for t in by_turn(level.outcomes) if t.turn == turn), None)
    if figures is None or figures.ttft_ms.mean is None:
        return "–"
    share = figures.cached_share
    return f"{figures.ttft_ms.mean:,.1f} ({'cache not reported' if share is None else f'{share:.0%}'})"


def turn_lines(run: BenchmarkRun) -> list[str]:
    """Per engine and level, TTFT by turn number: where the engine's prefix cache shows."""
    return [f"{display_label(e.label, e.stand_in)} at {level.concurrency} concurrent: {turns_line(by_turn(level.outcomes))}"
            for e in run.engines for level in e.levels]


def write_outputs(run: BenchmarkRun, directory: Path) -> dict[str, Path]:
    """table.md, requests.csv, summary.json and chart.png in `directory` (created)."""
    directory.mkdir(parents=True, exist_ok=True)
    paths = {name: directory / name for name in ("table.md", "requests.csv", "summary.json", "chart.png")}
    paths["table.md"].write_text(article_table(run), encoding="utf-8")
    with open(paths["requests.csv"], "w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=REQUEST_COLUMNS)
        writer.writeheader()
        for engine in run.engines:
            for level in engine.levels:
                writer.writerows(request_row(level, outcome, stand_in=bool(engine.stand_in))
                                 for outcome in level.outcomes)
    summary = {
        "started_at": run.started_at.isoformat(), "hardware": run.hardware, "settings": asdict(run.settings),
        "interrupted": run.interrupted, "skipped": run.skipped,
        "engines": [{
            "backend": e.name, "label": e.label, "model": e.model, "server_version": e.server_version,
            "stand_in": e.stand_in, "memory": asdict(e.memory) if e.memory else None,
            "levels": [as_json(s, level) for s, level in zip(e.summaries, e.levels)],
        } for e in run.engines],
    }
    paths["summary.json"].write_text(json.dumps(summary, indent=1, ensure_ascii=False), encoding="utf-8")
    write_chart(run, paths["chart.png"])
    return paths


def write_chart(run: BenchmarkRun, path: Path) -> None:
    """Output tokens/s and mean TTFT per engine at each concurrency level (a PNG, no browser needed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    levels = list(run.settings.concurrency)
    figure, (throughput, ttft) = plt.subplots(1, 2, figsize=(11, 4.2))
    width = 0.8 / max(len(run.engines), 1)
    for index, engine in enumerate(run.engines):
        label = display_label(engine.label, engine.stand_in)
        xs = [position + index * width for position in range(len(levels))]
        summaries = [engine.at(level) for level in levels]
        throughput.bar(xs, [s.output_throughput if s else 0 for s in summaries], width, label=label)
        ttft.bar(xs, [(s.ttft_ms.mean or 0) if s else 0 for s in summaries], width, label=label)
    for axis, title, unit in ((throughput, "Output tokens/s (all requests)", "tokens/s"),
                              (ttft, "Mean time to first token", "ms")):
        axis.set_xticks([position + width * (len(run.engines) - 1) / 2 for position in range(len(levels))])
        axis.set_xticklabels([f"{level} concurrent" for level in levels])
        axis.set_title(title)
        axis.set_ylabel(unit)
        axis.grid(axis="y", alpha=0.3)
    throughput.legend(fontsize=8)
    figure.suptitle(f"{run.hardware[:90]}", fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


