"""Debian's chromium, launched through Playwright for browser tests and experiments.

Playwright cannot download a browser on these machines, so it drives the
`chromium` Debian package (or the one at $CHROMIUM_PATH), headless and kept off
the network. Playwright is a test and experiment dependency, not the app's: the
caller hands in its own Playwright object, and nothing here imports Playwright.
"""

from __future__ import annotations

import os

CHROMIUM_PATH = os.environ.get("CHROMIUM_PATH", "/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]


def launch_chromium(playwright):
    """Debian's chromium, headless, with the flags that keep it off the network
    (`playwright` is what `sync_playwright()` gives)."""
    return playwright.chromium.launch(executable_path=CHROMIUM_PATH, headless=True, args=CHROMIUM_ARGS)


def socket_messages_js(on_message: str) -> str:
    """A script for `page.add_init_script` (it runs before the page's own): the JavaScript function
    `on_message` is called with each text message a WebSocket of the page receives, in the task that
    receives it and before the page's own code handles it."""
    return """
(() => {
  const onMessage = %s;
  const NativeWebSocket = window.WebSocket;
  window.WebSocket = class extends NativeWebSocket {
    constructor(...args) {
      super(...args);
      this.addEventListener("message", (event) => {
        if (typeof event.data === "string") onMessage(event.data);
      });
    }
  };
})();
""" % on_message


LIVE_TAP_START, LIVE_TAP_END = "// ---- the live tap", "// ---- end of the live tap"


def serve_without_live_tap(route) -> None:
    """A Playwright route handler for the page's own script (`**/public/serving-lab.js`): the script
    as the app serves it, less its live tap (between LIVE_TAP_START and LIVE_TAP_END), so the page
    never offers and gets a reply's text and figures through Chainlit (ui/live_tap.py); the element's
    loader and the other scripts it loads are kept."""
    script = route.fetch().text()
    start, end = script.index(LIVE_TAP_START), script.index(LIVE_TAP_END)
    if "window.WebSocket = class" not in script[start:end]:
        raise AssertionError("public/serving-lab.js: the live tap is no longer between its markers")
    route.fulfill(status=200, content_type="text/javascript", body=script[:start] + script[end:])
