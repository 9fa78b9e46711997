"""The first reply of a fresh app, sent from a real browser, is measured as fairly as a warm one.

A class meets the app cold, from browsers: the page loads, sits a moment, and the first message
goes. A browser does more around that first message than a protocol client (the page's own
requests, its socket, rendering the chat start), and everything the app does for the first time
(imports, first parse, first connection, first database write) happens then too. None of it may
end up in the TTFT shown beside the reply.

For each of `--trials` fresh apps (`chainlit run app.py`, a paced OpenAI-protocol server of kind
`--kind` as its backend, a new SQLite database), Debian's chromium (Playwright) opens the page,
waits `--idle-s` (3 s), sends the first message, then `--warm` more. Each reply's TTFT as the app
measured it (its stored record, what its figures show) is set against the server's own (its first
send minus the request's arrival).

Goals, each with a verdict (exit 1 naming a miss): every trial's first reply within +15 ms of the
truth, and the warm replies' median within +15 ms.

Run: `.venv/bin/python -m experiments.first_reply_browser [--trials 3] [--warm 3] [--idle-s 3]
      [--first-token-ms 400] [--kind vllm]`
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from bench.verdict import Goal, at_most, exit_status
from servers.app import backend_env, run_coroutine, start_app, stored
from servers.browser import launch_chromium
from servers.paced_openai import start_paced_server

GOAL_MS = 15.0
REPLY_TIMEOUT_S = 120.0
RATE = 100.0
TOKENS = 40


def truth_ms(entry: dict) -> float:
    """The server's own TTFT of one request: its first send after the request arrived."""
    return (entry["first_token_sent_at_s"] - entry["received_at_s"]) * 1000


def biases_in_browser(page, server, app, count: int, idle_s: float) -> list[float]:
    """Open the app's page, wait, send `count` messages; each reply's TTFT shown minus the truth (ms)."""
    page.goto(app.url)
    page.get_by_text("Backends", exact=True).wait_for(timeout=60_000)
    time.sleep(idle_s)  # the page sits a moment before a person types, as in a class
    seen = len(server.requests())
    for number in range(count):
        page.locator("#chat-input").fill(f"Message {number}: what is time to first token?")
        page.locator("#chat-submit").click()
        page.locator('[data-testid="metrics"][data-state="completed"]').nth(number).wait_for(
            timeout=REPLY_TIMEOUT_S * 1000)
    truths = [truth_ms(entry) for entry in server.requests()[seen:]]
    deadline = time.monotonic() + 30
    while True:  # the app stores a reply just after its figures show
        replies = run_coroutine(stored(app.env["DATABASE_URL"], "replies", count + 5))
        if len(replies) >= count or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    shown = [reply.first_token_s * 1000 for reply in sorted(replies, key=lambda reply: reply.created_at)]
    if len(shown) != count or len(truths) != count:
        raise RuntimeError(f"{len(shown)} replies stored and {len(truths)} requests seen for {count} messages")
    return [s - t for s, t in zip(shown, truths)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=3, help="fresh apps, each with its first reply (3)")
    parser.add_argument("--warm", type=int, default=3, help="replies after the first, per app (3)")
    parser.add_argument("--idle-s", type=float, default=3.0, help="the page sits this long before the first message")
    parser.add_argument("--first-token-ms", type=float, default=400.0, help="the server's true TTFT (400)")
    parser.add_argument("--kind", default="vllm", choices=("vllm", "openai"))
    args = parser.parse_args(argv)

    from playwright.sync_api import sync_playwright

    print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    server = start_paced_server(RATE, TOKENS, name="first-reply-browser-paced")
    server.set_pace(RATE, TOKENS, first_token_s=args.first_token_ms / 1000)
    trials: list[list[float]] = []
    try:
        with sync_playwright() as playwright, tempfile.TemporaryDirectory(prefix="first-reply-browser-") as work:
            browser = launch_chromium(playwright)
            try:
                for trial in range(args.trials):
                    app = start_app({"BACKENDS": "paced", "DEFAULT_BACKEND": "paced", "DEFAULT_SYSTEM_PROMPT": "none",
                                     "DEFAULT_MAX_NEW_TOKENS": str(TOKENS), "AUTH_USERS": "",
                                     "DATABASE_URL": f"sqlite:///{Path(work) / f'trial-{trial}.db'}",
                                     **backend_env("paced", kind=args.kind, base_url=server.base_url, label="Paced")},
                                    name=f"first-reply-browser-{trial}")
                    try:
                        page = browser.new_context(locale="en-US").new_page()
                        biases = biases_in_browser(page, server, app, 1 + args.warm, args.idle_s)
                        page.context.close()
                    finally:
                        app.stop()
                    trials.append(biases)
                    print(f"trial {trial + 1}: first {biases[0]:+.1f} ms, warm "
                          + " ".join(f"{bias:+.1f}" for bias in biases[1:]), flush=True)
            finally:
                browser.close()
    finally:
        server.stop()
    print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    warm = [bias for biases in trials for bias in biases[1:]]
    goals: list[Goal] = [at_most(f"trial {number + 1}: the first reply's TTFT over the truth", biases[0], GOAL_MS,
                                 unit="ms") for number, biases in enumerate(trials)]
    goals.append(at_most("warm replies' TTFT over the truth, median", statistics.median(warm) if warm else None,
                         GOAL_MS, unit="ms"))
    return exit_status(goals)


if __name__ == "__main__":
    sys.exit(main())
