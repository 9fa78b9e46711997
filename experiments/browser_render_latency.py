"""How far the text on screen lags a fast backend: last token sent -> last token shown.

Starts the paced OpenAI-protocol stand-in (servers/paced_openai.py), and, one
after the other against it, the floor (the bare Chainlit app of
experiments/floor/app.py: `stream_token` per chunk, nothing else) and this app
(`chainlit run app.py --headless`, the paced server as its only backend). For
each, it opens the chat in Debian's chromium and, for each rate, sends a few
messages whose replies are 300 tokens streamed at exactly that rate. The last
token of every reply is a marker word unique to the request:

- the server records `time.time()` when it hands that token to the transport;
- in the page, `Date.now()` is recorded when a WebSocket message carrying the
  marker arrives, when a MutationObserver sees the marker enter the DOM, and
  at the next animation frame (when it is painted).

Both clocks are this machine's wall clock. Goals, for this app: the marker in
the DOM within one frame (17 ms) of the server at 2000 tokens/s, within 50 ms
at 5000, and within 100 ms at any other rate. The floor is measured the same
way, in the same run, and printed beside it: what Chainlit and the browser
alone cost on this machine at that moment (a busy 2-core machine adds tens of
ms to both). The "painted" column adds the wait for the browser's next frame;
with software rendering that wait alone can reach ~100 ms, so it is shown but
not judged. The slowest reply at each rate is judged: the script exits 1 naming
a missed goal.

Run: `.venv/bin/python -m experiments.browser_render_latency [--rates 2000,5000] [--tokens 300] [--repeats 5] [--apps floor,lab]`
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

from bench.verdict import at_most, exit_status
from experiments.class_burst import start_floor
from servers.app import backend_env, start_app
from servers.browser import launch_chromium, socket_messages_js
from servers.paced_openai import start_paced_server

GOAL_MS = 100.0
GOALS_MS = {2000.0: 17.0, 5000.0: 50.0}  # issue 21: one frame at 2000 tok/s, 50 ms at 5000
REPLY_TIMEOUT_S = 120.0

# Installed before the page's scripts: records when a WebSocket message carrying a marker arrives
# (before the app's client code handles it), to split the delay into network/app and browser work.
SOCKET_JS = "window.__markerSocket = {};\n" + socket_messages_js("""(data) => {
  if (data.indexOf("pacedend") < 0) return;
  const now = Date.now();
  for (const marker of data.match(/pacedend\\d+x[0-9a-f]{8}/g) || []) {
    if (!window.__markerSocket[marker]) window.__markerSocket[marker] = now;
  }
}""")

# Records, per marker word, when it entered the DOM and when the next frame was drawn.
OBSERVER_JS = """
() => {
  window.__markerSeen = {};
  const pattern = /pacedend\\d+x[0-9a-f]{8}/g;
  const scan = (text) => {
    const found = (text || "").match(pattern);
    if (!found) return;
    const now = Date.now();
    for (const marker of found) {
      if (window.__markerSeen[marker]) continue;
      const entry = {domMs: now, frameMs: null};
      window.__markerSeen[marker] = entry;
      requestAnimationFrame(() => { entry.frameMs = Date.now(); });
    }
  };
  new MutationObserver((records) => {
    for (const record of records) {
      if (record.type === "characterData") {
        scan(record.target.data);
      } else {
        for (const node of record.addedNodes) scan(node.textContent);
      }
    }
  }).observe(document.body, {subtree: true, childList: true, characterData: true});
}
"""


def wait_for(predicate, timeout_s: float, what: str):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise TimeoutError(f"timed out waiting for {what}")


def measure(page, paced, rates: list[float], tokens: int, repeats: int, *, floor: bool,
            first_token_s: float = 0.0) -> list[tuple]:
    """(rate, repeat, tokens, stream s, sent->socket ms, sent->DOM ms, sent->painted ms) per reply."""
    rows = []
    if floor:
        page.locator("#chat-input").wait_for(timeout=60_000)
    else:
        page.get_by_text("Backends", exact=True).wait_for(timeout=60_000)
    page.evaluate(OBSERVER_JS)
    replies = 0
    for rate in rates:
        paced.set_pace(rate, tokens, first_token_s=first_token_s)
        for repeat in range(1, repeats + 1):
            known = len(paced.requests())
            page.locator("#chat-input").fill(f"go {rate:g} {repeat}")
            page.locator("#chat-submit").click()
            request = wait_for(
                lambda: (lambda r: r[-1] if len(r) > known and r[-1]["completed"] else None)(paced.requests()),
                REPLY_TIMEOUT_S, "the server to finish the reply")
            marker = request["marker"]
            seen = wait_for(
                lambda: page.evaluate("(m) => { const e = window.__markerSeen[m];"
                                      " return e && e.frameMs ? e : null; }", marker),
                REPLY_TIMEOUT_S, f"{marker} on screen")
            if not floor:  # let the reply finish (final figures) before the next message
                page.locator('[data-testid="metrics"][data-state="completed"]').nth(replies).wait_for(
                    timeout=REPLY_TIMEOUT_S * 1000)
            replies += 1
            sent_ms = request["last_token_sent_at_s"] * 1000
            stream_s = request["last_token_sent_at_s"] - request["first_token_sent_at_s"]
            socket_ms = page.evaluate("(m) => window.__markerSocket[m] || null", marker)
            rows.append((rate, repeat, request["tokens_sent"], stream_s,
                         None if socket_ms is None else socket_ms - sent_ms,
                         seen["domMs"] - sent_ms, seen["frameMs"] - sent_ms))
            time.sleep(0.5)
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rates", default="2000,5000", help="tokens/s, comma-separated")
    parser.add_argument("--tokens", type=int, default=300)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--apps", default="floor,lab", help="floor (bare Chainlit), lab (this app), or both")
    parser.add_argument("--first-token-ms", type=float, default=0.0,
                        help="the server's TTFT (0: the reply streams while the page still draws the new message)")
    args = parser.parse_args(argv)
    rates = [float(r) for r in args.rates.split(",")]
    apps = [name.strip() for name in args.apps.split(",") if name.strip()]

    from playwright.sync_api import sync_playwright

    print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    paced = start_paced_server(rates[0], args.tokens, name="bench-paced-openai")
    results: dict[str, list[tuple]] = {}
    try:
        with sync_playwright() as playwright:
            browser = launch_chromium(playwright)
            try:
                for name in apps:
                    app = None
                    try:
                        if name == "floor":
                            app = start_floor(paced, 1)
                        else:
                            app = start_app({
                                "BACKENDS": "paced", "DEFAULT_BACKEND": "paced",
                                **backend_env("paced", kind="openai", base_url=paced.base_url,
                                              label="Paced test server"),
                                "DEFAULT_MAX_NEW_TOKENS": str(max(args.tokens, 16)), "DEFAULT_SYSTEM_PROMPT": "none",
                            }, name="bench-render-app")
                        context = browser.new_context(locale="en-US")
                        page = context.new_page()
                        page.add_init_script(SOCKET_JS)
                        page.goto(app.url)
                        results[name] = measure(page, paced, rates, args.tokens, args.repeats, floor=name == "floor",
                                                first_token_s=args.first_token_ms / 1000)
                        context.close()
                    finally:
                        if app is not None:
                            app.stop()
            finally:
                browser.close()
    finally:
        paced.stop()

    goals = []
    for name, rows in results.items():
        title = "the floor (bare Chainlit)" if name == "floor" else "this app"
        print(f"\n{title}\n{'tokens/s':>8}  {'run':>3}  {'tokens':>6}  {'stream s':>8}  {'sent->socket ms':>15}  "
              f"{'sent->DOM ms':>12}  {'sent->painted ms':>16}")
        for rate, repeat, tokens, stream_s, socket_ms, dom_ms, frame_ms in rows:
            socket = "-" if socket_ms is None else f"{socket_ms:.0f}"
            print(f"{rate:>8g}  {repeat:>3}  {tokens:>6}  {stream_s:>8.2f}  {socket:>15}  "
                  f"{dom_ms:>12.0f}  {frame_ms:>16.0f}")
    print(f"\n{'tokens/s':>8}  {'app':>5}  {'median DOM ms':>13}  {'max DOM ms':>10}  {'median painted ms':>17}  "
          f"{'max painted ms':>14}  {'goal (DOM)':>10}")
    for rate in rates:
        for name, rows in results.items():
            dom = [row[5] for row in rows if row[0] == rate]
            painted = [row[6] for row in rows if row[0] == rate]
            goal = GOALS_MS.get(rate, GOAL_MS)
            if dom:
                print(f"{rate:>8g}  {name:>5}  {statistics.median(dom):>13.0f}  {max(dom):>10.0f}  "
                      f"{statistics.median(painted):>17.0f}  {max(painted):>14.0f}  "
                      f"{'' if name == 'floor' else f'<= {goal:.0f} ms':>10}")
            if name != "floor":
                goals.append(at_most(f"this app: last token sent -> in the DOM at {rate:g} tokens/s, slowest of "
                                     f"{len(dom)}", max(dom) if dom else None, goal, unit="ms", digits=0))
    print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    return exit_status(goals)


if __name__ == "__main__":
    sys.exit(main())
