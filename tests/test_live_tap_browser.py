"""Live figures past Chainlit's element list, in a real browser (ui/live_tap.py, public/serving-lab.js).

The page taps its own socket and offers; from then on a reply's live refreshes come as `lab_live`
events and Chainlit sends the reply's element twice only (its creation and its final props), so a
refresh no longer re-renders every message of the chat. Checked from both sides: the frames the page
received, and the figures it showed while the reply streamed. The control is the same page without
the tap (its script served without it): every refresh is an element update again, and the page still
shows live figures, so the first test's counts come from the tap and nothing else.
"""

from __future__ import annotations


import pytest
from playwright.sync_api import Page

from servers.app import backend_env
from servers.paced_openai import start_paced_server
from tests.browser_frames import collect_frames, drain_frames, events
from tests.test_browser import new_reply_id, send, watch_reply

pytestmark = pytest.mark.slow

RATE = 20  # tokens/s: a 40-token reply streams for 2 s, about 20 refreshes at ~10 a second
TOKENS = 40
SESSION_READY_TIMEOUT_MS = 120_000


@pytest.fixture(scope="module")
def paced():
    server = start_paced_server(RATE, TOKENS, name="paced-live-tap-browser")
    yield server
    server.stop()


@pytest.fixture(scope="module")
def app(app_factory, paced, tmp_path_factory):
    database = tmp_path_factory.mktemp("live-tap") / "lab.db"
    return app_factory({"BACKENDS": "paced", "DEFAULT_BACKEND": "paced", "DEFAULT_SYSTEM_PROMPT": "none",
                        "DEFAULT_MAX_NEW_TOKENS": str(TOKENS), "DATABASE_URL": f"sqlite:///{database}",
                        **backend_env("paced", kind="openai", base_url=paced.base_url, label="Paced")},
                       name="chainlit-live-tap-browser")


def one_reply(page: Page, app, frames) -> tuple[list[dict], list[tuple[str, list]]]:
    """Send one message; the reply's figures as the page showed them every 50 ms, and the events the
    page received meanwhile."""
    page.goto(app.url)
    page.get_by_text("Backends", exact=True).wait_for(timeout=SESSION_READY_TIMEOUT_MS)
    page.wait_for_timeout(1000)  # the page has offered and been answered (or, untapped, never offers)
    since = len(frames["received"])
    send(page, "count for me")
    shown = watch_reply(page, new_reply_id(page, None))
    return shown, events(drain_frames(page, frames, since=since, until_task_end=True))


def streaming_token_counts(shown: list[dict]) -> list[int]:
    """The distinct token counts the figures showed while the reply streamed, in order."""
    counts: list[int] = []
    for snapshot in shown:
        if snapshot["state"] == "streaming" and snapshot["tokens"]:
            count = int(snapshot["tokens"].split()[0])
            if not counts or counts[-1] != count:
                counts.append(count)
    return counts


def element_updates(received: list[tuple[str, list]]) -> dict[str, list[dict]]:
    """The reply's figures element's props by how they came: Chainlit's `element` events and `lab_live`."""
    by_kind: dict[str, list[dict]] = {"element": [], "lab_live": []}
    for event, args in received:
        data = args[0] if args else None
        if event in by_kind and isinstance(data, dict) and isinstance(data.get("props"), dict) \
                and "state" in data["props"]:
            by_kind[event].append(data["props"])
    return by_kind


def test_a_tapped_page_shows_live_figures_from_lab_live_and_gets_the_element_only_created_and_final(
        page: Page, app):
    frames = collect_frames(page)
    shown, received = one_reply(page, app, frames)

    assert ("lab_live_ack", [{}]) in events(frames["received"]), "the app never answered the page's offer"
    updates = element_updates(received)
    # Chainlit's element: created before the first token, then the final props; nothing between.
    assert [props["state"] for props in updates["element"]] == ["starting", "completed"], updates["element"]
    # Every refresh in between came past it, and none of them was final.
    live = updates["lab_live"]
    assert len(live) >= 8, f"only {len(live)} live refreshes in a 2 s reply"
    assert all(props["state"] not in ("completed", "stopped", "error") for props in live), live
    # The page drew them as the reply streamed: the count rose in several steps ...
    counts = streaming_token_counts(shown)
    assert len(counts) >= 4 and counts == sorted(counts), counts
    # ... and then showed the final figures, not a live refresh that came before them.
    assert shown[-1]["state"] == "completed" and shown[-1]["tokens"].split()[0] == str(TOKENS), shown[-1]


TAP_START, TAP_END = "// ---- the live tap", "// ---- end of the live tap"


def without_the_tap(route) -> None:
    """The page's own script as the app serves it, less its live tap (the element's loader and the
    other scripts it loads are kept)."""
    script = route.fetch().text()
    start, end = script.index(TAP_START), script.index(TAP_END)
    assert "window.WebSocket = class" in script[start:end]
    route.fulfill(status=200, content_type="text/javascript", body=script[:start] + script[end:])


def test_control_an_untapped_page_gets_every_refresh_as_an_element_update(page: Page, app):
    page.route("**/public/serving-lab.js", without_the_tap)
    frames = collect_frames(page)
    shown, received = one_reply(page, app, frames)

    assert not any(event == "lab_live_ack" for event, _ in events(frames["received"]))
    updates = element_updates(received)
    assert updates["lab_live"] == []
    streaming = [props for props in updates["element"] if props["state"] == "streaming"]
    assert len(streaming) >= 8, f"only {len(streaming)} element updates while the reply streamed"
    counts = streaming_token_counts(shown)
    assert len(counts) >= 4 and counts == sorted(counts), counts
    assert shown[-1]["state"] == "completed", shown[-1]
