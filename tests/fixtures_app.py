"""Fixtures that start the real app, the paced test server and a real browser.

Registered in tests/conftest.py through `pytest_plugins`. The plain helpers
(`start_app`, `start_paced_server`, `launch_chromium`) are used by the
benchmarks in bench/ too, so tests and benchmarks drive the app the same way.

- The app is started exactly as a user would (`chainlit run app.py
  --headless`, never `-w`) from the repo root, with the given environment
  (BACKENDS etc.; environment variables win over .env), on a free loopback
  port, polled until its page answers HTTP 200, and stopped by PID.
- The browser is Debian's chromium through Playwright (Playwright cannot
  download its own browser here).
"""

from __future__ import annotations

import asyncio
import json
import os
import tempfile
import threading
import time
import urllib.request
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest

from config import env_prefix
from tests.servers import PYTHON, REPO, ServerProcess, free_port

CHROMIUM_PATH = os.environ.get("CHROMIUM_PATH", "/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]
APP_START_TIMEOUT_S = 90.0


# ---------------------------------------------------------------- the app


@dataclass
class AppServer:
    """A running `chainlit run app.py` and where to reach it."""

    url: str
    process: ServerProcess
    env: dict[str, str]

    def stop(self) -> None:
        self.process.stop()


def chainlit_command(port: int) -> list[str]:
    """`chainlit run app.py --headless` on loopback, with the venv's chainlit script."""
    script = Path(PYTHON).with_name("chainlit")
    launcher = [str(script)] if script.exists() else [PYTHON, "-m", "chainlit"]
    return [*launcher, "run", "app.py", "--headless", "--host", "127.0.0.1", "--port", str(port)]


def start_app(env: dict[str, str], *, name: str = "chainlit-app",
              timeout_s: float = APP_START_TIMEOUT_S) -> AppServer:
    """Start the app with `env` on top of this process's environment; return once it serves its page.
    Without a DATABASE_URL in `env` it gets a fresh SQLite file of its own (never the user's)."""
    port = free_port()
    database = env.get("DATABASE_URL") or f"sqlite:///{tempfile.mkdtemp(prefix='lab-db-')}/lab.db"
    full_env = {"CHAINLIT_APP_ROOT": str(REPO), **env, "DATABASE_URL": database}
    url = f"http://127.0.0.1:{port}"
    process = ServerProcess(name, chainlit_command(port), env=full_env).start_serving(url + "/", timeout_s)
    return AppServer(url, process, full_env)


def backend_env(name: str, *, kind: str, base_url: str = "", label: str = "", **more: str) -> dict[str, str]:
    """The `N_...` variables of one configured backend (see config.py), e.g. N_KIND, N_BASE_URL."""
    prefix = env_prefix(name)
    values = {"KIND": kind, "BASE_URL": base_url, "LABEL": label, **{k.upper(): v for k, v in more.items()}}
    return {prefix + key: value for key, value in values.items() if value}


def run_coroutine(coroutine):
    """Run a coroutine to its end from a sync test (Playwright's sync API holds this thread's loop)."""
    outcome: dict[str, object] = {}

    def work() -> None:
        try:
            outcome["value"] = asyncio.run(coroutine)
        except BaseException as error:  # handed back to the test below
            outcome["error"] = error

    worker = threading.Thread(target=work)
    worker.start()
    worker.join()
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]


async def stored(url: str, what: str, *args):
    """Read the app's database the way the app does: `await Store.<what>(*args)` on `url`."""
    from store import Store

    store = await Store.open(url)
    try:
        return await getattr(store, what)(*args)
    finally:
        await store.aclose()


def stored_when(url: str, what: str, *args, until: Callable[[Any], bool], timeout_s: float = 30.0):
    """`stored(url, what, *args)` once `until(result)` holds (from a sync test). The page shows a
    reply final a moment before the app has written its row: a read right away could miss it."""
    deadline = time.monotonic() + timeout_s
    while True:
        result = run_coroutine(stored(url, what, *args))
        if until(result):
            return result
        assert time.monotonic() < deadline, f"the database never had what the test waits for ({what}{args})"
        time.sleep(0.2)


# ---------------------------------------------------------------- the paced server


