"""A reply's text and figures past Chainlit's messages and elements, in a real browser (ui/live_tap.py,
public/serving-lab.js).

The page taps its own socket and offers; from then on a reply's text comes as `lab_text` events,
shown by the figures' view above the figures until Chainlit's final update of the message, and
every refresh of the figures after their creation as `lab_live` events, so neither re-renders the
chat's messages. Checked from both sides: the frames the page received, and the text and figures it
showed while the reply streamed and after. The control is the same page without the tap (its script
served without it): the text streams through Chainlit and every refresh is an element update, and
the page still shows both growing, so the first test's observations come from the tap and nothing
else. A last pair checks when a piece of text is drawn: in the task its frame arrived in (the page
draws the tap's text as urgent), against a page that leaves it to React's next render task.
"""

from __future__ import annotations

import time

import pytest
from playwright.sync_api import Page

from servers.app import backend_env
from servers.browser import serve_without_live_tap, socket_messages_js
from servers.paced_openai import start_paced_server
from tests.browser_frames import collect_frames, drain_frames, events
from tests.test_browser import SNAPSHOT_JS, new_reply_id, send

pytestmark = pytest.mark.slow

RATE = 20  # tokens/s: a 40-token reply streams for 2 s, about 20 refreshes at ~10 a second
TOKENS = 40
SESSION_READY_TIMEOUT_MS = 120_000
REPLY_TIMEOUT_S = 60.0


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


TEXT_JS = """
(stepId) => {
  const inner = document.getElementById(stepId);
  const step = inner ? inner.closest('.step') : null;
  if (!step) return null;
  const live = step.querySelector('[data-testid="live-text"]');
  const content = [...step.querySelectorAll('.message-content .prose')]
    .filter((prose) => !prose.closest('[data-testid="live-text"]'));
  return {live: live ? live.innerText : null, content: content.map((prose) => prose.innerText).join(" "),
          whole: step.innerText};
}
"""


# The figures (SNAPSHOT_JS) and where the text is (TEXT_JS) at one moment of the page: read in two
# evaluations, the reply's end could come between them (figures still "streaming", the message
# already holding its whole text).
MOMENT_JS = f"(stepId) => [({SNAPSHOT_JS})(stepId), ({TEXT_JS})(stepId)]"


def open_chat(page: Page, app) -> None:
    page.goto(app.url)
    page.get_by_text("Backends", exact=True).wait_for(timeout=SESSION_READY_TIMEOUT_MS)
    page.wait_for_timeout(1000)  # the page has offered and been answered (or, untapped, never offers)


def one_reply(page: Page, app, frames) -> tuple[list[dict], list[tuple[str, list]], list[dict]]:
    """Send one message; the reply's figures as the page showed them every 50 ms, the events the page
    received meanwhile, and where its text was shown (`TEXT_JS`) at each of those moments (read
    together, `MOMENT_JS`) and once the reply's task had ended."""
    open_chat(page, app)
    since = len(frames["received"])
    send(page, "count for me")
    step_id = new_reply_id(page, None)
    shown, texts = [], []
    deadline = time.monotonic() + REPLY_TIMEOUT_S
    while not shown or shown[-1]["state"] not in ("completed", "stopped", "error"):
        assert time.monotonic() < deadline, f"the reply did not finish: {shown[-1:]}"
        figures, text = page.evaluate(MOMENT_JS, step_id)
        shown.append(figures)
        texts.append(text)
        time.sleep(0.05)
    received = events(drain_frames(page, frames, since=since, until_task_end=True))
    page.wait_for_timeout(200)  # the last frames drawn
    texts.append(page.evaluate(TEXT_JS, step_id))
    return shown, received, texts


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
    """The reply's figures element's props by how they came: Chainlit's `element` events, `lab_live`,
    `lab_text` (a refresh riding with a piece of text), and under "tap" the last two in order."""
    by_kind: dict[str, list[dict]] = {"element": [], "lab_live": [], "lab_text": [], "tap": []}
    for event, args in received:
        data = args[0] if args else None
        if event in by_kind and isinstance(data, dict) and isinstance(data.get("props"), dict) \
                and "state" in data["props"]:
            by_kind[event].append(data["props"])
            if event != "element":
                by_kind["tap"].append(data["props"])
    return by_kind


