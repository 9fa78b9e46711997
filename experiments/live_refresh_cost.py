"""What a refresh of the live figures and a piece of text cost the page, tapped and not, as a chat grows.

Chainlit re-renders every message of a chat (Markdown and all) for each `element` event, so an
element update of the figures costs the page more the longer the chat; the live tap (ui/live_tap.py,
public/serving-lab.js) sends the refreshes as `lab_live` events that only the figures' view renders
(or, when one falls due while text streams, inside the `lab_text` event of that text: such a frame
counts as a refresh and as a piece of text, each judged with the other's drawing in it).
This measures both in Debian's chromium with Chrome's own trace: for each frame of a streaming reply
the page received, the main thread's work from the task that handled it (the socket message,
Chainlit's handler and its synchronous render) up to the next frame (a render React scheduled,
layout, paint), with `--replies` replies already on the page.

A reply's text goes the same way on a tapped page (`lab_text`, drawn by the figures' view until the
message's final update) and through Chainlit's `stream_token` on an untapped one: its cost per piece
is measured beside.

Two pages on one app and one paced server: the app's page as it ships (tapped) and the same page
with the tap left out of public/serving-lab.js (untapped: the text through Chainlit and every
refresh an element update, as before). Goals, at the largest chat: a live refresh costs the tapped
page at most 5 ms of main thread, and at most a quarter of what an element update costs the
untapped one; a piece of text costs the tapped page at most half what it costs the untapped one.
The script exits 1 naming a miss.

Run: `.venv/bin/python -m experiments.live_refresh_cost [--replies 2,16] [--rate 100] [--tokens 100]`
"""

from __future__ import annotations

import argparse
import bisect
import json
import os
import statistics

from bench.verdict import at_most, exit_status
from servers.app import backend_env, start_app
from servers.browser import launch_chromium, serve_without_live_tap, socket_messages_js
from servers.paced_openai import start_paced_server

GOAL_TAPPED_MS = 5.0
GOAL_SHARE = 0.25
GOAL_TEXT_SHARE = 0.5
READY_TIMEOUT_MS = 120_000
REPLY_TIMEOUT_MS = 120_000
CATEGORIES = ["devtools.timeline", "blink.user_timing", "toplevel"]
TASKS = ("RunTask", "ThreadControllerImpl::RunTask")  # a main-thread task, as Chrome's trace names it

# Marks every socket.io frame with what it carried, inside the task that handles it.
MARK_JS = socket_messages_js("""(data) => {
  if (!data.startsWith("42[")) return;
  const name = (data.match(/^42\\["(\\w+)"/) || [])[1] || "?";
  const streaming = data.indexOf('"state":"streaming"') >= 0 ? ":streaming" : "";
  performance.mark("lab-frame:" + name + streaming);
}""")


def frame_costs(trace: dict) -> dict[str, list[float]]:
    """By the kind of frame: for each marked frame, the main-thread ms from the task that handled it up
    to the task that handled the next frame (React renders a refresh that is not Chainlit's in a task
    of its own, and layout and paint follow in others: all of it is counted, idle time is not)."""
    events = trace["traceEvents"] if isinstance(trace, dict) else trace
    names = {(e["pid"], e["tid"]): e["args"]["name"] for e in events
             if e.get("ph") == "M" and e.get("name") == "thread_name"}
    main = {key for key, name in names.items() if name == "CrRendererMain"}
    tasks: list[tuple[float, float]] = []  # outermost tasks only (Chrome nests RunTask in RunTask)
    for ts, dur in sorted((e["ts"], e.get("dur", 0)) for e in events
                          if (e["pid"], e["tid"]) in main and e.get("ph") == "X" and e["name"] in TASKS):
        if not tasks or ts >= tasks[-1][0] + tasks[-1][1]:
            tasks.append((ts, dur))
    starts = [ts for ts, _ in tasks]
    marks = sorted((e["ts"], e["name"].split(":", 1)[1]) for e in events
                   if e.get("name", "").startswith("lab-frame:") and e.get("ph") in ("R", "I", "n"))
    handled = []  # (index of the task that handled the frame, kind)
    for ts, kind in marks:
        index = bisect.bisect_right(starts, ts) - 1
        if index >= 0 and ts <= tasks[index][0] + tasks[index][1]:
            handled.append((index, kind))
    costs: dict[str, list[float]] = {}
    for position, (index, kind) in enumerate(handled):
        following = handled[position + 1][0] if position + 1 < len(handled) else len(tasks)
        if following == index:
            continue  # two frames in one task: counted with the last of them
        costs.setdefault(kind, []).append(sum(dur for _, dur in tasks[index:following]) / 1000)
    return costs


