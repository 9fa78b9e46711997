"""A throwaway PostgreSQL cluster: tests, the lecture-hall demo and its benchmark.

Debian's PostgreSQL binaries run a fresh cluster in a temp dir, listening on
127.0.0.1 on a free port (its unix socket lives in the temp dir too), with
password authentication over TCP. The server runs as the `postgres` system user
when started as root (PostgreSQL refuses root). It is stopped by PID (fast
shutdown) and its dir removed; `pause`/`resume` freeze it in place (a hung server). `url` points at the `postgres` database;
`new_postgres_database` makes more.

    python -m servers.postgres       # prints DATABASE_URL=..., serves until Ctrl-C / SIGTERM
"""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

from servers.process import ServerProcess, free_port

POSTGRES_START_TIMEOUT_S = 30.0
POSTGRES_PASSWORD = "serving-lab-test"
INSTALL_HINT = "apt-get install -y postgresql  (Debian 12: PostgreSQL 15; a throwaway cluster is started from it)"


class PostgresMissing(RuntimeError):
    """Debian's PostgreSQL server binaries (or the `postgres` user to run them as root) are missing."""


def postgres_bin_dir() -> Path:
    """The newest /usr/lib/postgresql/N/bin that has initdb."""
    found = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"), key=lambda path: int(path.parent.parent.name))
    if not found:
        raise PostgresMissing(f"PostgreSQL server binaries not found under /usr/lib/postgresql. Install them: {INSTALL_HINT}")
    return found[-1].parent


def _as_server_user(command: list[str]) -> list[str]:
    if os.geteuid() != 0:
        return command
    return ["runuser", "-u", "postgres", "--", *command]


def _server_user_ids() -> tuple[int, int] | None:
    if os.geteuid() != 0:
        return None
    try:
        entry = pwd.getpwnam("postgres")
    except KeyError:
        raise PostgresMissing(f"Running as root, but there is no `postgres` user to run PostgreSQL as. {INSTALL_HINT}") from None
    return entry.pw_uid, entry.pw_gid


def _stop(server: ServerProcess, timeout_s: float = 20.0) -> None:
    """SIGINT (PostgreSQL's fast shutdown) to the process group we started; SIGKILL if it lingers."""
    process = server.process
    if process is None or process.poll() is not None:
        return
    try:
        os.killpg(process.pid, signal.SIGINT)
        process.wait(timeout=timeout_s)
    except ProcessLookupError:
        return
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=10)


class PostgresCluster:
    """A throwaway cluster in a temp dir on a free loopback port, which can be stopped and started
    again on the same port (what a test of a database outage needs)."""

    def __init__(self, max_connections: int = 100) -> None:
        self.bin_dir = postgres_bin_dir()
        self.owner = _server_user_ids()
        self.root = Path(tempfile.mkdtemp(prefix="serving-lab-pg-"))
        self.port = free_port()
        self.max_connections = max_connections
        self.server: ServerProcess | None = None
        self.paused = False
        password_file = self.root / "password"
        password_file.write_text(POSTGRES_PASSWORD + "\n")
        if self.owner is not None:
            for path in (self.root, password_file):
                os.chown(path, *self.owner)
        subprocess.run(
            _as_server_user([str(self.bin_dir / "initdb"), "-D", str(self.root / "data"), "-U", "postgres",
                             "--pwfile", str(password_file), "--auth-local=trust", "--auth-host=scram-sha-256",
                             "--encoding=UTF8", "--no-locale", "--no-sync"]),
            cwd=self.root, check=True, capture_output=True,
        )

    @property
    def url(self) -> str:
        return f"postgresql://postgres:{POSTGRES_PASSWORD}@127.0.0.1:{self.port}/postgres"

    def start(self) -> "PostgresCluster":
        self.server = ServerProcess(f"postgres-{self.port}", _as_server_user([
            str(self.bin_dir / "postgres"), "-D", str(self.root / "data"), "-h", "127.0.0.1", "-p", str(self.port),
            "-k", str(self.root),  # the unix socket stays in the temp dir, nothing in /var/run
            "-c", f"max_connections={self.max_connections}",
            # A throwaway cluster: durability off, for speed.
            "-c", "fsync=off", "-c", "synchronous_commit=off", "-c", "full_page_writes=off",
        ]), cwd=self.root).start()
        _wait_ready(self.server, self.bin_dir, self.port)
        return self

    def stop(self) -> None:
        if self.server is not None:
            self.resume()  # a paused server would not hear its shutdown
            _stop(self.server)
            self.server = None

    def pause(self) -> None:
        """Freeze the server and every process it started (SIGSTOP): a hung database. The kernel
        still accepts connections on its port; nothing answers on them, old or new."""
        for process in self._processes():
            process.send_signal(signal.SIGSTOP)
        self.paused = True

    def resume(self) -> None:
        """Undo `pause` (SIGCONT)."""
        if self.paused:
            for process in reversed(self._processes()):
                process.send_signal(signal.SIGCONT)
            self.paused = False

    def _processes(self) -> list:
        """The started process and its descendants (PostgreSQL's backends are session leaders of
        their own, so a signal to the process group misses them)."""
        import psutil

        if self.server is None or self.server.process is None:
            return []
        try:
            root = psutil.Process(self.server.process.pid)
            return [root, *root.children(recursive=True)]
        except psutil.NoSuchProcess:
            return []

    def remove(self) -> None:
        self.stop()
        shutil.rmtree(self.root, ignore_errors=True)


def _wait_ready(server: ServerProcess, bin_dir: Path, port: int) -> None:
    deadline = time.monotonic() + POSTGRES_START_TIMEOUT_S
    while time.monotonic() < deadline:
        if server.process.poll() is not None:
            raise RuntimeError(f"postgres exited with {server.process.returncode}:\n{server.log_tail()}")
        ready = subprocess.run([str(bin_dir / "pg_isready"), "-q", "-h", "127.0.0.1", "-p", str(port)])
        if ready.returncode == 0:
            return
        time.sleep(0.1)
    _stop(server)
    raise RuntimeError(f"postgres did not accept connections within {POSTGRES_START_TIMEOUT_S:.0f} s:\n{server.log_tail()}")


async def new_postgres_database(admin_url: str) -> str:
    """Create an empty database on the cluster behind `admin_url`; return its URL."""
    import asyncpg
    from sqlalchemy.engine import make_url

    name = f"test_{uuid.uuid4().hex[:12]}"
    connection = await asyncpg.connect(admin_url)
    try:
        await connection.execute(f'CREATE DATABASE "{name}"')
    finally:
        await connection.close()
    return make_url(admin_url).set(database=name).render_as_string(hide_password=False)


def main() -> int:
    """Start a cluster, print its URL, serve until SIGINT/SIGTERM, then stop it and remove its dir."""
    try:
        cluster = PostgresCluster(max_connections=int(os.environ.get("POSTGRES_MAX_CONNECTIONS", "200")))
    except PostgresMissing as missing:
        print(missing, file=sys.stderr)
        return 2
    stopping = False

    def stop(_signum, _frame) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    try:
        cluster.start()
        print(f"DATABASE_URL={cluster.url}", flush=True)
        while not stopping and cluster.server.process.poll() is None:
            time.sleep(0.2)
    finally:
        cluster.remove()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
