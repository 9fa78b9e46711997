"""A class logging in at once must not stall the room: GET / latency during 30 concurrent logins.

Starts the app (`chainlit run app.py --headless`, loopback) with login on and a
real password hash (PBKDF2-SHA256, 600,000 iterations: ~0.13 s a check here),
one paced test backend, and probes `GET /` every 20 ms from a thread of its
own. After a quiet baseline, `--logins` logins are sent at once, as the login
page sends them (multipart form to `POST /login`): half with a wrong password
for the real user, half for unknown user names (each a different one). It
prints GET /'s latency before and during the storm (p50, p99, max), and how
the logins were answered (401 wrong, 429 too many attempts, each with its time).

Goal, with a verdict (exit 1 naming a miss): every GET / during the storm is
answered within 250 ms. Before the password check left the event loop, the
same storm took GET / from 3 ms to 4,108 ms.

Run: `.venv/bin/python -m experiments.login_storm [--logins 30] [--iterations 600000]`
"""

from __future__ import annotations

import argparse
import os
import secrets
import statistics
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx

from bench.verdict import all_of, at_most, exit_status
from core.auth import hash_password
from core.timing import percentile
from servers.app import backend_env, start_app
from servers.paced_openai import start_paced_server

GOAL_MS = 250.0
PROBE_INTERVAL_S = 0.02
BASELINE_S = 3.0


class Prober:
    """GET / every PROBE_INTERVAL_S on its own thread; latencies (ms) with when each was sent."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.samples: list[tuple[float, float]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="probe", daemon=True)

    def _run(self) -> None:
        with httpx.Client(timeout=30) as client:
            while not self._stop.is_set():
                sent = time.monotonic()
                client.get(self.url + "/")
                self.samples.append((sent, (time.monotonic() - sent) * 1000))
                self._stop.wait(PROBE_INTERVAL_S)

    def __enter__(self) -> "Prober":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(timeout=60)

    def between(self, start: float, end: float) -> list[float]:
        return [latency for sent, latency in self.samples if start <= sent <= end]


def log_in(url: str, user: str, password: str) -> tuple[int, float]:
    started = time.monotonic()
    with httpx.Client(timeout=120) as client:
        response = client.post(url + "/login", files={"username": (None, user), "password": (None, password)})
    return response.status_code, (time.monotonic() - started) * 1000


def describe(latencies: list[float]) -> str:
    if not latencies:
        return "no samples"
    return (f"{len(latencies)} probes: p50 {statistics.median(latencies):.0f} ms, "
            f"p99 {percentile(latencies, 99):.0f} ms, max {max(latencies):.0f} ms")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--logins", type=int, default=30, help="logins sent at once (30)")
    parser.add_argument("--iterations", type=int, default=600_000, help="PBKDF2 iterations of the hash (600,000)")
    args = parser.parse_args(argv)
    password = "right-" + secrets.token_hex(4)
    started = time.perf_counter()
    hashed = hash_password(password, iterations=args.iterations)
    print(f"one password check takes {time.perf_counter() - started:.2f} s here ({args.iterations:,} iterations)")
    print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    paced = start_paced_server(100, 10, name="login-storm-paced")
    app = None
    try:
        app = start_app({"BACKENDS": "paced", **backend_env("paced", kind="openai", base_url=paced.base_url),
                         "AUTH_USERS": f"alice:{hashed}", "CHAINLIT_AUTH_SECRET": secrets.token_urlsafe(32)},
                        name="login-storm-app")
        attempts = [("alice", "wrong-" + secrets.token_hex(3)) if i % 2 == 0 else (f"nobody{i}", "x")
                    for i in range(args.logins)]
        with Prober(app.url) as prober:
            time.sleep(BASELINE_S)
            storm_started = time.monotonic()
            with ThreadPoolExecutor(max_workers=args.logins) as pool:
                answers = list(pool.map(lambda attempt: log_in(app.url, *attempt), attempts))
            storm_ended = time.monotonic()
            time.sleep(1.0)
    finally:
        if app is not None:
            app.stop()
        paced.stop()

    baseline = prober.between(storm_started - BASELINE_S, storm_started)
    during = prober.between(storm_started, storm_ended)
    print(f"\n{args.logins} logins at once, answered in {storm_ended - storm_started:.2f} s")
    for status in sorted({status for status, _ in answers}):
        times = [ms for code, ms in answers if code == status]
        print(f"  HTTP {status}: {len(times)} (answered in {min(times):.0f}..{max(times):.0f} ms)")
    print(f"GET / before the storm: {describe(baseline)}")
    print(f"GET / during the storm: {describe(during)}")
    print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    refused_or_wrong = sum(1 for status, _ in answers if status in (401, 429))
    return exit_status([
        at_most("GET / during the storm, slowest", max(during) if during else None, GOAL_MS, unit="ms", digits=0),
        all_of("logins answered 401 (wrong) or 429 (too many attempts)", refused_or_wrong, len(answers)),
    ])


if __name__ == "__main__":
    sys.exit(main())