@dataclass
class PacedServer:
    """A running tests.paced_openai_server and its test-only routes."""

    root_url: str
    process: ServerProcess

    @property
    def base_url(self) -> str:
        """The OpenAI base URL (what `N_BASE_URL` takes)."""
        return self.root_url + "/v1"

    def _call(self, path: str, body: dict | None = None) -> object:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(self.root_url + path, data=data,
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=10) as response:
            return json.loads(response.read())

    def set_pace(self, rate_tokens_per_s: float, tokens: int, first_token_s: float = 0.0) -> None:
        self._call("/test/pace", {"rate_tokens_per_s": rate_tokens_per_s, "tokens": tokens,
                                  "first_token_s": first_token_s})

    def set_faults(self, **faults: object) -> None:
        """Test faults for later requests: stall_after_tokens=N, stall_s=S; require_key=K (None: off)."""
        self._call("/test/pace", faults)

    def set_reply(self, *, text: str | None = None, error: dict | None = None,
                  rate_tokens_per_s: float = 200, first_token_s: float = 0.0) -> None:
        """Every reply is `text` (streamed in small pieces), or every request fails with `error`
        ({"status", "body", "content_type"}); the next `set_pace` goes back to w1..wN + marker."""
        self._call("/test/pace", {"rate_tokens_per_s": rate_tokens_per_s, "first_token_s": first_token_s,
                                  "text": text, "error": error})

    def requests(self) -> list[dict]:
        """Every chat request so far (marker, last_token_sent_at_s, closed_by_client, ...)."""
        return self._call("/test/requests")

    def stop(self) -> None:
        self.process.stop()


def start_paced_server(rate_tokens_per_s: float, tokens: int, *, name: str = "paced-openai",
                       timeout_s: float = 30.0) -> PacedServer:
    port = free_port()
    command = [PYTHON, "-m", "tests.paced_openai_server", "--port", str(port),
               "--rate", str(rate_tokens_per_s), "--tokens", str(tokens)]
    root_url = f"http://127.0.0.1:{port}"
    process = ServerProcess(name, command).start_serving(root_url + "/health", timeout_s)
    return PacedServer(root_url, process)


@contextmanager
def paced_pair(name: str, *, tokens: tuple[int, int] = (8, 6),
               rates: tuple[float, float] = (200.0, 150.0)) -> Iterator[tuple[PacedServer, PacedServer]]:
    """Two paced servers, a left and a right engine (for rounds, votes and the leaderboard), both
    stopped on the way out (the first too if the second fails to start)."""
    servers: list[PacedServer] = []
    try:
        for side, rate, count in zip(("left", "right"), rates, tokens):
            servers.append(start_paced_server(rate_tokens_per_s=rate, tokens=count, name=f"paced-{name}-{side}"))
        yield servers[0], servers[1]
    finally:
        for server in servers:
            server.stop()


def closed_loopback_url() -> str:
    """An OpenAI base URL on a loopback port nothing listens on (a backend that is down)."""
    return f"http://127.0.0.1:{free_port()}/v1"


# ---------------------------------------------------------------- the browser


def launch_chromium(playwright):
    """Debian's chromium, headless, with the flags that keep it off the network."""
    return playwright.chromium.launch(executable_path=CHROMIUM_PATH, headless=True, args=CHROMIUM_ARGS)


# ---------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def paced_server() -> Iterator[PacedServer]:
    """One paced OpenAI-protocol server per test module; tests set its pace with `set_pace`."""
    server = start_paced_server(rate_tokens_per_s=50, tokens=60)
    yield server
    server.stop()


@pytest.fixture(scope="module")
def app_factory() -> Iterator[Callable[..., AppServer]]:
    """`app_factory(env, name=...)` starts the app; every app started is stopped after the module."""
    started: list[AppServer] = []

    def start(env: dict[str, str], *, name: str = "chainlit-app") -> AppServer:
        app = start_app(env, name=name)
        started.append(app)
        return app

    yield start
    for app in reversed(started):
        app.stop()


@pytest.fixture(scope="module")
def chromium() -> Iterator[object]:
    """A Playwright chromium browser shared by the tests of one module."""
    if not Path(CHROMIUM_PATH).exists():
        pytest.skip(f"no chromium at {CHROMIUM_PATH} (install Debian's chromium or set CHROMIUM_PATH)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = launch_chromium(playwright)
        yield browser
        browser.close()


@pytest.fixture
def page(chromium) -> Iterator[object]:
    """A fresh browser context and page (English UI) per test."""
    context = chromium.new_context(locale="en-US", viewport={"width": 1400, "height": 1000})
    page = context.new_page()
    yield page
    context.close()
