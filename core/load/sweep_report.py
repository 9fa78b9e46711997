"""A sweep's plain answer (English and Chinese) and its files: sweep.csv, requests.csv, summary.json,
capacity.md, and the charts (latency percentiles against load; tokens/s per person against total
tokens/s, the Pareto chart), as Plotly HTML and as PNG.

`python -m bench sweep` and the engine panel's teacher sweep both use it.
"""

from __future__ import annotations

import csv
import json
from dataclasses import asdict
from pathlib import Path
from typing import Sequence

from backends.base import display_label
from core.load.slo import Slo
from core.load.stats import REQUEST_COLUMNS, as_json, by_turn, request_row, turns_line
from core.load.sweep import Capacity, EngineSweep, LevelFigures, Mode, SweepRun, SweepSettings, capacity

LANGS = ("en", "zh")

TEXTS: dict[str, dict[str, str]] = {
    "en": {
        "holds_people": "up to {n} people at once keep {slo} for {p:g}% of replies",
        "holds_person": "only 1 person at a time keeps {slo} for {p:g}% of replies",
        "holds_rate": "up to {n} requests/s (about {people} people at once) keep {slo} for {p:g}% of replies",
        "holds_none": "even at {level}, fewer than {p:g}% of replies keep {slo}",
        "person": "1 person at once", "people": "{n} people at once", "rate": "{n} requests/s",
        "saturates": "it saturates near {n}",
        "saturates_rate": "it saturates near {n} requests/s",
        "not_saturated": "it did not saturate up to {n} (the most tried)",
        "not_saturated_rate": "it did not saturate up to {n} requests/s (the most tried)",
        "limit_kv_cache": "the limit is the KV cache (it fills up and requests are pushed out)",
        "limit_queue": "the limit is the queue (requests wait for a place in the batch)",
        "limit_one_at_a_time": "the limit is the queue: it answers one request at a time",
        "limit_compute": "the limit is {device} compute (every request runs, each more slowly)",
        "ttft": "TTFT under {v}", "tpot": "at least {v:.0f} tokens/s each", "e2el": "whole replies within {v:g} s",
        "and": " and ",
        "title": "# Capacity: how many people can each engine serve?",
        "answer": "## The answer",
        "conditions": "## Conditions",
        "levels": "## Every level",
        "stand_in": "{label} is a stand-in ({why}): its numbers are not that engine's.",
        "not_measured": "Not measured: {name}: {why}",
        "interrupted": "Interrupted: the sweep was stopped; these are the levels measured so far.",
        "stopped": "{label}: {why}",
    },
    "zh": {
        "holds_people": "最多 {n} 人同时使用时，{p:g}% 的回复能做到{slo}",
        "holds_person": "只有 1 人使用时，{p:g}% 的回复能做到{slo}",
        "holds_rate": "每秒最多 {n} 个请求（约 {people} 人同时使用）时，{p:g}% 的回复能做到{slo}",
        "holds_none": "即使只有{level}，也不到 {p:g}% 的回复能做到{slo}",
        "person": " 1 人同时使用", "people": " {n} 人同时使用", "rate": "每秒 {n} 个请求",
        "saturates": "约 {n} 人时饱和",
        "saturates_rate": "约每秒 {n} 个请求时饱和",
        "not_saturated": "直到 {n} 人（测试的最高负载）仍未饱和",
        "not_saturated_rate": "直到每秒 {n} 个请求（测试的最高负载）仍未饱和",
        "limit_kv_cache": "瓶颈是 KV 缓存（占满后请求被挤出）",
        "limit_queue": "瓶颈是排队（请求等待进入批次）",
        "limit_one_at_a_time": "瓶颈是排队：它一次只回答一个请求",
        "limit_compute": "瓶颈是 {device} 算力（所有请求都在运行，但每个都变慢）",
        "ttft": "首字时间低于 {v}", "tpot": "每人每秒至少 {v:.0f} 个 token", "e2el": "整条回复在 {v:g} 秒内完成",
        "and": "、",
        "title": "# 容量：每个引擎能同时服务多少人？",
        "answer": "## 结论",
        "conditions": "## 测试条件",
        "levels": "## 各负载级别",
        "stand_in": "{label} 是替身（{why}）：其数字不代表该引擎。",
        "not_measured": "未测：{name}：{why}",
        "interrupted": "已中断：扫描被停止，以下是已测得的级别。",
        "stopped": "{label}：{why}",
    },
}


