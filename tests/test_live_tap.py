"""The live tap's protocol, as a socket.io client speaks it (ui/live_tap.py, load/chainlit_client.py).

A tab that offers (the window message the app's page sends) is answered and gets a reply's text as
`lab_text` events and every refresh of its figures, the final one too, as `lab_live` events (or in
a `lab_text` event, when a refresh falls due while text streams): Chainlit
sends the message's creation and final text, and the element's creation, nothing between. A tab that
never offers, offers another version, or is on long-polling gets Chainlit's text stream and every
refresh as an element update, as before.
"""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest

import load.chainlit_client as chainlit_client
from load.chainlit_client import LIVE_EVENT, LIVE_TAP_ACK, LIVE_TAP_OFFER, LIVE_TEXT, ChainlitClient
from servers.app import backend_env
from servers.paced_openai import start_paced_server
from ui import live_tap

pytestmark = pytest.mark.slow

RATE = 25  # tokens/s: 30 tokens stream for 1.2 s, about 12 refreshes
TOKENS = 30
REPLY_TIMEOUT_S = 60.0


@pytest.fixture(scope="module")
def app(app_factory, tmp_path_factory):
    paced = start_paced_server(RATE, TOKENS, name="paced-live-tap")
    database = tmp_path_factory.mktemp("live-tap-protocol") / "lab.db"
    try:
        yield app_factory({"BACKENDS": "paced", "DEFAULT_BACKEND": "paced", "DEFAULT_SYSTEM_PROMPT": "none",
                           "DEFAULT_MAX_NEW_TOKENS": str(TOKENS), "DATABASE_URL": f"sqlite:///{database}",
                           **backend_env("paced", kind="openai", base_url=paced.base_url, label="Paced")},
                          name="chainlit-live-tap")
    finally:
        paced.stop()


def figures(client: ChainlitClient, since: int) -> dict[str, list[str]]:
    """The states of the figures' props after event `since`, by the event that carried them."""
    by_event: dict[str, list[str]] = {"element": [], LIVE_EVENT: [], LIVE_TEXT: []}
    for _, event, data in client.events[since:]:
        props = data.get("props") if isinstance(data, dict) else None
        if event in by_event and isinstance(props, dict) and "state" in props:
            by_event[event].append(props["state"])
    return by_event


def ask(client: ChainlitClient) -> dict[str, list[str]]:
    """One reply: its figures' states by the event that carried them, and under "text" the events
    that carried its text, in order."""
    since = len(client.events)
    record = client.ask("count", REPLY_TIMEOUT_S)
    assert record.outcome == "replied", record.as_dict()
    assert record.output_tokens == TOKENS, record.as_dict()  # the final figures arrived either way
    words = record.text.split()  # the whole text, either way: w1 ... w29 and the request's marker word
    assert words[:-1] == [f"w{i}" for i in range(1, TOKENS)] and words[-1].startswith("pacedend"), record.text
    shown = figures(client, since)
    shown["text"] = [event for _, event, data in client.events[since:]
                     if event in ("stream_start", "stream_token", LIVE_TEXT)
                     and (data.get("output") if event == "stream_start" else True)]
    return shown


