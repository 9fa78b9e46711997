"""Nobody can lock a real user out: a guesser and a junk sender against the real app, with a verdict.

Starts the app as a user does (`chainlit run app.py --headless`, loopback) with login on, real
password hashes (PBKDF2-SHA256, 600,000 iterations: ~0.13 s a check here), the default limits
and one paced test backend: with `--replicas 2` (the default) two replicas on a throwaway
PostgreSQL (servers/postgres.py), sharing the counts; with `--replicas 1` one app on SQLite (the
table in its process). Every client connects from an address of its own on loopback
(127.0.0.x), which is the address the app sees; attackers alternate between the replicas.

Case 1, a guesser and alice. From 127.0.0.66 a script guesses alice's password as fast as the app
answers (4 connections) for `--guess-s` seconds. Meanwhile alice, from her own address
127.0.0.10, logs in with her right password every 2 s, each time from a fresh browser (no
device cookie: the harder case). Goals: every one of alice's logins answered 200 at its first
try, the slowest within 2 s; and the guesses the app checked (answered 401) no more than the
rule allows in that time: 5 free, then one per doubling wait (1 s, 2 s, 4 s, ...), i.e.
5 + floor(log2(T + 1)) in T seconds, plus one for timing slack. Before (a hard limit per
name, checked before the password) alice got HTTP 429 after 12 guesses.

Case 2, a class behind one NAT. For comparison, 30 classmates behind one address log in at once
with nobody sending junk, before the case (from 127.0.0.21) and after it (127.0.0.22): 30
password checks take seconds on a small machine whatever the limits do, and other work on the
machine moves that figure, so the slower of the two runs is the baseline. In the case, from
127.0.0.20 one student sends junk as fast as the app answers (4 connections: made-up names,
and his own name with wrong passwords), alone for 3 s, then the same 30 classmates behind that
address log in at once (fresh browsers) while the junk goes on. Goals: all 30 answered 200 at
their first try; the slowest at most 1.5 times the baseline's slowest, plus 1 s (what the junk
may cost the class); and the junk sender's own-name guesses that were checked within the same
rule as case 1. Before, after 40 junk tries 0 of 30 classmates could log in.

Each attacker runs in a process of its own at the lowest CPU priority (on a real network its CPU
is its own machine's, not the app's). Also printed, without a goal: how each attacker was
answered (401 checked, or an unknown name failed without hashing; 429 refused at once) and the
app's CPU use during each case (a flood of plain HTTP requests costs CPU whatever the limits do;
that is for a proxy's rate limit, see docs/deploying/classroom.md).

Run: `.venv/bin/python -m experiments.login_lockout [--replicas 2] [--guess-s 30] [--junk-s 20]
      [--iterations 600000]`
"""

from __future__ import annotations

import argparse
import math
import multiprocessing
import os
import secrets
import statistics
import sys
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack

import httpx
import psutil

from bench.verdict import Goal, all_of, at_most, exit_status
from core.auth import hash_password
from core.login_limits import FIRST_DELAY_S, LimitSettings
from servers.app import AppServer, backend_env, client_from, log_in, start_app
from servers.paced_openai import start_paced_server
from servers.postgres import PostgresCluster

GUESSER, ALICE, NAT = "127.0.0.66", "127.0.0.10", "127.0.0.20"
QUIET_NATS = ("127.0.0.21", "127.0.0.22")  # the class alone, before and after the case
ATTACK_CONNECTIONS = 4
FLOOD_START_S = 2.0
ALICE_EVERY_S = 2.0
JUNK_ALONE_S = 3.0
CLASS_SIZE = 30
ALICE_SLOWEST_S = 2.0
# The class with junk, against the class alone: slowest at most this many times, plus a second.
CLASS_SLOWER_AT_MOST = 1.5


def checks_allowed(seconds: float, settings: LimitSettings) -> int:
    """Wrong guesses for one name from one address the rule lets through in `seconds`: the free ones,
    then one after each doubling wait (the k-th extra one at 2**k - 1 s), plus one for slack."""
    extra = int(math.floor(math.log2(seconds / FIRST_DELAY_S + 1)))
    return settings.free_failures + extra + 1


def _attempt(kind: str) -> tuple[str, str, str]:
    """One attacker's attempt: (what it is, name, password)."""
    if kind == "guess":
        return "guess", "alice", "guess-" + secrets.token_hex(4)
    if secrets.randbelow(2):  # junk: a made-up name, or the sender's own name with a wrong password
        return "made-up name", "junk-" + secrets.token_hex(4), secrets.token_hex(4)
    return "own name", "mallory", "wrong-" + secrets.token_hex(4)


