"""The lecture hall as a person starts it: `scripts/lecture_hall.sh --paced-server`, i.e. a throwaway
PostgreSQL, two app replicas (app-1, app-2) with login on, and Debian's nginx in front, all on
127.0.0.1. `Hall` knows the proxy's address, each replica's address and PID, and the database.
The script is stopped by its PID (SIGTERM); it stops everything it started.
"""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from config import REPO
from core.auth import hash_password
from servers.process import free_port

HALL_START_TIMEOUT_S = 240.0
PASSWORDS = {"alice": "alice-" + secrets.token_hex(4), "bob": "bob-" + secrets.token_hex(4)}


@dataclass
class Replica:
    name: str
    pid: int
    url: str


@dataclass
class Hall:
    url: str
    logs: Path
    process: subprocess.Popen
    replicas: dict[str, Replica] = field(default_factory=dict)

    @property
    def database_url(self) -> str:
        for line in (self.logs / "postgres.log").read_text().splitlines():
            if line.startswith("DATABASE_URL="):
                return line.removeprefix("DATABASE_URL=")
        raise AssertionError("the hall's PostgreSQL printed no DATABASE_URL")

    def log_tail(self, name: str, lines: int = 30) -> str:
        path = self.logs / name
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:]) if path.exists() else "(no log)"

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=90)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(timeout=10)


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def start_hall(logs: Path, **env: str) -> Hall:
    users = ",".join(f"{name}:{hash_password(password, iterations=1000)}" for name, password in PASSWORDS.items())
    full_env = {k: v for k, v in os.environ.items() if k != "DATABASE_URL"}
    full_env.update(AUTH_USERS=users, TEACHERS="alice", CHAINLIT_AUTH_SECRET=secrets.token_urlsafe(32), **env)
    port = free_port()
    out = open(logs / "lecture_hall.out", "w")
    process = subprocess.Popen(["bash", "scripts/lecture_hall.sh", "--paced-server", "--port", str(port),
                                "--logs", str(logs)], cwd=REPO, env=full_env, stdout=out,
                               stderr=subprocess.STDOUT, start_new_session=True)
    hall = Hall(f"http://127.0.0.1:{port}", logs, process)
    deadline = time.monotonic() + HALL_START_TIMEOUT_S
    while "PROXY_URL=" not in (logs / "lecture_hall.out").read_text():
        if process.poll() is not None or time.monotonic() > deadline:
            hall.stop()
            pytest.fail(f"the lecture hall did not start:\n{hall.log_tail('lecture_hall.out')}\n"
                        f"{hall.log_tail('app-1.log')}", pytrace=False)
        time.sleep(0.5)
    for line in (logs / "replicas.txt").read_text().splitlines():
        name, pid, address = line.split()
        hall.replicas[name] = Replica(name, int(pid), f"http://{address}")
    return hall


@pytest.fixture(scope="module")
def hall(tmp_path_factory):
    """Two replicas behind nginx on one PostgreSQL, login on (alice teaches, bob studies)."""
    # 200 tokens at 40/s: a reply streams for 5 s, long enough to kill its replica mid-way.
    started = start_hall(tmp_path_factory.mktemp("hall"), PACED_RATE="40", PACED_TOKENS="200")
    try:
        yield started
    finally:
        started.stop()
        left = [r.name for r in started.replicas.values() if alive(r.pid)]
        assert not left, f"the script left {left} running"
