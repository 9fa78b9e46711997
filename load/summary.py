"""The classroom load test's summary, from what one run left in its results folder.

Reads `chat-records-*.jsonl` (one line per chat opened, per message and per
health probe, written by the locustfile) and `rss.csv` (the app's memory, from
rss_sampler.py). Prints a few lines for a
person, the last one always

    users=U messages=M replied=R errors=E p50_reply_s=X p99_reply_s=Y max_rss_mb=Z

Counts: every message sent is one record; `replied` have their whole reply,
`errors` failed (app error, empty reply, timeout, lost socket); the rest were
still in flight when the run ended (`unfinished`). Percentiles are exact
(nearest rank) over replied messages; a missing figure prints as `na`.

SLO: the share of messages sent whose reply met the objective as the student saw
it: first text on screen within `ttft_ms` of sending, the app's own ms per token
(the reply's final figures) within `tpot_ms`, the whole reply within `e2el_ms`;
a failed or unfinished message misses it. The objective is the app's capacity
sweeps' (`CAPACITY_SLO`, `CAPACITY_PERCENTILE` from the environment or `.env`;
default ttft_ms=500,tpot_ms=50 for 90%), or `--slo` / `--percentile`.

Run: `python -m load.summary RESULTS_DIR --users 30 [--slo ttft_ms=500,tpot_ms=50]`.
Standard library and the app's own stdlib-only modules.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable

from config import REPO
from core.load.slo import DEFAULT_PERCENTILE, DEFAULT_SLO, Slo, SloError, parse_slo, within
from core.timing import percentile_of

FAILED_OUTCOMES = ("error", "empty", "timeout", "disconnected")
WARM_UP_S = 30.0


@dataclass(frozen=True)
class HealthFigures:
    """The health probe's answers during the run (seconds)."""

    probes: int
    failures: int
    p50_s: float | None
    p99_s: float | None
    max_s: float | None


@dataclass(frozen=True)
class MemoryFigures:
    """The app's RSS (MB): first sample, at the end of warm-up, at the end, and the maximum."""

    first_mb: float
    after_warm_up_mb: float
    last_mb: float
    max_mb: float
    max_after_warm_up_mb: float
    warm_up_s: float


@dataclass
class Summary:
    users: int
    chats_opened: int = 0
    chat_failures: list[str] = field(default_factory=list)
    messages: int = 0
    replied: int = 0
    errors: int = 0
    unfinished: int = 0
    failures_by_kind: Counter = field(default_factory=Counter)
    reply_s: list[float] = field(default_factory=list)
    first_token_s: list[float] = field(default_factory=list)
    queued: int = 0
    queue_max_position: int = 0
    queued_never_moved: int = 0
    queued_unanswered: int = 0
    health_s: list[float] = field(default_factory=list)
    health_failures: int = 0
    memory: MemoryFigures | None = None
    # The app's own counts (GET /lab/state) before the run and after it (students gone).
    state_before: dict | None = None
    state_after: dict | None = None
    # Per message: (replied, first text s, the app's ms per token, whole reply s), for the SLO share.
    slo_figures: list[tuple[bool, float | None, float | None, float | None]] = field(default_factory=list)

    def slo_met(self, slo: Slo) -> int:
        """Messages whose reply met the objective as the student saw it (failed ones never do)."""
        return sum(1 for replied, first_s, per_token_ms, reply_s in self.slo_figures
                   if replied and within(slo, ttft_ms=None if first_s is None else first_s * 1000,
                                         tpot_ms=per_token_ms if per_token_ms is not None else None,
                                         e2el_ms=None if reply_s is None else reply_s * 1000))

    @property
    def health(self) -> HealthFigures | None:
        probes = len(self.health_s) + self.health_failures
        if not probes:
            return None
        return HealthFigures(probes, self.health_failures, percentile_of(self.health_s, 50),
                             percentile_of(self.health_s, 99), max(self.health_s, default=None))

    def last_line(self) -> str:
        return (f"users={self.users} messages={self.messages} replied={self.replied} errors={self.errors} "
                f"p50_reply_s={_figure(percentile_of(self.reply_s, 50))} "
                f"p99_reply_s={_figure(percentile_of(self.reply_s, 99))} "
                f"max_rss_mb={_figure(self.memory.max_mb if self.memory else None, 1)}")


def _figure(value: float | None, digits: int = 2) -> str:
    return "na" if value is None else f"{value:.{digits}f}"


def _s(seconds: float | None) -> str:
    return "na" if seconds is None else f"{seconds:.2f} s"


def _ms(seconds: float | None) -> str:
    return "na" if seconds is None else f"{seconds * 1000:.0f} ms"


def _failure_kind(record: dict) -> str:
    """"timeout", "empty", ... or "app error: <the error message's first line>"."""
    error = (record.get("error") or "").strip()
    if record["outcome"] == "error" and error:
        return "app error: " + error.splitlines()[0][:100]
    return record["outcome"]