def _t(lang: str, key: str, **values) -> str:
    return TEXTS.get(lang, TEXTS["en"])[key].format(**values)


def slo_phrase(slo: Slo, lang: str = "en") -> str:
    """'TTFT under 500 ms and at least 20 tokens/s each' in the person's language."""
    parts = []
    if slo.ttft_ms is not None:
        parts.append(_t(lang, "ttft", v=_duration(slo.ttft_ms)))
    if slo.tpot_ms is not None:
        parts.append(_t(lang, "tpot", v=slo.min_tokens_per_s))
    if slo.e2el_ms is not None:
        parts.append(_t(lang, "e2el", v=slo.e2el_ms / 1000))
    return _t(lang, "and").join(parts)


def _n(value: float) -> str:
    return f"{value:g}"


def _duration(ms: float) -> str:
    """500 -> '500 ms', 3000 -> '3 s', 2500 -> '2.5 s'."""
    return f"{ms / 1000:g} s" if ms >= 1000 else f"{ms:g} ms"


def plain_answer(label: str, mode: Mode, answer: Capacity, slo: Slo, hardware: str, lang: str = "en") -> str:
    """'vLLM: up to 8 people at once keep TTFT under 500 ms and at least 20 tokens/s each for 90% of replies;
    it saturates near 16; the limit is CPU compute.'"""
    slo_text = slo_phrase(slo, lang)
    if answer.holds_up_to is None:
        if mode == "rate":
            level = _t(lang, "rate", n=_n(answer.first_miss))
        else:
            level = _t(lang, "person") if answer.first_miss == 1 else _t(lang, "people", n=_n(answer.first_miss))
        holds = _t(lang, "holds_none", level=level, slo=slo_text, p=slo.percentile)
    elif mode == "concurrency":
        key = "holds_person" if answer.holds_up_to == 1 else "holds_people"
        holds = _t(lang, key, n=_n(answer.holds_up_to), slo=slo_text, p=slo.percentile)
    else:
        people = "–" if answer.people_at_rate is None else f"{answer.people_at_rate:.1f}"
        holds = _t(lang, "holds_rate", n=_n(answer.holds_up_to), people=people, slo=slo_text, p=slo.percentile)
    suffix = "" if mode == "concurrency" else "_rate"
    if answer.saturates_near is not None:
        saturation = _t(lang, "saturates" + suffix, n=_n(answer.saturates_near))
    else:
        saturation = _t(lang, "not_saturated" + suffix, n=_n(answer.highest_tried))
    parts = [holds, saturation]
    if answer.limit is not None:
        device = "CPU" if "no GPU" in hardware else "GPU"
        parts.append(_t(lang, f"limit_{answer.limit}", device=device))
    separator = "；" if lang == "zh" else "; "
    colon = "：" if lang == "zh" else ": "
    end = "。" if lang == "zh" else "."
    return f"{label}{colon}{separator.join(parts)}{end}"


def answers(run: SweepRun, lang: str = "en") -> list[str]:
    """One plain-answer line per measured engine, in the order swept."""
    lines = []
    for engine in run.engines:
        answer = capacity(run.settings.mode, engine)
        if answer is not None:
            lines.append(plain_answer(display_label(engine.label, engine.stand_in), run.settings.mode, answer,
                                      run.settings.slo, run.hardware, lang))
    return lines


