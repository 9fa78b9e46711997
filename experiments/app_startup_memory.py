"""App start time and memory with 1 vs 10 open chat sessions (the model is loaded once).

Starts `chainlit run app.py --headless` on loopback with the embedded
llama.cpp backend only, and reports:
- the time from starting the process to the first page served (HTTP 200 on /),
- the time until the first chat session is ready (its on_chat_start loads the model),
- the app's resident memory (the process and its children, psutil) with no
  session, 1 session and 10 sessions open in a real browser (each page waits
  until on_chat_start has finished), and how many sessions had to load the model.

A second copy of the model would cost about the GGUF's size again (plus its
context). Goals, with a verdict (exit 1 naming a miss): the growth from 1 to
10 sessions stays below one more copy, and only one session loads the model.

Run: `.venv/bin/python -m experiments.app_startup_memory [--sessions 10]`
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import urllib.error
import urllib.request

import psutil

from backends.llamacpp import resolve_model_path
from backends.registry import backend_configs
from bench.verdict import Goal, at_most, exit_status
from config import REPO, load_env
from servers.app import chainlit_command
from servers.browser import launch_chromium
from servers.process import ServerProcess, free_port

PAGE_TIMEOUT_S = 90.0
SESSION_TIMEOUT_MS = 120_000
SETTLE_S = 2.0
# Shown only in the session that loads the model ("Loading ...", then "... loaded in X s (shared by
# all sessions)", core/texts.py); later sessions find it loaded and show neither.
LOADING_NOTES = ("Loading the llama.cpp model", "shared by all sessions")


def sharing_goals(model_mb: float, extra_sessions_mb: float, loaders: int, sessions: int) -> list[Goal]:
    """The model is loaded once and shared: the sessions after the first together grow the app by
    less than one more copy of the model file, and only one session loads it."""
    return [
        at_most(f"app growth for {sessions - 1} more sessions (one more model copy = {model_mb:.0f} MB)",
                extra_sessions_mb, model_mb, unit="MB"),
        at_most(f"sessions of {sessions} that had to load the model", loaders, 1, digits=0),
    ]


def tree_rss_bytes(pid: int) -> int:
    """Resident memory of a process and all its descendants."""
    root = psutil.Process(pid)
    total = 0
    for process in [root, *root.children(recursive=True)]:
        try:
            total += process.memory_info().rss
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return total


def wait_first_page(url: str, process: ServerProcess, timeout_s: float) -> float:
    """Poll every 50 ms until `url` answers 200; return the monotonic time it did."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.process.poll() is not None:
            raise RuntimeError(f"the app exited:\n{process.log_tail()}")
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                if response.status == 200:
                    return time.monotonic()
        except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
            pass
        time.sleep(0.05)
    raise RuntimeError(f"no page within {timeout_s:.0f} s:\n{process.log_tail()}")


def open_session(browser, url: str):
    """A new browser context + page on the app, returned once on_chat_start has finished."""
    context = browser.new_context(locale="en-US")
    page = context.new_page()
    page.goto(url)
    # The last thing on_chat_start sends is the backend status list.
    page.get_by_text("Backends", exact=True).wait_for(timeout=SESSION_TIMEOUT_MS)
    return context, page


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=10)
    args = parser.parse_args(argv)

    from playwright.sync_api import sync_playwright

    load_env()  # the app reads .env too (e.g. LLAMA_CPP_MODEL_PATH)
    env = {"CHAINLIT_APP_ROOT": str(REPO), "BACKENDS": "llama_cpp", "DEFAULT_BACKEND": "llama_cpp"}
    model_path = resolve_model_path(backend_configs({**os.environ, **env})[0])
    model_mb = model_path.stat().st_size / 2**20
    port = free_port()
    url = f"http://127.0.0.1:{port}/"
    print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    app = ServerProcess("bench-startup-app", chainlit_command(port), env=env)
    started = time.monotonic()
    app.start()
    contexts = []
    try:
        served = wait_first_page(url, app, PAGE_TIMEOUT_S)
        print(f"chainlit run -> first page served (HTTP 200): {served - started:.2f} s")
        time.sleep(SETTLE_S)
        rss_idle = tree_rss_bytes(app.process.pid)

        with sync_playwright() as playwright:
            browser = launch_chromium(playwright)
            try:
                first_started = time.monotonic()
                contexts.append(open_session(browser, url))
                print(f"first session ready (its on_chat_start loads the model): "
                      f"{time.monotonic() - first_started:.2f} s after opening the page")
                time.sleep(SETTLE_S)
                rss_one = tree_rss_bytes(app.process.pid)
                for _ in range(args.sessions - 1):
                    contexts.append(open_session(browser, url))
                time.sleep(SETTLE_S)
                rss_many = tree_rss_bytes(app.process.pid)
                loaders = sum(1 for _, page in contexts
                              if any(page.get_by_text(note).count() for note in LOADING_NOTES))
            finally:
                for context, _ in contexts:
                    context.close()
                browser.close()
    finally:
        app.stop()

    mb = 2**20
    print(f"\napp RSS (process + children), {model_path.name} is {model_mb:.0f} MB on disk")
    print(f"  {'no session':<14}{rss_idle / mb:>8.1f} MB")
    print(f"  {'1 session':<14}{rss_one / mb:>8.1f} MB   (model loaded: +{(rss_one - rss_idle) / mb:.1f} MB)")
    print(f"  {f'{args.sessions} sessions':<14}{rss_many / mb:>8.1f} MB   "
          f"(+{(rss_many - rss_one) / mb:.1f} MB for {args.sessions - 1} more sessions, "
          f"{(rss_many - rss_one) / mb / max(1, args.sessions - 1):.2f} MB each)")
    print(f"  sessions that had to load the model: {loaders} of {len(contexts)}")
    print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    return exit_status(sharing_goals(model_mb, (rss_many - rss_one) / mb, loaders, len(contexts)))


if __name__ == "__main__":
    sys.exit(main())
