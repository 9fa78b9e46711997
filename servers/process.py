"""Start and stop a server process: one per stand-in, app or engine a test or benchmark talks to.

Every server binds 127.0.0.1 on a free port, is started in a process group of
its own and stopped by its PID. Its output goes to a log file under LOG_DIR,
whose tail is quoted when it fails to come up.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from config import REPO

# Not under .files/: Chainlit deletes that folder whenever an app stops.
LOG_DIR = Path(os.environ.get("TEST_LOG_DIR", REPO / ".test-logs"))
PYTHON = sys.executable


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class ServerProcess:
    """A subprocess serving HTTP on loopback, stopped by PID."""

    def __init__(self, name: str, command: list[str], *, env: dict[str, str] | None = None,
                 cwd: Path = REPO) -> None:
        self.name = name
        self.command = command
        self.env = {**os.environ, **(env or {})}
        self.cwd = cwd
        self.process: subprocess.Popen | None = None
        LOG_DIR.mkdir(parents=True, exist_ok=True)
        self.log_path = LOG_DIR / f"{name}.log"

    def start(self) -> "ServerProcess":
        with open(self.log_path, "wb") as log:  # the child keeps its own copy of the descriptor
            self.process = subprocess.Popen(
                self.command, cwd=self.cwd, env=self.env, stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        return self

    def wait_http(self, url: str, timeout_s: float, ok_status: tuple[int, ...] = (200,)) -> None:
        """Poll `url` until it answers with one of `ok_status`; fail with the log tail otherwise."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process is not None and self.process.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self.process.returncode}:\n{self.log_tail()}")
            try:
                with urllib.request.urlopen(url, timeout=2) as response:
                    if response.status in ok_status:
                        return
            except urllib.error.HTTPError as error:
                if error.code in ok_status:
                    return
            except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
                pass
            time.sleep(0.3)
        raise RuntimeError(f"{self.name} did not answer {url} within {timeout_s:.0f} s:\n{self.log_tail()}")

    def start_serving(self, url: str, timeout_s: float) -> "ServerProcess":
        """Start, wait until `url` answers 200, and stop again if it never does."""
        self.start()
        try:
            self.wait_http(url, timeout_s)
        except RuntimeError:
            self.stop()
            raise
        return self

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def stop(self, timeout_s: float = 20.0) -> None:
        """SIGTERM the process group we started, then SIGKILL if it lingers."""
        if self.process is None or self.process.poll() is not None:
            return
        try:
            os.killpg(self.process.pid, signal.SIGTERM)
        except ProcessLookupError:
            return
        try:
            self.process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=10)

    def __enter__(self) -> "ServerProcess":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