def test_a_tapped_page_shows_the_text_and_figures_from_the_tap_and_the_whole_text_once_at_the_end(
        page: Page, app):
    frames = collect_frames(page)
    shown, received, texts = one_reply(page, app, frames)

    assert ("lab_live_ack", [{}]) in events(frames["received"]), "the app never answered the page's offer"
    # The text came by the tap only: Chainlit streamed none of it.
    assert [event for event, _ in received if event == "lab_text"], "no lab_text"
    assert not [event for event, args in received if event == "stream_token"
                or (event == "stream_start" and args and args[0].get("output"))]
    # The page showed it growing in the figures' view, above the figures, while Chainlit's own
    # message text was still empty ...
    streaming = [text["live"] for text, figures in zip(texts, shown) if figures["state"] == "streaming"]
    lengths = [len(text.split()) for text in streaming if text]
    assert len(set(lengths)) >= 4 and lengths == sorted(lengths), lengths
    assert all(not text["content"] for text, figures in zip(texts, shown) if figures["state"] == "streaming")
    # ... and at the end the whole text once, in Chainlit's message, the tap's copy gone.
    final = texts[-1]
    assert final["live"] is None, final
    words = final["content"].split()
    assert words[:-1] == [f"w{i}" for i in range(1, TOKENS)] and words[-1].startswith("pacedend"), final
    assert final["whole"].count(words[-1]) == 1, final["whole"]

    updates = element_updates(received)
    # Chainlit's element: created ahead, while the page was idle, for the id the reply's message
    # was to have (ui/session_view.ready_next_figures); in the reply only the next reply's one.
    # Every props of the reply's figures came past it: the first before the message, the final too.
    message_id = next(args[0]["id"] for event, args in received
                      if event == "new_message" and args[0].get("type") == "assistant_message")
    whole = [(event, args[0]) for event, args in events(frames["received"]) if args and isinstance(args[0], dict)]
    created = [i for i, (event, data) in enumerate(whole) if event == "new_message" and data["id"] == message_id]
    for_it = [i for i, (event, data) in enumerate(whole) if event == "element" and data["forId"] == message_id]
    assert len(for_it) == 1 and for_it[0] < created[0], (for_it, created)
    assert [(props["state"], element["forId"] != message_id) for element, props in
            zip([args[0] for event, args in received if event == "element"], updates["element"])] \
        == [("starting", True)], updates["element"]
    live = updates["tap"]
    assert len(live) >= 8, f"only {len(live)} live refreshes in a 2 s reply"
    assert len(updates["lab_text"]) >= 4, "the refreshes did not ride with the text"
    assert live[0]["state"] == "starting" and live[-1]["state"] == "completed", live
    assert all(props["state"] == "streaming" for props in live[1:-1]), live
    # The page drew them as the reply streamed: the count rose in several steps ...
    counts = streaming_token_counts(shown)
    assert len(counts) >= 4 and counts == sorted(counts), counts
    # ... among them ones that came only with a piece of text (the page takes a refresh from there too),
    only_with_text = {props["tokens"] for props in updates["lab_text"]} - {props.get("tokens")
                                                                           for props in updates["lab_live"]}
    assert only_with_text & set(counts), (counts, only_with_text)
    # ... and then showed the final figures.
    assert shown[-1]["state"] == "completed" and shown[-1]["tokens"].split()[0] == str(TOKENS), shown[-1]


def test_control_an_untapped_page_gets_chainlits_text_stream_and_every_refresh_as_an_element_update(
        page: Page, app):
    page.route("**/public/serving-lab.js", serve_without_live_tap)
    frames = collect_frames(page)
    shown, received, texts = one_reply(page, app, frames)

    assert not any(event == "lab_live_ack" for event, _ in events(frames["received"]))
    assert not [event for event, _ in received if event in ("lab_text", "lab_live")]
    assert [event for event, _ in received if event == "stream_token"], "Chainlit streamed no text"
    # The text grew in Chainlit's message, and the figures' view never showed any.
    assert all(text["live"] is None for text in texts)
    lengths = [len(text["content"].split()) for text, figures in zip(texts, shown) if figures["state"] == "streaming"]
    assert len(set(lengths)) >= 4 and lengths == sorted(lengths), lengths
    words = texts[-1]["content"].split()
    assert words[:-1] == [f"w{i}" for i in range(1, TOKENS)], texts[-1]

    updates = element_updates(received)
    streaming = [props for props in updates["element"] if props["state"] == "streaming"]
    assert len(streaming) >= 8, f"only {len(streaming)} element updates while the reply streamed"
    counts = streaming_token_counts(shown)
    assert len(counts) >= 4 and counts == sorted(counts), counts
    assert shown[-1]["state"] == "completed", shown[-1]


# Installed before the page's scripts, so its listener runs before the tap's: for each piece of a
# reply's text, whether the reply's figures were on the page when its frame arrived (a piece that
# comes before Chainlit has drawn the new message has no view to be drawn in yet), and whether, in
# a task queued the moment its frame arrived, the figures' view showed it. A drawing left to a
# render task of React's own comes after that task (queued later).
NEXT_TASK_JS = "window.__drawnByNextTask = [];\n" + socket_messages_js("""(data) => {
  if (!data.startsWith('42["lab_text",')) return;
  const words = JSON.parse(data.slice(2))[1].text.trim().split(/\\s+/);
  const last = words[words.length - 1];
  const mounted = document.querySelectorAll('[data-testid="metrics"]').length > 0;
  const channel = new MessageChannel();
  channel.port1.onmessage = () => {
    const views = document.querySelectorAll('[data-testid="live-text"]');
    const shown = views.length ? views[views.length - 1].textContent.trim().split(/\\s+/).pop() : null;
    window.__drawnByNextTask.push({word: last, mounted, drawn: shown === last});
    channel.port1.close();
  };
  channel.port2.postMessage(null);
}""")


