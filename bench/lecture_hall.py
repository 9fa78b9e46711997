"""The lecture hall under load: 200 students on two app replicas behind nginx, one PostgreSQL.

    python -m bench.lecture_hall [--users 200] [--minutes 2] [--replicas 2] [--workers 2] [--results DIR]
                                 [--phases spread,burst] [--burst-every-s 20]

Two phases on the same deployment, one after the other: "spread", students thinking 5-15 s between
messages (a class working on its own), and "burst", every student sending at the same second
(LOAD_BURST_EVERY_S: each multiple of --burst-every-s of the clock, as when a teacher says "now").
Each phase is reported and judged on its own.

Everything runs on 127.0.0.1 and is stopped by PID at the end: a throwaway PostgreSQL
(servers/postgres.py), the paced OpenAI-protocol stand-in (servers/paced_openai.py: PACED_RATE
tokens/s, PACED_TOKENS per reply, first token at once), N replicas of the app
(`chainlit run app.py`, LAB_REPLICA_ID app-1..N, all on the one database), nginx with
deploy/nginx/serving-lab.conf (servers/proxy.py), and Locust in its own distributed mode - a
master and `--workers` workers (`.venv-load`, load/locustfile.py unchanged) - through the proxy.

It reports per replica and in total: students and messages, replies, errors, the app's added
delay to the first token (the stand-in sends its first token at once, so the time from sending a
message to its first text on screen is what the proxy and the app add; p50/p99), the RSS of each
replica (after warm-up and at most), and the rows written (`replies`) against the replies the
students saw. Then a verdict (bench/verdict.py): exit status 1 when a goal is missed.
Bounds: at most 250 users and 5 minutes of load.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import threading
import time
import urllib.request
from collections import defaultdict
from pathlib import Path

import psutil

from bench.verdict import Goal, at_least, at_most, exit_status
from config import REPO
from core.timing import percentile_of
from servers.app import AppServer, backend_env, start_app
from servers.paced_openai import start_paced_server
from servers.postgres import PostgresCluster
from servers.process import ServerProcess, free_port
from servers.proxy import Proxy

MAX_USERS, MAX_MINUTES = 250, 5.0
LOAD_VENV = REPO / ".venv-load"
# Goals: nothing lost, every student answered, both replicas used, the first text soon.
MAX_FAILED_SHARE = 0.01
MIN_REPLICA_SHARE = 0.25
ADDED_TTFT_P50_MS, ADDED_TTFT_P99_MS = 250.0, 1500.0
DRAIN_S = 120.0


def _rss_sampler(replicas: dict[str, AppServer], samples: dict[str, list[tuple[float, float]]],
                 stop: threading.Event, started: float) -> None:
    processes = {name: psutil.Process(app.process.process.pid) for name, app in replicas.items()}
    while not stop.wait(1.0):
        for name, process in processes.items():
            try:
                samples[name].append((time.monotonic() - started, process.memory_info().rss / 2**20))
            except psutil.Error:
                pass


def _still_to_write(app: AppServer) -> int:
    """Replies still being generated on `app` plus rows waiting in its outbox; 1 when it does not
    answer in time (a replica busy with a burst's last replies is not a replica with nothing left)."""
    try:
        with urllib.request.urlopen(app.url + "/lab/state", timeout=5) as response:
            state = json.load(response)
        return int(state["tasks_by_kind"].get("replies", 0)) + int(state["outbox"]["waiting"])
    except (OSError, ValueError, KeyError):
        return 1


def _records(results: Path) -> list[dict]:
    lines = []
    for path in sorted(results.glob("chat-records-*.jsonl")):
        lines.extend(json.loads(line) for line in path.read_text().splitlines() if line.strip())
    return lines


def _ms(value: float | None) -> str:
    return "–" if value is None else f"{value * 1000:.0f}"


def report(records: list[dict], rss: dict[str, list[tuple[float, float]]],
           warm_up_s: float, phase: str = "") -> tuple[list[str], list[Goal]]:
    """The per-replica and total table, and the goals, from the students' records (`phase`: named in
    each goal, when a run has several). The rows in the database are counted once, after every phase."""
    opens = [r for r in records if r["kind"] == "open"]
    messages = [r for r in records if r["kind"] == "message"]
    names = sorted({r.get("replica") or "?" for r in opens + messages} | set(rss))
    lines = ["| replica | chats opened | messages | replied | failed | first text p50 / p99 ms | RSS after warm-up -> max MB |",
             "|---|---|---|---|---|---|---|"]

    def row(name: str, chosen_opens: list[dict], chosen: list[dict], memory: list[tuple[float, float]]) -> str:
        replied = [m for m in chosen if m["outcome"] == "replied"]
        failed = [m for m in chosen if m["outcome"] not in ("replied", "unfinished")]
        first = [m["first_token_s"] for m in replied]
        warm = next((mb for at, mb in memory if at >= warm_up_s), None)
        peak = max((mb for _, mb in memory), default=None)
        shown_memory = "–" if peak is None else f"{warm or peak:.0f} -> {peak:.0f}"
        return (f"| {name} | {sum(1 for o in chosen_opens if o['ok'])} | {len(chosen)} | {len(replied)} | {len(failed)} | "
                f"{_ms(percentile_of(first, 50))} / {_ms(percentile_of(first, 99))} | {shown_memory} |")

    for name in names:
        lines.append(row(name, [o for o in opens if (o.get("replica") or "?") == name],
                         [m for m in messages if (m.get("replica") or "?") == name], rss.get(name, [])))
    lines.append(row("**all**", opens, messages, []))
    replied = [m for m in messages if m["outcome"] == "replied"]
    finished = [m for m in messages if m["outcome"] != "unfinished"]
    failed = [m for m in finished if m["outcome"] != "replied"]
    first = [m["first_token_s"] for m in replied]
    lines.append(f"replies the students saw: {len(replied)}; "
                 f"messages still unfinished when the run ended: {len(messages) - len(finished)}")
    students = defaultdict(int)
    for o in opens:
        if o["ok"]:
            students[o.get("replica") or "?"] += 1
    total_students = sum(students.values())
    smallest_share = min((students.get(name, 0) / total_students for name in rss), default=None) if total_students else None
    named = f"{phase}: " if phase else ""
    goals = [
        at_most(f"{named}failed messages (errors, empty, timeouts, lost sockets), share",
                len(failed) / len(finished) if finished else None, MAX_FAILED_SHARE, digits=3),
        at_least(f"{named}smallest replica's share of the students", smallest_share, MIN_REPLICA_SHARE, digits=2),
        at_most(f"{named}app's added delay to the first text, p50",
                (percentile_of(first, 50) or 0) * 1000 if first else None, ADDED_TTFT_P50_MS, unit="ms", digits=0),
        at_most(f"{named}app's added delay to the first text, p99",
                (percentile_of(first, 99) or 0) * 1000 if first else None, ADDED_TTFT_P99_MS, unit="ms", digits=0),
    ]
    if rows_written >= 0:
        goals.insert(1, at_least("replies shown that have their row in the database (rows written - replies shown)",
                                 rows_written - len(replied) if replied else None, 0, digits=0))
    bursts = sorted({m["burst_at"] for m in messages if m.get("burst_at") is not None})
    if bursts:
        lines.append(f"bursts: {len(bursts)}, students sending at each: "
                     f"{', '.join(str(sum(1 for m in messages if m.get('burst_at') == at)) for at in bursts)}")
    return lines, goals


async def _count_replies(url: str) -> int:
    from store import Store

    async with await Store.open(url, flush_outbox=False) as store:
        return (await store.row_counts()).get("replies", 0)


def _run_locust(args: argparse.Namespace, proxy: Proxy, results: Path, run_s: int, burst_every_s: float,
                started: list, clock_started: float) -> None:
    """One Locust run (a master and its workers) through the proxy, its records into `results`."""
    load_env = {**os.environ, "LOAD_RESULTS_DIR": str(results), "LOAD_BURST_EVERY_S": str(burst_every_s)}
    master_port = free_port()
    locust = str(LOAD_VENV / "bin" / "locust")
    master = ServerProcess(f"hall-locust-master-{results.name}", [
        locust, "-f", "load/locustfile.py", "--master", "--master-bind-host", "127.0.0.1",
        "--master-bind-port", str(master_port), "--headless", "--only-summary", "--loglevel", "WARNING",
        "-u", str(args.users), "-r", str(args.spawn_rate), "-t", f"{run_s}s", "--stop-timeout", "30",
        "--expect-workers", str(args.workers), "--exit-code-on-error", "0",
        "--host", proxy.url, "--csv", str(results / "locust")], env=load_env).start()
    started.append(master.stop)
    for index in range(args.workers):
        worker = ServerProcess(f"hall-locust-worker-{results.name}-{index + 1}", [
            locust, "-f", "load/locustfile.py", "--worker", "--master-host", "127.0.0.1",
            "--master-port", str(master_port), "--loglevel", "WARNING"], env=load_env).start()
        started.append(worker.stop)
    deadline = time.monotonic() + run_s + 180
    while master.process.poll() is None and time.monotonic() < deadline:
        time.sleep(5)
        messages = [r for r in _records(results) if r["kind"] == "message"]
        print(f"    [{time.monotonic() - clock_started:5.0f} s] messages {len(messages)}, replied "
              f"{sum(1 for m in messages if m['outcome'] == 'replied')}", flush=True)
    if master.process.poll() is None:
        print("Locust's master did not end in time; stopping it", file=sys.stderr)
    master.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.lecture_hall", description=__doc__.splitlines()[0])
    parser.add_argument("--users", type=int, default=200)
    parser.add_argument("--minutes", type=float, default=2.0)
    parser.add_argument("--replicas", type=int, default=2)
    parser.add_argument("--workers", type=int, default=2, help="Locust workers (processes)")
    parser.add_argument("--spawn-rate", type=float, default=10.0, help="students joining per second")
    parser.add_argument("--results", type=Path, default=None)
    parser.add_argument("--phases", type=lambda text: [p for p in text.split(",") if p], default=["spread", "burst"],
                        help="spread (think times), burst (all at once), or both in turn (default)")
    parser.add_argument("--burst-every-s", type=float, default=20.0,
                        help="burst phase: every student sends at each multiple of this many seconds (20)")
    args = parser.parse_args(argv)
    if not args.phases or any(phase not in ("spread", "burst") for phase in args.phases):
        parser.error("--phases: spread, burst or spread,burst")
    if args.burst_every_s < 5:
        parser.error("--burst-every-s: at least 5 (a reply must end before the next burst)")
    if not 1 <= args.users <= MAX_USERS or not 0.2 <= args.minutes <= MAX_MINUTES or not 1 <= args.replicas <= 4 \
            or not 1 <= args.workers <= 4:
        parser.error(f"--users 1..{MAX_USERS}, --minutes 0.2..{MAX_MINUTES}, --replicas 1..4, --workers 1..4")
    if not (LOAD_VENV / "bin" / "locust").exists():
        parser.error("no Locust in .venv-load: run `bash scripts/load_venv.sh` first")
    results = args.results or Path(tempfile.mkdtemp(prefix="lecture-hall-bench-"))
    results.mkdir(parents=True, exist_ok=True)
    run_s = round(args.minutes * 60)
    rate, tokens = os.environ.get("PACED_RATE", "50"), os.environ.get("PACED_TOKENS", "60")
    print(f"Lecture hall: {args.users} students on {args.replicas} replicas behind nginx, {run_s} s, "
          f"Locust master + {args.workers} workers; results in {results}", flush=True)
    started: list = []  # stopped in reverse order
    rss: dict[str, list[tuple[float, float]]] = defaultdict(list)
    stop_sampling = threading.Event()
    try:
        cluster = PostgresCluster(max_connections=300)
        started.append(cluster.remove)
        database = cluster.start().url
        paced = start_paced_server(float(rate), int(tokens), name="hall-paced")
        started.append(paced.process.stop)
        env = {"DATABASE_URL": database, **backend_env("paced", kind="openai", base_url=paced.base_url,
                                                       label="Paced test server"),
               "BACKENDS": "paced", "DEFAULT_BACKEND": "paced"}
        replicas: dict[str, AppServer] = {}
        for index in range(1, args.replicas + 1):
            name = f"app-{index}"
            replicas[name] = start_app({**env, "LAB_REPLICA_ID": name}, name=f"hall-{name}")
            started.append(replicas[name].stop)
        proxy = Proxy([app.url.removeprefix("http://") for app in replicas.values()], name="hall-nginx").start()
        started.append(proxy.stop)
        sampler_started = time.monotonic()
        sampler = threading.Thread(target=_rss_sampler, args=(replicas, rss, stop_sampling, sampler_started), daemon=True)
        sampler.start()
        for phase in args.phases:
            phase_dir = results / phase
            phase_dir.mkdir(parents=True, exist_ok=True)
            burst_every_s = args.burst_every_s if phase == "burst" else 0.0
            print(f"--- phase {phase}: " + (f"every student sends at each {burst_every_s:g} s of the clock"
                                             if burst_every_s else "students think 5-15 s between messages"), flush=True)
            _run_locust(args, proxy, phase_dir, run_s, burst_every_s, started, sampler_started)
            # Replies still being generated for students who left, and rows waiting in a replica's outbox
            # (written when the database takes them): let them be written before the next phase or the count.
            drain_until = time.monotonic() + DRAIN_S
            while (waiting := sum(_still_to_write(app) for app in replicas.values())) and time.monotonic() < drain_until:
                time.sleep(1)
            print(f"after {DRAIN_S - max(0.0, drain_until - time.monotonic()):.0f} s of drain: {waiting} replies or "
                  f"rows still to be written; rows in the replies table now: {asyncio.run(_count_replies(database))}",
                  flush=True)
        # Counted once it stops growing: a row is written after its reply's last text is on screen.
        rows_written, settled_until = -1, time.monotonic() + DRAIN_S
        while time.monotonic() < settled_until:
            counted = asyncio.run(_count_replies(database))
            if counted == rows_written:
                break
            rows_written = counted
            time.sleep(2)
    finally:
        stop_sampling.set()
        for stop in reversed(started):
            stop()
    goals: list[Goal] = []
    replied_in_all = 0
    for phase in args.phases:
        records = _records(results / phase)
        replied_in_all += sum(1 for r in records if r["kind"] == "message" and r["outcome"] == "replied")
        lines, phase_goals = report(records, rss, warm_up_s=30.0, phase=phase)
        (results / phase / "report.md").write_text("\n".join(lines) + "\n")
        print(f"\n### {phase}\n" + "\n".join(lines))
        goals += phase_goals
    goals.insert(0, at_least("replies shown that have their row in the database (rows written - replies shown)",
                             rows_written - replied_in_all if replied_in_all else None, 0, digits=0))
    print(f"rows written (replies table): {rows_written}; replies the students saw in all phases: {replied_in_all}")
    print(f"(stand-in: paced test server, {rate} tokens/s, {tokens} tokens per reply; spread phase think time "
          f"{os.environ.get('LOAD_THINK_MIN_S', '5')}-{os.environ.get('LOAD_THINK_MAX_S', '15')} s)")
    return exit_status(goals)


if __name__ == "__main__":
    sys.exit(main())
