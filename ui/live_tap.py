"""Live figures straight to the page's view, past Chainlit's list of elements.

Chainlit keeps every element of a chat in one list, and each `element` event makes a new list; its
MessageContent memo compares that list, so every message of the chat renders again and its Markdown
is parsed again. Chromium's trace of the page (2000 tokens/s replies): one update of the figures
took 20-33 ms of the page's main thread with 3-5 replies on the page and 50-87 ms with 16, against
9-15 ms for a piece of text; at ten updates a second a long chat keeps the page busy drawing figures
while the reply's own text waits behind them.

So a page that taps its own socket (public/serving-lab.js) says so once its socket is on a
WebSocket; from then on a reply's live refreshes (figures, a round's columns, the engine panel) go to
that socket as one `lab_live` event, which the page hands to the view alone. What is stored still
goes through Chainlit: the element's creation and its final props (a chat reopened from the history
shows them). The page orders the two by arrival: an element event for an id drops the live props
the page held for it. A page that never said so gets Chainlit's element updates, as before: a
script or a load test speaking socket.io, a socket on long-polling (the tap sees only WebSocket
frames), a socket reconnected under another id until its page offers again.

The same props go either way (`MetricsElement.update` is the one place both start from), so what a
blind round may show is decided once, before either.
"""

from __future__ import annotations

from typing import Any

import chainlit as cl
from chainlit.server import sio

EVENT = "lab_live"  # server -> page: {"id": element id, "props": the element's props now}
ACK = "lab_live_ack"  # server -> page: {}
OFFER = "serving-lab-live-tap"  # page -> server, by window message: {"servingLab": OFFER, "version": VERSION}
VERSION = 1
SESSION_KEY = "live_tap_socket"


def is_offer(data: Any) -> bool:
    """Whether a page's window message offers to take live props (`OFFER`, this `VERSION`)."""
    return isinstance(data, dict) and data.get("servingLab") == OFFER and data.get("version") == VERSION


async def on_window_message(data: Any) -> None:
    """Chainlit's window-message hook: a page's offer to take live props, for the socket this session
    is connected by now (a reconnected page offers again); answered so the page stops offering."""
    if not is_offer(data):
        return
    cl.user_session.set(SESSION_KEY, cl.context.session.socket_id)
    await cl.context.emitter.emit(ACK, {})


def page_listens() -> bool:
    """Whether this session's page takes live props now: it offered on the socket it is connected by,
    and that socket is on a WebSocket (the page's tap sees nothing else)."""
    try:
        socket_id = getattr(cl.context.session, "socket_id", None)
        if socket_id is None or cl.user_session.get(SESSION_KEY) != socket_id:
            return False
        return sio.transport(socket_id) == "websocket"
    except Exception:  # noqa: BLE001 - no Chainlit context (a script, a test), a socket gone: Chainlit's path
        return False


async def send(element_id: str, props: dict) -> None:
    """One live refresh of element `element_id`, to this session's page."""
    await cl.context.emitter.emit(EVENT, {"id": element_id, "props": props})