def conditions(run: SweepRun, lang: str = "en") -> list[str]:
    settings = run.settings
    if settings.mode == "concurrency":
        load = f"concurrency {', '.join(_n(level) for level in settings.levels)} (people at once, closed loop)"
    else:
        load = (f"request rates {', '.join(_n(level) for level in settings.levels)} per s, gamma arrivals with "
                f"burstiness {settings.burstiness:g} (1 = Poisson), seed {settings.seed}"
                + (f", at most {settings.max_concurrency} in flight" if settings.max_concurrency else ""))
    lines = [
        f"- Hardware: {run.hardware}.",
        "- Models: " + "; ".join(f"{e.label}: `{e.model}`" + (f" ({e.server_version})" if e.server_version else "")
                                 for e in run.engines) + ".",
        f"- Load: {load}; {settings.requests} requests per level (at least one per person), no request sent "
        f"after {settings.max_seconds:g} s of a level; {settings.warmup} warm-up request(s) per engine.",
        (f"- Conversations: set `{settings.prompt_set}`, each person one whole conversation at a time, reading each "
         f"reply {settings.think_time_s:g} s before the next turn; at most {settings.max_new_tokens} new tokens, greedy."
         if settings.conversations else
         f"- Prompts: set `{settings.prompt_set}`, at most {settings.max_new_tokens} new tokens, greedy."),
        f"- SLO: {slo_phrase(settings.slo)} ({', '.join(settings.slo.as_vllm_goodput())} in `vllm bench serve "
        f"--goodput` terms), for {settings.slo.percentile:g}% of replies; a failed reply misses it.",
        f"- Measured {run.started_at:%Y-%m-%d %H:%M} UTC by `python -m bench sweep` with the app's own load "
        "engine and timing module.",
    ]
    for engine in run.engines:
        if engine.stand_in:
            lines.append("- " + _t(lang, "stand_in", label=engine.label, why=engine.stand_in))
        if engine.stopped:
            lines.append("- " + _t("en", "stopped", label=engine.label, why=engine.stopped))
        for figures in engine.levels:
            if figures.not_sent:
                lines.append(f"- {engine.label} at {settings.level_label(figures.level)}: {figures.not_sent} of "
                             f"{figures.sent + figures.not_sent} requests not sent (the level's "
                             f"{settings.max_seconds:g} s were up); its figures are over the {figures.sent} sent.")
    for name, why in run.skipped.items():
        lines.append("- " + _t(lang, "not_measured", name=name, why=why))
    if run.interrupted:
        lines.append("- " + _t(lang, "interrupted"))
    return lines


SWEEP_COLUMNS = (
    "backend", "label", "stand_in", "mode", "level", "max_concurrency", "request_rate", "burstiness",
    "completed", "failed", "not_sent", "duration", "offered_rate", "achieved_rate",
    "request_throughput", "output_throughput", "median_output_tokens_per_s_per_user",
    "p10_output_tokens_per_s_per_user", "good_requests", "slo_share", "request_goodput", "output_goodput",
    "mean_ttft_ms", "median_ttft_ms", "p90_ttft_ms", "p99_ttft_ms", "mean_tpot_ms", "median_tpot_ms",
    "p90_tpot_ms", "p99_tpot_ms", "mean_itl_ms", "p90_itl_ms", "p99_itl_ms", "mean_e2el_ms", "median_e2el_ms",
    "p90_e2el_ms", "p99_e2el_ms", "max_running", "max_waiting", "max_kv_cache_usage", "preemptions",
    "mean_client_waiting", "ttft_rising", "queue_rising", "saturation",
)


