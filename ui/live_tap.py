"""A reply's live text and figures straight to the page's view, past Chainlit's messages and elements.

Chainlit keeps every element of a chat in one list, and each `element` event makes a new list; its
MessageContent memo compares that list, so every message of the chat renders again and its Markdown
is parsed again. Chromium's trace of the page (2000 tokens/s replies): one update of the figures
took 20-33 ms of the page's main thread with 3-5 replies on the page and 50-87 ms with 16, against
9-15 ms for a piece of text; at ten updates a second a long chat keeps the page busy drawing figures
while the reply's own text waits behind them. A piece of text through Chainlit (`stream_token`)
renders the chat's message tree again too: the last text of a 2000 tokens/s reply reached the page
13-46 ms after the server sent it, most of it Chainlit's own drawing.

So a page that taps its own socket (public/serving-lab.js) says so once its socket is on a
WebSocket; from then on, to that socket:
- a reply's streamed text goes as `lab_text` events (`send_text`), which the page hands to the view
  of the reply's figures element: it shows the text above the figures until Chainlit's final update
  of the message brings the whole text (the page drops its copy when that update arrives); a refresh
  of the figures that falls due while text streams rides in the same event (ui/live.py `CARRY_AFTER`);
- every refresh of an element (a reply's figures, a round's columns, the engine panel), its final
  props too, goes as one `lab_live` event (`send`), which the page hands to the view alone.
What is stored still goes through Chainlit: the message's creation and its final text, the
element's creation (so Chainlit mounts it; a chat reply's is sent ahead, while the page is idle, for
the id its message will have: ui/session_view.ready_next_figures) and its final props (written as a row; a chat reopened
from the history shows them). The page orders the two by arrival: an element event for an id drops
the live props the page held for it. A page that never said so gets Chainlit's text stream and
element updates, as before: a script or a load test speaking socket.io, a socket on long-polling (the
tap sees only WebSocket frames), a socket reconnected under another id until its page offers again.

The same props go either way (`MetricsElement.update` is the one place both start from), so what a
blind round may show is decided once, before either; a reply's text goes one way or the other from
its first piece on (ui/session_view.py `ReplyText`).
"""

from __future__ import annotations

from typing import Any

import chainlit as cl
from chainlit.server import sio

EVENT = "lab_live"  # server -> page: {"id": element id, "props": the element's props now}
TEXT_EVENT = "lab_text"  # server -> page: {"id": element id, "for": message id, "text": the reply's next text,
#                          "props": the element's live props now (optional)}
ACK = "lab_live_ack"  # server -> page: {}
OFFER = "serving-lab-live-tap"  # page -> server, by window message: {"servingLab": OFFER, "version": VERSION}
VERSION = 3  # 2: the reply's text and the element's final props come this way too; 3: live props ride with text
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
    """One refresh of element `element_id` (live or final), to this session's page."""
    await cl.context.emitter.emit(EVENT, {"id": element_id, "props": props})


async def send_text(element_id: str, message_id: str, text: str, props: dict | None = None) -> None:
    """The next piece of a streaming reply's text, appended by the view of its figures element
    `element_id` until Chainlit's update of message `message_id` brings the whole text; with `props`,
    the element's live props too (one event and one drawing instead of a `send` beside it)."""
    payload = {"id": element_id, "for": message_id, "text": text}
    if props is not None:
        payload["props"] = props
    await cl.context.emitter.emit(TEXT_EVENT, payload)
