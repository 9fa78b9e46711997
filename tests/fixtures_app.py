"""Fixtures that start the real app, the paced stand-in server and a real browser.

Registered in tests/conftest.py through `pytest_plugins`. The servers and the
browser themselves are started by `servers.*` (the same code the experiments
use, so tests and experiments drive the app the same way); these fixtures only
scope and stop them.
"""

from __future__ import annotations

import socket
import time
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest

from servers.app import AppServer, run_coroutine, start_app, stored
from servers.browser import CHROMIUM_PATH, launch_chromium
from servers.paced_openai import PacedServer, start_paced_server


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


# Ports held (bound, never listening) for the rest of the test process: see closed_loopback_port.
_HELD_DOWN_PORTS: list[socket.socket] = []


def closed_loopback_port() -> int:
    """A loopback port nothing listens on (where a backend is down).

    The port stays bound by this process and never listens, so a connection there is refused and
    no server started later (the app itself, a stand-in server) can be handed the same port: a port
    that was merely free once was taken by the next server in CI, and the "down" backend answered.
    """
    held = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    held.bind(("127.0.0.1", 0))
    _HELD_DOWN_PORTS.append(held)
    return held.getsockname()[1]


def closed_loopback_url() -> str:
    """An OpenAI base URL on a `closed_loopback_port` (a backend that is down)."""
    return f"http://127.0.0.1:{closed_loopback_port()}/v1"


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
    broken = {app.process.name: stored_figure_problems(app.env["DATABASE_URL"]) for app in started}
    broken = {name: problems for name, problems in broken.items() if problems}
    assert not broken, f"stored replies whose figures disagree with each other: {broken}"


def stored_figure_problems(database_url: str) -> list[str]:
    """Every reply an app stored, checked against the relations its figures must keep
    (core.timing.figure_problems): a figure that breaks one fails the tests that made it."""
    from core.timing import figure_problems
    from store.errors import StoreError

    try:
        replies = run_coroutine(stored(database_url, "replies", 100_000))
    except StoreError:  # a database a test took away (the faults tests): nothing to read
        return []
    return [f"{reply.backend} reply {reply.id}: {'; '.join(problems)}"
            for reply in replies if (problems := figure_problems(reply.record))]


@pytest.fixture(scope="module")
def chromium() -> Iterator[object]:
    """A Playwright chromium browser shared by the tests of one module. Without chromium the test
    fails and says how to install it, like the vLLM, llama-server and PostgreSQL fixtures: a missing
    real component is a failure, never a skip."""
    if not Path(CHROMIUM_PATH).exists():
        pytest.fail(f"The browser tests need chromium: none at {CHROMIUM_PATH}. Run `bash scripts/setup.sh --test` "
                    "(it installs Debian's chromium with apt) or set CHROMIUM_PATH.", pytrace=False)
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
