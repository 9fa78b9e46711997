"""Every socket.io frame a browser page receives and sends, for tests that check what left the server.

Playwright hands websocket frames to Python only while the test waits on the
page, so a check that reads the list straight after the page showed
something may miss frames still on their way (a round's last element update,
the task's end). `drain_frames` waits until they are in: the reply's task has
ended (its `task_end` frame) when asked, and no frame has come for a while.
"""

from __future__ import annotations

import json
import time

from playwright.sync_api import Page

QUIET_MS = 400  # no new frame for this long: what was on its way has arrived
DRAIN_TIMEOUT_S = 60.0


def collect_frames(page: Page) -> dict[str, list[str]]:
    """Every websocket frame the page receives and sends, as text (and the long-polling POST bodies
    the page sends before its websocket opens)."""
    frames: dict[str, list[str]] = {"received": [], "sent": []}

    def as_text(payload) -> str:
        return payload if isinstance(payload, str) else payload.decode("utf-8", "replace")

    def on_socket(ws) -> None:
        ws.on("framereceived", lambda payload: frames["received"].append(as_text(payload)))
        ws.on("framesent", lambda payload: frames["sent"].append(as_text(payload)))

    def on_request(request) -> None:
        # socket.io connects over HTTP long-polling first: its CONNECT packet is a POST body.
        if "/ws/socket.io" in request.url and request.method == "POST" and request.post_data:
            frames["sent"].append(request.post_data)

    page.on("websocket", on_socket)
    page.on("request", on_request)
    return frames


def events(frames: list[str]) -> list[tuple[str, list]]:
    """The socket.io events in `frames` as (name, arguments)."""
    found = []
    for frame in frames:
        body = frame.lstrip("0123456789")
        if not body.startswith("["):
            continue
        try:
            name, *args = json.loads(body)
        except ValueError:
            continue
        found.append((name, args))
    return found


def drain_frames(page: Page, frames: dict[str, list[str]], *, since: int = 0, until_task_end: bool = False,
                 quiet_ms: int = QUIET_MS, timeout_s: float = DRAIN_TIMEOUT_S) -> list[str]:
    """The frames received after the first `since`, once every frame on its way has arrived:
    with `until_task_end`, a `task_end` frame (the reply's task is over) has come, and in any case
    no frame has come for `quiet_ms`."""
    deadline = time.monotonic() + timeout_s
    seen = -1
    quiet_since = time.monotonic()
    while True:
        page.wait_for_timeout(50)  # frames reach Python only while the page is waited on
        received = frames["received"][since:]
        now = time.monotonic()
        if len(received) != seen:
            seen, quiet_since = len(received), now
        ended = not until_task_end or any('"task_end"' in frame for frame in received)
        if ended and (now - quiet_since) * 1000 >= quiet_ms:
            return list(received)
        assert now < deadline, (f"frames still arriving (or no task_end) after {timeout_s:.0f} s: "
                                f"{[frame[:60] for frame in received[-5:]]}")


def session_id(frames: dict[str, list[str]]) -> str:
    """The socket.io session id the page sent when it connected (what /project/action needs)."""
    for frame in frames["sent"]:
        start = frame.find('40{')
        if start >= 0 and "sessionId" in frame:
            return json.loads(frame[start + 2:].split("\x1e")[0])["sessionId"]
    raise AssertionError("no socket.io connect frame seen")
