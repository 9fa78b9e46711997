"""nginx in front of app replicas on loopback, with the deployment's own config.

`Proxy(replicas).start()` writes a main nginx.conf into a temp dir that includes
deploy/nginx/serving-lab.conf with its upstream servers and its listen line
replaced (127.0.0.1, a free port), runs Debian's nginx on it in the foreground
(`daemon off`), waits until it answers, and stops it by PID.

    python -m servers.proxy 127.0.0.1:8001 127.0.0.1:8002 [--port P]   # prints PROXY_URL=..., serves until SIGTERM
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from config import REPO
from servers.process import ServerProcess, free_port

SITE_CONFIG = REPO / "deploy" / "nginx" / "serving-lab.conf"
NGINX = os.environ.get("NGINX", "/usr/sbin/nginx")
INSTALL_HINT = "apt-get install -y nginx  (Debian's package; the app's tests run it on loopback)"
_REPLICAS = re.compile(r"(# --- replicas[^\n]*\n)(.*?)(\s*# --- end replicas ---)", re.S)
_LISTEN = re.compile(r"(# --- listen ---\n)(.*?)(\s*# --- end listen ---)", re.S)


class NginxMissing(RuntimeError):
    """Debian's nginx is not installed."""


def site_config(replicas: list[str], port: int, site: Path = SITE_CONFIG) -> str:
    """deploy/nginx/serving-lab.conf with `replicas` (host:port each) as its upstream and 127.0.0.1:port as its listen."""
    text = site.read_text()
    servers = "".join(f"\n    server {address} max_fails=1 fail_timeout=10s;" for address in replicas)
    text, replaced = _REPLICAS.subn(lambda m: m.group(1) + servers.lstrip("\n") + m.group(3), text, count=1)
    text, listened = _LISTEN.subn(lambda m: m.group(1) + f"    listen 127.0.0.1:{port};" + m.group(3), text, count=1)
    if not (replaced and listened):
        raise ValueError(f"{site} lost its '# --- replicas' / '# --- listen ---' markers")
    return text


def main_config(root: Path, site: Path) -> str:
    """A whole nginx.conf whose every file (pid, logs, temp) is under `root`."""
    user = "user root;\n" if os.geteuid() == 0 else ""  # workers write the temp dirs made here
    return f"""{user}worker_processes 1;
daemon off;
pid {root}/nginx.pid;
error_log {root}/error.log warn;
events {{ worker_connections 4096; }}
http {{
    access_log {root}/access.log;
    client_body_temp_path {root}/client_body;
    proxy_temp_path {root}/proxy;
    fastcgi_temp_path {root}/fastcgi;
    uwsgi_temp_path {root}/uwsgi;
    scgi_temp_path {root}/scgi;
    include {site};
}}
"""


class Proxy:
    """Debian's nginx on 127.0.0.1 in front of `replicas`, configured from deploy/nginx/serving-lab.conf."""

    def __init__(self, replicas: list[str], port: int | None = None, name: str = "nginx") -> None:
        if not Path(NGINX).exists():
            raise NginxMissing(f"nginx not found at {NGINX}. Install it: {INSTALL_HINT}")
        self.replicas = list(replicas)
        self.port = port or free_port()
        self.root = Path(tempfile.mkdtemp(prefix="serving-lab-nginx-"))
        (self.root / "site.conf").write_text(site_config(self.replicas, self.port))
        (self.root / "nginx.conf").write_text(main_config(self.root, self.root / "site.conf"))
        self.server = ServerProcess(name, [NGINX, "-p", str(self.root), "-c", str(self.root / "nginx.conf"),
                                           "-e", str(self.root / "error.log")])

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def access_log(self) -> Path:
        return self.root / "access.log"

    def check(self) -> subprocess.CompletedProcess:
        """nginx's own check of the generated config (`nginx -t`), without serving."""
        return subprocess.run([NGINX, "-t", "-p", str(self.root), "-c", str(self.root / "nginx.conf"),
                               "-e", str(self.root / "error.log")], capture_output=True, text=True, timeout=30)

    def start(self, timeout_s: float = 30.0) -> "Proxy":
        """Start nginx and wait until it answers (any status: the replicas may still be starting)."""
        self.server.start()
        self.server.wait_http(self.url + "/", timeout_s, ok_status=(200, 502, 503, 504))
        return self

    def stop(self) -> None:
        """SIGTERM to nginx's master (by PID, its process group), then remove its files."""
        self.server.stop()
        shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> "Proxy":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m servers.proxy", description="nginx on loopback in front of app replicas")
    parser.add_argument("replicas", nargs="+", help="host:port of each replica (loopback)")
    parser.add_argument("--port", type=int, default=None, help="the proxy's port on 127.0.0.1 (default: a free one)")
    args = parser.parse_args(argv)
    try:
        proxy = Proxy(args.replicas, args.port)
    except NginxMissing as missing:
        print(missing, file=sys.stderr)
        return 2
    stopping = False

    def stop(_signum, _frame) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    try:
        proxy.start()
        print(f"PROXY_URL={proxy.url}", flush=True)
        while not stopping and proxy.server.process.poll() is None:
            time.sleep(0.2)
    finally:
        proxy.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