def serve_tap_drawing_later(route) -> None:
    """public/serving-lab.js with the tap telling the view of a piece of text as it tells it of a
    refresh of the figures (`tell`, not `tellNow`): React draws it in a task of its own."""
    script = route.fetch().text()
    urgent = "      tellNow(id);"
    if script.count(urgent) != 1:
        raise AssertionError("public/serving-lab.js: the tap no longer tells the view of text with tellNow")
    route.fulfill(status=200, content_type="text/javascript", body=script.replace(urgent, "      tell(id);"))


def drawn_by_next_task(page: Page, app) -> list[dict]:
    """One reply on a tapped page: for each piece of its text that came once the reply's figures were
    on the page, {word: its last word, drawn: shown by the next task}."""
    page.add_init_script(NEXT_TASK_JS)
    frames = collect_frames(page)
    _, received, texts = one_reply(page, app, frames)
    assert texts[-1]["content"].split()[-1].startswith("pacedend"), texts[-1]
    pieces = page.evaluate("() => window.__drawnByNextTask")
    assert len(pieces) == len([event for event, _ in received if event == "lab_text"]), pieces
    in_view = [piece for piece in pieces if piece["mounted"]]
    assert len(in_view) >= 10 and in_view[-1]["word"].startswith("pacedend"), pieces
    return in_view


def test_a_piece_of_the_replys_text_is_in_the_dom_before_the_next_task_after_its_frame(page: Page, app):
    pieces = drawn_by_next_task(page, app)
    assert all(piece["drawn"] for piece in pieces), [piece["word"] for piece in pieces if not piece["drawn"]]


def test_control_a_page_leaving_the_text_to_reacts_render_task_has_not_drawn_it_by_then(page: Page, app):
    page.route("**/public/serving-lab.js", serve_tap_drawing_later)
    pieces = drawn_by_next_task(page, app)
    late = [piece["word"] for piece in pieces if not piece["drawn"]]
    assert len(late) >= len(pieces) // 2, pieces


# After the page loaded: the tap's store answers every view that has started listening with one more
# word in its text, as if a piece had come between the render that mounted the view and its listening.
# The log says in what order the view listened, the page received frames, and that word was drawn.
CATCH_UP_JS = """() => {
  const live = window.ServingLab.live;
  const subscribe = live.subscribe, text = live.text;
  const listening = new Set();
  window.__catchUp = [];
  live.subscribe = (id, listener) => {
    listening.add(id);
    window.__catchUp.push(["listening", id]);
    return subscribe(id, listener);
  };
  live.text = (id) => {
    const now = text(id);
    return listening.has(id) ? (now === undefined ? "" : now + " ") + "caughtup" + id.replace(/-/g, "") : now;
  };
  new MutationObserver((records) => {
    for (const record of records) {
      const found = (record.type === "characterData" ? record.target.data : record.target.textContent || "")
        .match(/caughtup[0-9a-f]+/g);
      for (const word of found || []) window.__catchUp.push(["drawn", word]);
    }
  }).observe(document.body, {subtree: true, childList: true, characterData: true});
}"""
FRAME_LOG_JS = socket_messages_js("""(data) => {
  if (window.__catchUp && data.startsWith("4")) window.__catchUp.push(["frame", data.slice(0, 24)]);
}""")


def test_a_piece_that_came_before_the_view_listened_is_drawn_as_it_starts_listening(page: Page, app):
    page.add_init_script(FRAME_LOG_JS)
    open_chat(page, app)
    page.evaluate(CATCH_UP_JS)
    send(page, "count for me")
    page.locator('[data-testid="metrics"][data-state="completed"]').first.wait_for(timeout=REPLY_TIMEOUT_S * 1000)
    log = page.evaluate("() => window.__catchUp")
    drawn = [word for kind, word in log if kind == "drawn"]
    assert drawn, "the reply's view never drew the piece it had missed"
    reply = drawn[0].removeprefix("caughtup")
    listening = next(i for i, (kind, id_) in enumerate(log) if kind == "listening" and id_.replace("-", "") == reply)
    # Drawn before the page handled any frame after the view began to listen: not on later news.
    after = [kind for kind, _ in log[listening + 1:] if kind in ("frame", "drawn")]
    assert after[0] == "drawn", log[listening:listening + 6]