def summarize_records(records: Iterable[dict], users: int) -> Summary:
    """Counts and latencies from the locustfile's JSON lines."""
    summary = Summary(users=users)
    for record in records:
        if record.get("kind") == "health":
            if record.get("ok"):
                summary.health_s.append(record["health_s"])
            else:
                summary.health_failures += 1
            continue
        if record.get("kind") == "open":
            if record.get("ok"):
                summary.chats_opened += 1
            else:
                summary.chat_failures.append(str(record.get("error")))
            continue
        if record.get("kind") != "message":  # e.g. "stopping": when the run ended
            continue
        summary.messages += 1
        outcome = record.get("outcome")
        per_token = record.get("ms_per_token")
        if per_token is None and record.get("output_tokens") == 1:
            per_token = 0.0  # vLLM's rule: a one-token reply has TPOT 0
        summary.slo_figures.append((outcome == "replied", record.get("first_token_s"), per_token,
                                    record.get("reply_s")))
        if outcome == "replied":
            summary.replied += 1
            summary.reply_s.append(record["reply_s"])
        elif outcome in FAILED_OUTCOMES:
            summary.errors += 1
            summary.failures_by_kind[_failure_kind(record)] += 1
        else:
            summary.unfinished += 1
        if record.get("first_token_s") is not None:
            summary.first_token_s.append(record["first_token_s"])
        positions = record.get("queue_positions") or []
        if positions:
            summary.queued += 1
            summary.queue_max_position = max(summary.queue_max_position, max(positions))
            if not any(later < earlier for earlier, later in zip(positions, positions[1:])) \
                    and outcome != "replied":
                summary.queued_never_moved += 1
            if outcome != "replied":
                summary.queued_unanswered += 1
    return summary


def memory_from_samples(samples: list[tuple[float, float]], warm_up_s: float = WARM_UP_S) -> MemoryFigures | None:
    """RSS figures from (elapsed_s, rss_mb) samples; warm-up is the first `warm_up_s` (at most half the run)."""
    if not samples:
        return None
    warm_up_s = min(warm_up_s, samples[-1][0] / 2)
    after = [rss for elapsed, rss in samples if elapsed >= warm_up_s] or [samples[-1][1]]
    return MemoryFigures(
        first_mb=samples[0][1], after_warm_up_mb=after[0], last_mb=samples[-1][1],
        max_mb=max(rss for _, rss in samples), max_after_warm_up_mb=max(after), warm_up_s=warm_up_s,
    )