def level_row(engine: EngineSweep, settings: SweepSettings, figures: LevelFigures) -> dict:
    """One engine at one level, under vLLM's names where the figure is the same."""
    vllm = figures.summary.vllm_fields()

    def rounded(value, digits=3):
        return None if value is None else round(value, digits)

    return {
        "backend": engine.name, "label": engine.label, "stand_in": bool(engine.stand_in), "mode": settings.mode,
        "level": figures.level,
        "max_concurrency": int(figures.level) if settings.mode == "concurrency" else settings.max_concurrency,
        "request_rate": figures.level if settings.mode == "rate" else None,
        "burstiness": settings.burstiness if settings.mode == "rate" else None,
        "completed": figures.summary.completed, "failed": figures.summary.failed, "not_sent": figures.not_sent,
        "duration": rounded(figures.summary.duration), "offered_rate": rounded(figures.offered_rate),
        "achieved_rate": rounded(figures.achieved_rate),
        "request_throughput": rounded(figures.summary.request_throughput),
        "output_throughput": rounded(figures.summary.output_throughput),
        "median_output_tokens_per_s_per_user": rounded(figures.median_tokens_per_s_per_user),
        "p10_output_tokens_per_s_per_user": rounded(figures.p10_tokens_per_s_per_user),
        "good_requests": figures.good_requests, "slo_share": rounded(figures.slo_share, 4),
        "request_goodput": rounded(figures.request_goodput), "output_goodput": rounded(figures.output_goodput),
        **{name: rounded(vllm[name]) for name in SWEEP_COLUMNS if name.endswith("_ms")},
        "max_running": figures.max_running, "max_waiting": figures.max_waiting,
        "max_kv_cache_usage": rounded(figures.max_kv_cache_usage, 4), "preemptions": figures.preemptions,
        "mean_client_waiting": rounded(figures.mean_client_waiting, 2),
        "ttft_rising": figures.ttft_rising, "queue_rising": figures.queue_rising,
        "saturation": figures.saturation or "",
    }


def _cell(value, digits: int = 1) -> str:
    if value is None:
        return "–"
    if isinstance(value, float):
        return f"{value:,.{digits}f}"
    return str(value)


def levels_table(run: SweepRun) -> str:
    mode = run.settings.mode
    head = ("| engine | " + ("people" if mode == "concurrency" else "req/s (achieved)") +
            " | SLO met | goodput req/s | tokens/s total | tokens/s per person (median) | TTFT p50 / p90 ms"
            " | TPOT p50 / p90 ms | waiting (max) | KV cache (max) | saturated |")
    lines = [head, "|---" * 11 + "|"]
    for engine in run.engines:
        for f in engine.levels:
            s = f.summary
            level = _n(f.level) if mode == "concurrency" else f"{_n(f.level)} ({_cell(f.achieved_rate, 2)})"
            waiting = f.max_waiting if engine.reports_queue else (
                None if f.mean_client_waiting is None else f"{f.mean_client_waiting:.1f} (client, mean)")
            lines.append(
                f"| {display_label(engine.label, engine.stand_in)} | {level} | "
                f"{'–' if f.slo_share is None else f'{f.slo_share:.0%}'} | {_cell(f.request_goodput, 2)} | "
                f"{_cell(s.output_throughput)} | {_cell(f.median_tokens_per_s_per_user)} | "
                f"{_cell(s.ttft_ms.median, 0)} / {_cell(s.ttft_ms.p90, 0)} | "
                f"{_cell(s.tpot_ms.median)} / {_cell(s.tpot_ms.p90)} | {_cell(waiting)} | "
                f"{'–' if f.max_kv_cache_usage is None else f'{f.max_kv_cache_usage:.0%}'} | "
                f"{(f.saturation or '').replace('|', '/')} |")
    return "\n".join(lines)


def capacity_markdown(run: SweepRun) -> str:
    """capacity.md: the plain answer in English and Chinese, the conditions, every level."""
    parts = [_t("en", "title"), "", _t("en", "answer"), ""]
    parts += [f"- {line}" for line in answers(run, "en")] or ["- –"]
    parts += ["", _t("zh", "answer") + "（中文）", ""]
    parts += [f"- {line}" for line in answers(run, "zh")] or ["- –"]
    if run.settings.conversations:
        parts += ["", "## TTFT by turn", "",
                  *[f"- {display_label(e.label, e.stand_in)} at {run.settings.level_label(f.level)}: "
                    f"{turns_line(by_turn(level.outcomes))}" for e in run.engines for f, level in zip(e.levels, e.raw)]]
    parts += ["", _t("en", "conditions"), "", *conditions(run), "", _t("en", "levels"), "", levels_table(run), "",
              "Charts: `latency.html` / `latency.png` (percentiles against load), `pareto.html` / `pareto.png` "
              "(tokens/s per person against total tokens/s). Per request: `requests.csv`; per level: `sweep.csv`, "
              "`summary.json` (vLLM's field names where they exist)."]
    return "\n".join(parts) + "\n"


