"""Side by side at speed: how late does each column's last token reach the screen?

Starts N paced OpenAI-protocol test servers (one per column) streaming
`--tokens` tokens at each rate in `--rates`, the app in compare mode with all
of them running concurrently, and Debian's chromium. For every reply it
measures, per column, the delay from the server handing over its last token
(a marker word unique to the request) to that word entering the page's DOM
and to the next painted frame (MutationObserver + requestAnimationFrame, same
machine clock). It also counts the round's updates the browser received (Chainlit's element
events and the live refreshes a tapped page takes past them, ui/live_tap.py) per
second of streaming: the whole round is one element update per tick, however
many columns and tokens.

Goal: every column's last token in the DOM within 100 ms of its arrival, and
within 50 ms with four columns at 500 tokens/s each; the script exits 1
naming the rate at which it was missed.

Run: `.venv/bin/python -m experiments.compare_render_latency [--columns 3] [--rates 100,300] [--tokens 300] [--repeats 3]`
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

from bench.verdict import at_most, exit_status
from experiments.browser_render_latency import OBSERVER_JS, wait_for
from servers.app import backend_env, start_app
from servers.browser import launch_chromium, socket_messages_js
from servers.paced_openai import start_paced_server

GOAL_MS = 100.0
# issue 21: four columns at 500 tokens/s each, every last token on the page within 50 ms
GOALS_MS = {(4, 500.0): 50.0}
REPLY_TIMEOUT_S = 120.0
COUNT_UPDATES_JS = "window.__elementUpdates = [];\n" + socket_messages_js("""(data) => {
  if (data.startsWith('42["element"') || data.startsWith('42["lab_live"')) window.__elementUpdates.push(Date.now());
}""")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--columns", type=int, default=3, help="2-4 columns")
    parser.add_argument("--rates", default="100,300", help="tokens/s per column, comma-separated")
    parser.add_argument("--tokens", type=int, default=300)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    rates = [float(r) for r in args.rates.split(",")]
    names = [f"p{index}" for index in range(1, args.columns + 1)]

    from playwright.sync_api import sync_playwright

    print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    servers = [start_paced_server(rates[0], args.tokens, name=f"bench-compare-{name}") for name in names]
    app = None
    rows = []
    try:
        env = {"BACKENDS": ",".join(names), "DEFAULT_MODE": "compare", "DEFAULT_RUN_ORDER": "concurrent",
               "DEFAULT_COMPARE_BACKENDS": ",".join(names), "DEFAULT_SYSTEM_PROMPT": "none",
               "DEFAULT_MAX_NEW_TOKENS": str(max(args.tokens, 16)), "DATABASE_URL": "sqlite:///.data/bench-compare.db"}
        for name, server in zip(names, servers):
            env.update(backend_env(name, kind="openai", base_url=server.base_url, label=f"Paced {name}"))
        app = start_app(env, name="bench-compare-app")
        with sync_playwright() as playwright:
            browser = launch_chromium(playwright)
            try:
                page = browser.new_context(locale="en-US", viewport={"width": 1500, "height": 1000}).new_page()
                page.add_init_script(COUNT_UPDATES_JS)
                page.goto(app.url)
                page.get_by_text("Backends", exact=True).wait_for(timeout=60_000)
                page.evaluate(OBSERVER_JS)
                for rate in rates:
                    for server in servers:
                        server.set_pace(rate, args.tokens)
                    for repeat in range(1, args.repeats + 1):
                        known = [len(server.requests()) for server in servers]
                        page.locator("#chat-input").fill(f"go {rate:g} {repeat}")
                        page.locator("#chat-submit").click()
                        requests = [wait_for(
                            lambda s=server, k=k: (lambda r: r[-1] if len(r) > k and r[-1]["completed"] else None)(
                                s.requests()), REPLY_TIMEOUT_S, "a server to finish") for server, k in zip(servers, known)]
                        delays = []
                        for request in requests:
                            seen = wait_for(lambda m=request["marker"]: page.evaluate(
                                "(m) => { const e = window.__markerSeen[m]; return e && e.frameMs ? e : null; }", m),
                                REPLY_TIMEOUT_S, "the marker on screen")
                            sent_ms = request["last_token_sent_at_s"] * 1000
                            delays.append((seen["domMs"] - sent_ms, seen["frameMs"] - sent_ms))
                        first_ms = min(r["first_token_sent_at_s"] for r in requests) * 1000
                        last_ms = max(r["last_token_sent_at_s"] for r in requests) * 1000
                        updates = page.evaluate("([a, b]) => window.__elementUpdates.filter(t => t >= a && t <= b).length",
                                                [first_ms, last_ms])
                        rows.append((rate, repeat, delays, updates / max((last_ms - first_ms) / 1000, 1e-3)))
                        page.locator('[data-testid="compare"][data-final="true"]').nth(sum(1 for _ in rows) - 1).wait_for(
                            timeout=REPLY_TIMEOUT_S * 1000)
                        time.sleep(0.5)
            finally:
                browser.close()
    finally:
        if app is not None:
            app.stop()
        for server in servers:
            server.stop()

    print(f"\n{args.columns} columns, {args.tokens} tokens each, all at once")
    print(f"{'tokens/s':>8}  {'run':>3}  {'per-column last token -> DOM ms':>34}  {'element updates/s':>17}")
    for rate, repeat, delays, updates_per_s in rows:
        shown = " ".join(f"{dom:>6.0f}" for dom, _ in delays)
        print(f"{rate:>8g}  {repeat:>3}  {shown:>34}  {updates_per_s:>17.1f}")
    print(f"\n{'tokens/s':>8}  {'median DOM ms':>13}  {'max DOM ms':>10}  {'max painted ms':>14}  goal: DOM <= {GOALS_MS.get((args.columns, rates[0]), GOAL_MS):.0f} ms (per rate)")
    goals = []
    for rate in rates:
        dom = [d for row in rows if row[0] == rate for d, _ in row[2]]
        painted = [p for row in rows if row[0] == rate for _, p in row[2]]
        if dom:
            print(f"{rate:>8g}  {statistics.median(dom):>13.0f}  {max(dom):>10.0f}  {max(painted):>14.0f}")
        goals.append(at_most(f"every column's last token -> in the DOM at {rate:g} tokens/s, slowest of {len(dom)}",
                             max(dom) if dom else None, GOALS_MS.get((args.columns, rate), GOAL_MS), unit="ms", digits=0))
    print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    return exit_status(goals)


if __name__ == "__main__":
    sys.exit(main())
