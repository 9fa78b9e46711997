"""Sample the memory of the app's process tree once a second, as CSV lines `elapsed_s,rss_mb`.

`--pid P` follows a process we started; `--port P` finds the process listening
on a loopback port (an app that was already running). RSS is summed over the
process and its children (shared pages count once per process). Runs until the
process is gone or it is stopped (SIGTERM); each line is flushed as written.
"""

from __future__ import annotations

import argparse
import signal
import sys
import time

import psutil


def listening_pid(port: int) -> int | None:
    """The PID of the process listening on TCP `port`, if this user may see it."""
    for connection in psutil.net_connections(kind="tcp"):
        if connection.status == psutil.CONN_LISTEN and connection.laddr and connection.laddr.port == port:
            return connection.pid
    return None


def tree_rss_bytes(process: psutil.Process) -> int:
    """RSS of `process` plus all its descendants (those that vanish meanwhile are skipped)."""
    total = 0
    for member in [process, *process.children(recursive=True)]:
        try:
            total += member.memory_info().rss
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return total


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    target = parser.add_mutually_exclusive_group(required=True)
    target.add_argument("--pid", type=int)
    target.add_argument("--port", type=int)
    parser.add_argument("--out", required=True, help="CSV file to write")
    parser.add_argument("--interval-s", type=float, default=1.0)
    args = parser.parse_args(argv)

    pid = args.pid if args.pid else listening_pid(args.port)
    if pid is None:
        sys.exit(f"no process listens on port {args.port} (or it belongs to another user): no memory figures")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    process = psutil.Process(pid)
    started = time.monotonic()
    with open(args.out, "w", encoding="utf-8") as out:
        out.write("elapsed_s,rss_mb\n")
        while True:
            try:
                rss_mb = tree_rss_bytes(process) / 2**20  # MB as in experiments/app_startup_memory.py (MiB)
            except psutil.NoSuchProcess:
                return
            out.write(f"{time.monotonic() - started:.1f},{rss_mb:.1f}\n")
            out.flush()
            time.sleep(args.interval_s)


if __name__ == "__main__":
    main()