def summary_json(run: SweepRun) -> dict:
    settings = run.settings
    return {
        "started_at": run.started_at.isoformat(), "hardware": run.hardware, "interrupted": run.interrupted,
        "settings": {**asdict(settings), "slo": settings.slo.as_dict(), "goodput": settings.slo.as_vllm_goodput()},
        "skipped": run.skipped,
        "answers": {lang: answers(run, lang) for lang in LANGS},
        "engines": [{
            "backend": e.name, "label": e.label, "model": e.model, "server_version": e.server_version,
            "stand_in": e.stand_in, "stopped": e.stopped,
            "capacity": asdict(answer) if (answer := capacity(settings.mode, e)) else None,
            "levels": [as_json(f.summary, level) | level_row(e, settings, f) for f, level in zip(e.levels, e.raw)],
        } for e in run.engines],
    }


def write_sweep(run: SweepRun, directory: Path) -> dict[str, Path]:
    """Every file of a sweep in `directory` (created); returns them by name."""
    directory.mkdir(parents=True, exist_ok=True)
    names = ("capacity.md", "sweep.csv", "requests.csv", "summary.json", "latency.html", "pareto.html",
             "latency.png", "pareto.png")
    paths = {name: directory / name for name in names}
    paths["capacity.md"].write_text(capacity_markdown(run), encoding="utf-8")
    with open(paths["sweep.csv"], "w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=SWEEP_COLUMNS)
        writer.writeheader()
        for engine in run.engines:
            writer.writerows(level_row(engine, run.settings, f) for f in engine.levels)
    with open(paths["requests.csv"], "w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=("level",) + REQUEST_COLUMNS)
        writer.writeheader()
        for engine in run.engines:
            for figures, level in zip(engine.levels, engine.raw):
                writer.writerows({"level": figures.level} | request_row(level, o, stand_in=bool(engine.stand_in))
                                 for o in level.outcomes)
    paths["summary.json"].write_text(json.dumps(summary_json(run), indent=1, ensure_ascii=False), encoding="utf-8")
    latency, pareto = charts(run)
    latency.write_html(paths["latency.html"], include_plotlyjs="directory")
    pareto.write_html(paths["pareto.html"], include_plotlyjs="directory")
    write_pngs(run, paths["latency.png"], paths["pareto.png"])
    return paths


def chart_series(run: SweepRun) -> list[dict]:
    """Per engine, the points both charts draw (also what the engine panel's live chart receives)."""
    return [{
        "label": display_label(e.label, e.stand_in),
        "levels": [f.level for f in e.levels],
        "ttft_p50": [f.summary.ttft_ms.median for f in e.levels],
        "ttft_p90": [f.summary.ttft_ms.p90 for f in e.levels],
        "ttft_p99": [f.summary.ttft_ms.p99 for f in e.levels],
        "tpot_p50": [f.summary.tpot_ms.median for f in e.levels],
        "tpot_p90": [f.summary.tpot_ms.p90 for f in e.levels],
        "total_tokens_per_s": [f.summary.output_throughput for f in e.levels],
        "tokens_per_s_per_user": [f.median_tokens_per_s_per_user for f in e.levels],
    } for e in run.engines]


def _axis_title(mode: Mode) -> str:
    return "people at once (concurrency)" if mode == "concurrency" else "requests per second offered"


def charts(run: SweepRun):
    """(latency, pareto) Plotly figures: percentiles against load; per-person against total tokens/s."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    series = chart_series(run)
    latency = make_subplots(rows=1, cols=2, subplot_titles=("Time to first token (ms)", "Time per output token (ms)"))
    for index, s in enumerate(series):
        for name, column, dash in (("p50", 1, "solid"), ("p90", 1, "dash"), ("p99", 1, "dot")):
            latency.add_trace(go.Scatter(x=s["levels"], y=s[f"ttft_{name}"], name=f"{s['label']} TTFT {name}",
                                         mode="lines+markers", line={"dash": dash}, legendgroup=s["label"],
                                         marker={"color": _colour(index)}, line_color=_colour(index)), 1, column)
        for name, dash in (("p50", "solid"), ("p90", "dash")):
            latency.add_trace(go.Scatter(x=s["levels"], y=s[f"tpot_{name}"], name=f"{s['label']} TPOT {name}",
                                         mode="lines+markers", line={"dash": dash}, legendgroup=s["label"],
                                         line_color=_colour(index)), 1, 2)
    slo = run.settings.slo
    if slo.ttft_ms:
        latency.add_hline(y=slo.ttft_ms, line_dash="dot", annotation_text="SLO", row=1, col=1)
    if slo.tpot_ms:
        latency.add_hline(y=slo.tpot_ms, line_dash="dot", annotation_text="SLO", row=1, col=2)
    latency.update_xaxes(title_text=_axis_title(run.settings.mode))
    latency.update_layout(title=f"Latency against load — {run.hardware[:80]}", template="plotly_white")
    pareto = go.Figure()
    for index, s in enumerate(series):
        pareto.add_trace(go.Scatter(x=s["total_tokens_per_s"], y=s["tokens_per_s_per_user"], name=s["label"],
                                    mode="lines+markers+text", text=[_n(level) for level in s["levels"]],
                                    textposition="top center", line_color=_colour(index)))
    if slo.min_tokens_per_s:
        pareto.add_hline(y=slo.min_tokens_per_s, line_dash="dot", annotation_text="SLO per person")
    pareto.update_layout(title="Tokens/s per person against total tokens/s (labels: load level)",
                         xaxis_title="output tokens/s, all requests", yaxis_title="output tokens/s per person (median)",
                         template="plotly_white")
    return latency, pareto


_COLOURS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b")


def _colour(index: int) -> str:
    return _COLOURS[index % len(_COLOURS)]


def write_pngs(run: SweepRun, latency_path: Path, pareto_path: Path) -> None:
    """The same two charts as PNG (matplotlib; no browser or kaleido needed), for a README or a slide."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    series = chart_series(run)
    figure, (ttft, tpot) = plt.subplots(1, 2, figsize=(11, 4.2))
    for index, s in enumerate(series):
        colour = _colour(index)
        for name, style in (("p50", "-"), ("p90", "--"), ("p99", ":")):
            ttft.plot(s["levels"], _nan(s[f"ttft_{name}"]), style, marker="o", color=colour,
                      label=f"{s['label']} {name}")
        for name, style in (("p50", "-"), ("p90", "--")):
            tpot.plot(s["levels"], _nan(s[f"tpot_{name}"]), style, marker="o", color=colour,
                      label=f"{s['label']} {name}")
    slo = run.settings.slo
    for axis, bound, title in ((ttft, slo.ttft_ms, "Time to first token (ms)"),
                               (tpot, slo.tpot_ms, "Time per output token (ms)")):
        if bound:
            axis.axhline(bound, color="grey", linestyle=":", linewidth=1)
        axis.set_title(title)
        axis.set_xlabel(_axis_title(run.settings.mode))
        axis.grid(alpha=0.3)
    ttft.legend(fontsize=7)
    figure.suptitle(run.hardware[:100], fontsize=8)
    figure.tight_layout()
    figure.savefig(latency_path, dpi=110)
    plt.close(figure)
    figure, axis = plt.subplots(figsize=(6.5, 4.5))
    for index, s in enumerate(series):
        axis.plot(s["total_tokens_per_s"], _nan(s["tokens_per_s_per_user"]), "-o", color=_colour(index),
                  label=s["label"])
        for x, y, level in zip(s["total_tokens_per_s"], s["tokens_per_s_per_user"], s["levels"]):
            if y is not None:
                axis.annotate(_n(level), (x, y), textcoords="offset points", xytext=(4, 4), fontsize=7)
    if slo.min_tokens_per_s:
        axis.axhline(slo.min_tokens_per_s, color="grey", linestyle=":", linewidth=1)
    axis.set_xlabel("output tokens/s, all requests")
    axis.set_ylabel("output tokens/s per person (median)")
    axis.set_title("Per person against total (labels: load level)")
    axis.grid(alpha=0.3)
    axis.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(pareto_path, dpi=110)
    plt.close(figure)


def _nan(values: Sequence[float | None]) -> list[float]:
    return [float("nan") if v is None else v for v in values]