def measure(browser, app, paced, replies: list[int], rate: float, tokens: int, *, tapped: bool) -> dict:
    """{replies on the page: {frame kind: [ms, ...]}} for one page."""
    context = browser.new_context(locale="en-US", viewport={"width": 1400, "height": 1000})
    page = context.new_page()
    page.add_init_script(MARK_JS)
    if not tapped:
        page.route("**/public/serving-lab.js", serve_without_live_tap)
    page.goto(app.url)
    page.get_by_text("Backends", exact=True).wait_for(timeout=READY_TIMEOUT_MS)
    page.wait_for_timeout(1000)
    done = 0
    found = {}
    try:
        for count in replies:
            paced.set_pace(5000, tokens)  # fill the chat quickly up to `count` replies
            while done < count:
                send_and_wait(page, f"fill {done}", done)
                done += 1
            paced.set_pace(rate, tokens)
            page.wait_for_timeout(500)
            browser.start_tracing(page=page, categories=CATEGORIES)
            send_and_wait(page, f"measured after {count}", done)
            done += 1
            page.wait_for_timeout(300)
            found[count] = frame_costs(json.loads(browser.stop_tracing()))
    finally:
        context.close()
    return found


def send_and_wait(page, text: str, index: int) -> None:
    page.locator("#chat-input").fill(text)
    page.locator("#chat-submit").click()
    page.locator('[data-testid="metrics"][data-state="completed"]').nth(index).wait_for(timeout=REPLY_TIMEOUT_MS)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--replies", default="2,16", help="replies on the page before the measured one")
    parser.add_argument("--rate", type=float, default=100.0, help="tokens/s of the measured reply")
    parser.add_argument("--tokens", type=int, default=100)
    args = parser.parse_args(argv)
    replies = sorted(int(n) for n in args.replies.split(","))

    from playwright.sync_api import sync_playwright

    print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    paced = start_paced_server(args.rate, args.tokens, name="bench-paced-refresh")
    app = None
    results = {}
    try:
        app = start_app({"BACKENDS": "paced", "DEFAULT_BACKEND": "paced", "DEFAULT_SYSTEM_PROMPT": "none",
                         "DEFAULT_MAX_NEW_TOKENS": str(args.tokens),
                         **backend_env("paced", kind="openai", base_url=paced.base_url, label="Paced")},
                        name="bench-refresh-app")
        with sync_playwright() as playwright:
            browser = launch_chromium(playwright)
            try:
                for tapped in (False, True):
                    results[tapped] = measure(browser, app, paced, replies, args.rate, args.tokens, tapped=tapped)
            finally:
                browser.close()
    finally:
        if app is not None:
            app.stop()
        paced.stop()

    print(f"\nmain-thread ms per frame of a {args.tokens}-token reply at {args.rate:g} tokens/s, up to the next "
          "frame (median / max, count)")
    print(f"{'replies on page':>15}  {'page':>8}  {'live refresh':>22}  {'a piece of text':>22}")
    refresh, text_cost = {}, {}
    for count in replies:
        for tapped in (False, True):
            costs = results[tapped][count]
            if tapped:  # a refresh that fell due while text streamed rides with a piece of text:
                # counted as both (the frame draws both), so each side is judged on its heavier frames too
                live = costs.get("lab_live:streaming", []) + costs.get("lab_text:streaming", [])
                text = costs.get("lab_text", []) + costs.get("lab_text:streaming", [])
            else:
                live, text = costs.get("element:streaming", []), costs.get("stream_token", [])
            refresh[(count, tapped)] = statistics.median(live) if live else None
            text_cost[(count, tapped)] = statistics.median(text) if text else None
            print(f"{count:>15}  {'tapped' if tapped else 'untapped':>8}  {cell(live):>22}  {cell(text):>22}")
    print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}\n")

    largest = replies[-1]
    tapped_ms, untapped_ms = refresh[(largest, True)], refresh[(largest, False)]
    share = tapped_ms / untapped_ms if tapped_ms is not None and untapped_ms else None
    tapped_text, untapped_text = text_cost[(largest, True)], text_cost[(largest, False)]
    text_share = tapped_text / untapped_text if tapped_text is not None and untapped_text else None
    goals = [
        at_most(f"a live refresh on the tapped page with {largest} replies on it (median)", tapped_ms,
                GOAL_TAPPED_MS, unit=" ms"),
        at_most(f"its cost against an element update on the untapped page, {largest} replies", share,
                GOAL_SHARE, digits=3),
        at_most(f"a piece of text on the tapped page against one through Chainlit on the untapped page, "
                f"{largest} replies (medians)", text_share, GOAL_TEXT_SHARE, digits=3),
    ]
    return exit_status(goals)


def cell(values: list[float]) -> str:
    if not values:
        return "-"
    return f"{statistics.median(values):.1f} / {max(values):.1f} ms ({len(values)})"


if __name__ == "__main__":
    raise SystemExit(main())