def read_results(folder: Path, users: int) -> Summary:
    records = []
    for path in sorted(folder.glob("chat-records-*.jsonl")):
        records += [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    summary = summarize_records(records, users)
    rss = folder / "rss.csv"
    if rss.exists():
        with open(rss, newline="", encoding="utf-8") as rows:
            samples = [(float(row["elapsed_s"]), float(row["rss_mb"])) for row in csv.DictReader(rows)]
        summary.memory = memory_from_samples(samples)
    for name in ("before", "after"):
        path = folder / f"state-{name}.json"
        if path.exists():
            setattr(summary, f"state_{name}", json.loads(path.read_text(encoding="utf-8")))
    return summary


# What must come back to where it was once the students have gone. Not counted: the sessions
# Chainlit keeps for its session_timeout after a student leaves (and the task that frees each),
# engine.io's ping tasks (they end within a ping interval), and pooled threads, database
# connections and files (bounded by their pools); see ui/lab_state.py.
LEAK_COUNTS = (("threads", "threads_by_kind", "other"), ("tasks", "tasks_by_kind", "other"),
               ("replies still generating", "tasks_by_kind", "replies"),
               ("files", "open_files_by_kind", "other"), ("backend connections", "backend_connections", None),
               ("client connections", "client_connections", None))


def _leak_count(state: dict, key: str, kind: str | None) -> int:
    value = state.get(key) or 0
    return int(value.get(kind, 0) if kind else value)


def state_lines(before: dict | None, after: dict | None) -> list[str]:
    """Before -> after: what the app holds by kind; what stayed higher is flagged as a leak."""
    if not before or not after:
        return ["app state (GET /lab/state): not read"]
    leaks = [(label, _leak_count(before, key, kind), _leak_count(after, key, kind)) for label, key, kind in LEAK_COUNTS]
    grown = [label for label, was, now in leaks if now > was]
    verdict = "nothing left behind" if not grown else f"LEAK? higher after the run: {', '.join(grown)}"
    pools = ", ".join(f"{label} {before.get(key, {}).get(kind, 0)} -> {after.get(key, {}).get(kind, 0)}"
                      for label, key, kind in (("executor threads", "threads_by_kind", "executor"),
                                               ("database threads", "threads_by_kind", "database"),
                                               ("database files", "open_files_by_kind", "database")))
    kept = after.get("tasks_by_kind", {})
    return [
        "app state before -> after (GET /lab/state): "
        + ", ".join(f"{label} {was} -> {now}" for label, was, now in leaks) + f"; {verdict}",
        f"  pooled, bounded: {pools}",
        f"  sessions {before.get('sessions')} -> {after.get('sessions')} "
        f"({after.get('connected_sessions')} connected; the others are kept "
        f"{after.get('session_timeout_s')} s for a reconnect, {kept.get('kept_sessions', 0)} timers), "
        f"socket ping tasks still ending {kept.get('socket_pings', 0)}",
    ]


def slo_line(summary: Summary, slo: Slo) -> str:
    """'SLO (...): 26 of 30 messages met it (87%), goal 90%: missed'."""
    parts = [f"TTFT under {slo.ttft_ms:g} ms" if slo.ttft_ms is not None else "",
             f"at least {slo.min_tokens_per_s:.0f} tokens/s each" if slo.tpot_ms is not None else "",
             f"whole reply within {slo.e2el_ms / 1000:g} s" if slo.e2el_ms is not None else ""]
    words = " and ".join(part for part in parts if part)
    sent = summary.messages
    if not sent:
        return f"SLO ({words}, as the students saw it): no message sent"
    met = summary.slo_met(slo)
    share = met / sent
    verdict = "met" if share * 100 >= slo.percentile else "missed"
    return (f"SLO ({words}, as the students saw it): {met} of {sent} messages met it ({share:.0%}), "
            f"goal {slo.percentile:g}%: {verdict}")


def report_lines(summary: Summary, slo: Slo | None = None) -> list[str]:
    """The human summary; the last line is the machine-readable one."""
    s = summary
    lines = [f"chats opened: {s.chats_opened} (users: {s.users})"
             + (f", {len(s.chat_failures)} failed to open: {Counter(s.chat_failures).most_common(3)}"
                if s.chat_failures else "")]
    lines.append(f"messages: {s.messages} sent, {s.replied} replied, {s.errors} failed, "
                 f"{s.unfinished} still in flight at the end")
    for kind, count in s.failures_by_kind.most_common():
        lines.append(f"  failed: {count} x {kind}")
    lines.append(f"reply (sent -> whole reply): p50 {_s(percentile_of(s.reply_s, 50))}, "
                 f"p90 {_s(percentile_of(s.reply_s, 90))}, p99 {_s(percentile_of(s.reply_s, 99))}, "
                 f"max {_s(max(s.reply_s, default=None))}")
    lines.append(f"first text (sent -> first token on screen): p50 {_s(percentile_of(s.first_token_s, 50))}, "
                 f"p99 {_s(percentile_of(s.first_token_s, 99))}")
    if s.queued:
        lines.append(f"queue: {s.queued} messages waited with a visible place (highest place {s.queue_max_position}); "
                     f"{s.queued_unanswered} of them got no whole reply, {s.queued_never_moved} of those "
                     "never saw their place move")
    else:
        lines.append("queue: no message saw a queue place")
    health = s.health
    if health:
        lines.append(f"health (GET /health during the run, {health.probes} probes, {health.failures} failed): "
                     f"p50 {_ms(health.p50_s)}, p99 {_ms(health.p99_s)}, max {_ms(health.max_s)}")
    else:
        lines.append("health: no probe answered")
    if s.memory:
        m = s.memory
        lines.append(f"app memory (RSS of its process tree): start {m.first_mb:.0f} MB, after {m.warm_up_s:.0f} s "
                     f"warm-up {m.after_warm_up_mb:.0f} MB, end {m.last_mb:.0f} MB, max {m.max_mb:.0f} MB "
                     f"(growth after warm-up {m.max_after_warm_up_mb - m.after_warm_up_mb:+.0f} MB)")
    else:
        lines.append("app memory: no samples")
    lines += state_lines(s.state_before, s.state_after)
    lines.append(slo_line(s, slo or parse_slo(DEFAULT_SLO, DEFAULT_PERCENTILE)))
    lines.append(s.last_line())
    return lines


def configured(name: str, env_file: Path = REPO / ".env") -> str | None:
    """A variable from the environment, else from the repo's `.env` (as the app reads it), else None."""
    if os.environ.get(name):
        return os.environ[name]
    if env_file.is_file():
        for line in env_file.read_text(encoding="utf-8").splitlines():
            key, _, value = line.partition("=")
            if key.strip() == name and value.strip():
                return value.strip().strip("'\"")
    return None


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Summarise one classroom load run.")
    parser.add_argument("results", type=Path, help="the run's results folder")
    parser.add_argument("--users", type=int, required=True, help="simulated users asked for")
    parser.add_argument("--slo", default=None, help="e.g. ttft_ms=500,tpot_ms=50 (default: CAPACITY_SLO, else that)")
    parser.add_argument("--percentile", type=float, default=None,
                        help="share of messages that must meet it, in %% (default: CAPACITY_PERCENTILE, else 90)")
    args = parser.parse_args(argv)
    try:
        percentile = args.percentile if args.percentile is not None else float(
            configured("CAPACITY_PERCENTILE") or DEFAULT_PERCENTILE)
        slo = parse_slo(args.slo or configured("CAPACITY_SLO") or DEFAULT_SLO, percentile)
    except (SloError, ValueError) as error:
        parser.error(f"the objective: {error}")
    print("\n".join(report_lines(read_results(args.results, args.users), slo)))


if __name__ == "__main__":
    main()