def elements_ahead(client: ChainlitClient, timeout_s: float = 30.0) -> list[dict]:
    """The element events a tapped tab got before its first message: the first reply's figures,
    sent when the app answered the tab's offer (which goes once the chat is ready)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        ahead = [data for _, event, data in list(client.events) if event == "element"]
        if ahead:
            return ahead
        time.sleep(0.02)
    raise AssertionError("no figures element came ahead of the first reply")


def test_an_offering_tab_gets_the_text_as_lab_text_and_the_figures_as_lab_live_after_their_creation(app):
    with ChainlitClient(app.url, record_events=True, live_tap=True) as client:
        client.open_chat(timeout_s=60)
        assert client.transport == "websocket"
        elements_ahead(client)
        shown = ask(client)
        final_text = [data["output"] for _, event, data in client.events
                      if event == "update_message" and data.get("type") == "assistant_message"][-1]
    # One element event in the reply: the next reply's figures, sent ahead (see the next test).
    assert shown["element"] == ["starting"], shown
    assert shown[LIVE_EVENT][-1] == "completed", shown
    # The live refreshes: alone, or riding with a piece of text (text every 40 ms at 25 tokens/s).
    live = shown[LIVE_EVENT][:-1] + shown[LIVE_TEXT]
    assert len(live) >= 5 and set(live) <= {"starting", "streaming"}, shown
    assert shown[LIVE_TEXT].count("streaming") >= 3, shown
    assert len(shown["text"]) >= 5 and set(shown["text"]) == {LIVE_TEXT}, shown["text"]
    assert final_text.split()[:-1] == [f"w{i}" for i in range(1, TOKENS)]  # Chainlit's final update, stored


def reply_events(client: ChainlitClient, since: int) -> tuple[str, list[tuple[str, dict]]]:
    """The id of the assistant message of the reply after event `since`, and the events since then."""
    events = [(event, data) for _, event, data in client.events[since:] if isinstance(data, dict)]
    message_id = next(data["id"] for event, data in events
                      if event == "new_message" and data.get("type") == "assistant_message")
    return message_id, events


def test_a_tapped_tab_gets_each_reply_s_figures_element_ahead_of_the_reply(app):
    # The element of a reply's figures comes while the page is idle, for the id its message will
    # have (ui/session_view.ready_next_figures): at the offer, then after each reply's final update.
    # The reply's own events then hold no element (Chainlit would draw every message again for it)
    # and the figures' first props come by the tap before the message that mounts them.
    with ChainlitClient(app.url, record_events=True, live_tap=True) as client:
        client.open_chat(timeout_s=60)
        ahead = elements_ahead(client)
        for _ in range(2):
            since = len(client.events)
            ask(client)
            message_id, events = reply_events(client, since)
            assert ahead and ahead[-1]["forId"] == message_id, (ahead, message_id)
            element_id = ahead[-1]["id"]
            names = [event for event, _ in events]
            created = names.index("new_message", names.index("new_message") + 1)  # after the run step
            assert [data["id"] for event, data in events[:created] if event == LIVE_EVENT] == [element_id]
            final = max(i for i, (event, data) in enumerate(events)
                        if event == "update_message" and data.get("id") == message_id)
            elements = [(i, data) for i, (event, data) in enumerate(events) if event == "element"]
            assert [i > final and data["forId"] != message_id for i, data in elements] == [True], elements
            assert all(data.get("id") == element_id for event, data in events if event == LIVE_EVENT)
            ahead = [data for _, data in elements]


def test_control_a_tab_on_long_polling_gets_the_figures_element_with_its_message(app, monkeypatch):
    monkeypatch.setattr(chainlit_client, "_websocket_client_installed", lambda: False)
    with ChainlitClient(app.url, record_events=True, live_tap=True) as client:
        client.open_chat(timeout_s=60)
        since = len(client.events)
        ask(client)
        message_id, events = reply_events(client, since)
    created = [i for i, (event, data) in enumerate(events) if event == "new_message" and data["id"] == message_id]
    elements = [(i, data["forId"]) for i, (event, data) in enumerate(events) if event == "element"]
    assert elements and all(i > created[0] and for_id == message_id for i, for_id in elements), elements


def test_control_a_tab_that_never_offers_gets_every_refresh_as_an_element_update(app):
    with ChainlitClient(app.url, record_events=True) as client:
        client.open_chat(timeout_s=60)
        shown = ask(client)
    assert shown[LIVE_EVENT] == [], shown
    assert shown["element"][0] == "starting" and shown["element"][-1] == "completed", shown
    assert shown["element"].count("streaming") >= 5, shown
    assert shown["text"][0] == "stream_start" and set(shown["text"][1:]) == {"stream_token"}, shown["text"]


def test_an_offer_of_another_version_is_not_taken(app):
    with ChainlitClient(app.url, record_events=True) as client:
        client.open_chat(timeout_s=60)
        client._sio.emit("window_message", {**LIVE_TAP_OFFER, "version": LIVE_TAP_OFFER["version"] + 1})
        shown = ask(client)
        assert not client.tracker.live_tap_acked
    assert shown[LIVE_EVENT] == [] and shown["element"].count("streaming") >= 5, shown
    assert LIVE_TEXT not in shown["text"], shown["text"]


def test_a_tab_on_long_polling_is_answered_but_gets_element_updates(app, monkeypatch):
    # The page's tap sees WebSocket frames only: on long-polling the app keeps to Chainlit's elements.
    monkeypatch.setattr(chainlit_client, "_websocket_client_installed", lambda: False)
    with ChainlitClient(app.url, record_events=True, live_tap=True) as client:
        client.open_chat(timeout_s=60)
        assert client.transport == "polling" and client.tracker.live_tap_acked
        shown = ask(client)
    assert shown[LIVE_EVENT] == [] and shown["element"].count("streaming") >= 5, shown
    assert LIVE_TEXT not in shown["text"], shown["text"]


def test_the_page_the_load_client_and_the_app_speak_the_same_offer():
    assert live_tap.is_offer(LIVE_TAP_OFFER)
    # A page of the version before takes no text this way: it is not answered.
    assert not live_tap.is_offer({**LIVE_TAP_OFFER, "version": 1}) and not live_tap.is_offer("hello")
    assert (LIVE_EVENT, LIVE_TAP_ACK, LIVE_TEXT) == (live_tap.EVENT, live_tap.ACK, live_tap.TEXT_EVENT)
    page = (Path(__file__).parent.parent / "public" / "serving-lab.js").read_text(encoding="utf-8")
    assert f'servingLab: "{live_tap.OFFER}", version: {live_tap.VERSION}' in page
    for event in (live_tap.EVENT, live_tap.ACK, live_tap.TEXT_EVENT):
        assert re.search(rf"42\[\"{event}\",", page), event