def _flood(urls: list[str], address: str, kind: str, connections: int, stop, results) -> None:
    """The attacker's process: `connections` threads sending back to back until `stop`; counts to `results`."""
    os.nice(19)  # the attacker's CPU is their own machine's: never this machine's app's
    answers: Counter[tuple[str, object]] = Counter()
    lock = threading.Lock()

    def run(number: int) -> None:
        sent = 0
        with client_from(address, timeout_s=60) as client:
            while not stop.is_set():
                what, name, password = _attempt(kind)
                try:
                    status = log_in(client, urls[(number + sent) % len(urls)], name, password).status_code
                except httpx.HTTPError as error:
                    status = type(error).__name__
                sent += 1
                client.cookies.clear()
                with lock:
                    answers[(what, status)] += 1

    threads = [threading.Thread(target=run, args=(number,)) for number in range(connections)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    results.put(dict(answers))


class Flood:
    """An attacker (`kind` guess or junk) in a process of its own, at the lowest CPU priority, with
    `connections` connections from `address`, sending logins back to back while in the block."""

    def __init__(self, urls: list[str], address: str, kind: str, connections: int = ATTACK_CONNECTIONS) -> None:
        context = multiprocessing.get_context("spawn")
        self._stop, self._results = context.Event(), context.Queue()
        self._process = context.Process(target=_flood, args=(urls, address, kind, connections, self._stop,
                                                             self._results), name=f"flood-{kind}")
        self.answers: Counter[tuple[str, object]] = Counter()

    def __enter__(self) -> "Flood":
        self._process.start()
        time.sleep(FLOOD_START_S)  # its imports, before anything is timed against it
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self.answers = Counter(self._results.get(timeout=120))
        self._process.join(timeout=30)

    def count(self, what: str, status: int) -> int:
        return self.answers[(what, status)]

    def describe(self) -> str:
        return ", ".join(f"{what} HTTP {status}: {count}" for (what, status), count in sorted(self.answers.items()))


def fresh_login(url: str, address: str, name: str, password: str) -> tuple[int, float]:
    """One login from a fresh browser at `address`: its status and how long it took (s)."""
    started = time.perf_counter()
    with client_from(address) as client:
        status = log_in(client, url, name, password).status_code
    return status, time.perf_counter() - started


class CpuMeter:
    """User + system CPU seconds of the app processes between `start` and `stop`."""

    def __init__(self, apps: list[AppServer]) -> None:
        self.processes = [psutil.Process(app.process.process.pid) for app in apps]

    def _total(self) -> float:
        total = 0.0
        for process in self.processes:
            for member in [process, *process.children(recursive=True)]:
                try:
                    times = member.cpu_times()
                except psutil.NoSuchProcess:
                    continue
                total += times.user + times.system
        return total

    def __enter__(self) -> "CpuMeter":
        self.started, self.cpu_started = time.monotonic(), self._total()
        return self

    def __exit__(self, *exc) -> None:
        self.cores = (self._total() - self.cpu_started) / (time.monotonic() - self.started)


def describe_times(times: list[float]) -> str:
    return f"p50 {statistics.median(times):.2f} s, slowest {max(times):.2f} s" if times else "none"


def case_guesser(urls: list[str], apps: list[AppServer], passwords: dict[str, str], seconds: float,
                 settings: LimitSettings) -> list[Goal]:
    print(f"\ncase 1: a guesser at {GUESSER} tries alice's password for {seconds:.0f} s "
          f"({ATTACK_CONNECTIONS} connections); alice logs in from {ALICE} every {ALICE_EVERY_S:.0f} s")
    alice: list[tuple[int, float]] = []
    with Flood(urls, GUESSER, "guess") as flood, CpuMeter(apps) as cpu:
        started = time.monotonic()
        while time.monotonic() - started < seconds:
            alice.append(fresh_login(urls[len(alice) % len(urls)], ALICE, "alice", passwords["alice"]))
            time.sleep(max(0.0, ALICE_EVERY_S - alice[-1][1]))
        attack_s = time.monotonic() - started
    ok = [took for status, took in alice if status == 200]
    print(f"  alice: {len(ok)} of {len(alice)} logins answered 200 ({describe_times([t for _, t in alice])}); "
          f"answers {dict(Counter(status for status, _ in alice))}")
    print(f"  the guesser: {flood.describe()}")
    print(f"  app CPU during the case: {cpu.cores:.2f} cores")
    allowed = checks_allowed(attack_s, settings)
    return [
        all_of("case 1: alice's logins answered 200 at the first try", len(ok), len(alice)),
        at_most("case 1: alice's slowest login", max((t for _, t in alice), default=None), ALICE_SLOWEST_S,
                unit="s", digits=2),
        at_most(f"case 1: guesses checked in {attack_s:.0f} s (the rule: {allowed})",
                flood.count("guess", 401), allowed, digits=0),
    ]


def case_nat(urls: list[str], apps: list[AppServer], passwords: dict[str, str], seconds: float,
             settings: LimitSettings) -> list[Goal]:
    print(f"\ncase 2: one student at {NAT} sends junk for {seconds:.0f} s ({ATTACK_CONNECTIONS} connections), "
          f"{CLASS_SIZE} classmates behind the same address log in at once after {JUNK_ALONE_S:.0f} s")

    classmates = [f"student{number}" for number in range(CLASS_SIZE)]

    def class_logs_in(address: str) -> list[tuple[int, float]]:
        with ThreadPoolExecutor(max_workers=CLASS_SIZE) as pool:
            return list(pool.map(lambda n: fresh_login(urls[n % len(urls)], address, classmates[n],
                                                       passwords[classmates[n]]), range(CLASS_SIZE)))

    def class_alone(address: str) -> float | None:
        answers = class_logs_in(address)
        print(f"  the class alone at {address}: {sum(status == 200 for status, _ in answers)} of {CLASS_SIZE} "
              f"answered 200 ({describe_times([t for _, t in answers])})")
        return max(t for status, t in answers) if all(status == 200 for status, _ in answers) else None

    alone = [class_alone(QUIET_NATS[0])]
    with Flood(urls, NAT, "junk") as flood, CpuMeter(apps) as cpu:
        started = time.monotonic()
        time.sleep(JUNK_ALONE_S)
        answers = class_logs_in(NAT)
        time.sleep(max(0.0, seconds - (time.monotonic() - started)))
        junk_s = time.monotonic() - started
    alone.append(class_alone(QUIET_NATS[1]))
    slowest_alone = max(alone) if None not in alone else None
    ok = [took for status, took in answers if status == 200]
    print(f"  classmates: {len(ok)} of {CLASS_SIZE} answered 200 ({describe_times([t for _, t in answers])}); "
          f"answers {dict(Counter(status for status, _ in answers))}")
    print(f"  the junk sender: {flood.describe()}")
    print(f"  app CPU during the case: {cpu.cores:.2f} cores")
    allowed = checks_allowed(junk_s, settings)
    bound = CLASS_SLOWER_AT_MOST * slowest_alone + 1.0 if slowest_alone is not None else 0.0
    return [
        all_of("case 2: classmates answered 200 at the first try", len(ok), CLASS_SIZE),
        at_most(f"case 2: the slowest classmate's login with junk (the class alone: "
                + (f"{slowest_alone:.2f} s; {CLASS_SLOWER_AT_MOST:g}x + 1 s)" if slowest_alone else "not all in)"),
                max((t for _, t in answers), default=None), bound, unit="s", digits=2,
                why_unmeasured="no classmate answered"),
        at_most(f"case 2: junk sender's own-name guesses checked in {junk_s:.0f} s (the rule: {allowed})",
                flood.count("own name", 401), allowed, digits=0),
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--replicas", type=int, choices=[1, 2], default=2,
                        help="2: two replicas on a throwaway PostgreSQL (default); 1: one app on SQLite")
    parser.add_argument("--guess-s", type=float, default=30.0, help="how long the guesser guesses (30)")
    parser.add_argument("--junk-s", type=float, default=20.0, help="how long the junk goes on (20)")
    parser.add_argument("--iterations", type=int, default=600_000, help="PBKDF2 iterations of the hashes (600,000)")
    args = parser.parse_args(argv)
    settings = LimitSettings.from_env(os.environ)
    names = ["alice", "mallory", *(f"student{number}" for number in range(CLASS_SIZE))]
    passwords = {name: f"{name}-{secrets.token_hex(6)}" for name in names}
    started = time.perf_counter()
    users = ",".join(f"{name}:{hash_password(password, iterations=args.iterations)}"
                     for name, password in passwords.items())
    print(f"one password check takes {(time.perf_counter() - started) / len(names):.2f} s here "
          f"({args.iterations:,} iterations); {os.cpu_count()} cores, load average "
          f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print(f"limits: {settings}")
    with ExitStack() as stack:
        paced = start_paced_server(100, 10, name="login-lockout-paced")
        stack.callback(paced.stop)
        env = {"BACKENDS": "paced", **backend_env("paced", kind="openai", base_url=paced.base_url),
               "AUTH_USERS": users, "CHAINLIT_AUTH_SECRET": secrets.token_urlsafe(32)}
        if args.replicas == 2:
            cluster = PostgresCluster().start()
            stack.callback(cluster.remove)
            env["DATABASE_URL"] = cluster.url
        apps = []
        for number in range(1, args.replicas + 1):
            app = start_app({**env, "LAB_REPLICA_ID": f"app-{number}"}, name=f"login-lockout-app-{number}")
            stack.callback(app.stop)
            apps.append(app)
        urls = [app.url for app in apps]
        print(f"{len(apps)} replica(s): {', '.join(urls)}"
              + (" on one PostgreSQL" if args.replicas == 2 else " on SQLite"))
        goals = case_guesser(urls, apps, passwords, args.guess_s, settings)
        goals += case_nat(urls, apps, passwords, args.junk_s, settings)
    return exit_status(goals)


if __name__ == "__main__":
    sys.exit(main())
