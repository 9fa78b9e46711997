"""The page's own script (public/serving-lab.js) in chromium, against a socket and a fetch it cannot
tell from real ones: what reaches Chainlit's handler, in which task, and what goes to the network.

- A reply starts with several of Chainlit's events in a row (task_start, the run step, the message),
  each of which made Chainlit draw the whole chat again (12-22 ms each with ten replies on the
  page). On a tapped page the script hands them to Chainlit in one task, ending at the assistant's
  message or an element, so React draws them once. Controls: a page the app has not answered gets
  every frame in its own task, and any other event hands over what is held first, in order.
- Chainlit fetches the custom element's stand-in (public/elements/Metrics.jsx) each time it mounts
  one, and draws the element only when the answer is in; the script answers from the first copy.
"""

from __future__ import annotations

from pathlib import Path

import pytest

SCRIPT = (Path(__file__).parent.parent / "public" / "serving-lab.js").read_text(encoding="utf-8")

# A WebSocket whose frames the test dispatches, one per task (`__dispatch`); Chainlit's handler is
# `onmessage`, as engine.io-client sets it, and it logs each frame's kind and the task it ran in
# (null: a task the test did not start, the script's timer).
FAKE_SOCKET_JS = """
window.__log = [];
window.__task = null;
window.WebSocket = class FakeSocket extends EventTarget {
  constructor(url) { super(); this.url = url; window.__socket = this; }
  send() {}
  close() {}
};
window.__dispatch = (frames, gapMs) => new Promise((resolve) => {
  let i = 0;
  const next = () => {
    if (i === frames.length) { setTimeout(resolve, 150); return; }
    window.__task = i + 1;
    window.__socket.dispatchEvent(new MessageEvent("message", {data: frames[i++]}));
    window.__task = null;
    setTimeout(next, gapMs);
  };
  next();
});
"""

OPEN_JS = """
() => {
  const socket = new WebSocket("ws://127.0.0.1:1/ws/socket.io/");
  socket.onmessage = (event) => window.__log.push([JSON.parse(event.data.slice(2))[0], window.__task]);
}
"""

ACK = '42["lab_live_ack",{}]'
TASK_START = '42["task_start"]'
RUN_STEP = '42["new_message",{"id":"r1","type":"run","name":"on_message","output":""}]'
LIVE = '42["lab_live",{"id":"e1","props":{"state":"starting"}}]'
MESSAGE = '42["new_message",{"id":"m1","type":"assistant_message","output":"","parentId":"r1"}]'
ELEMENT = '42["element",{"id":"e1","forId":"m1","type":"custom","name":"Metrics","props":{}}]'
TEXT = '42["lab_text",{"id":"e1","for":"m1","text":"Hello"}]'
RUN_UPDATE = '42["update_message",{"id":"r1","type":"run","name":"on_message","output":""}]'

pytestmark = pytest.mark.slow


def blank(page) -> None:
    """An empty page at an origin of its own (the tap's offer is a window message to its origin)."""
    page.route("http://serving-lab.test/**", lambda route: route.fulfill(
        status=200, content_type="text/html", body="<html><head></head><body></body></html>"))
    page.goto("http://serving-lab.test/")


def handled(page, frames: list[str], gap_ms: int = 5) -> list[list]:
    blank(page)
    page.add_script_tag(content=FAKE_SOCKET_JS)
    page.add_script_tag(content=SCRIPT)
    page.evaluate(OPEN_JS)
    page.evaluate("(args) => window.__dispatch(args.frames, args.gap)", {"frames": frames, "gap": gap_ms})
    return page.evaluate("window.__log")


def test_a_tapped_page_hands_a_reply_s_start_to_chainlit_in_one_task_in_order(page):
    log = handled(page, [ACK, TASK_START, RUN_STEP, LIVE, MESSAGE, TEXT])
    assert log == [["lab_live_ack", 1], ["task_start", 5], ["new_message", 5], ["lab_live", 5],
                   ["new_message", 5], ["lab_text", 6]]


def test_an_element_ends_a_reply_s_start_too(page):
    log = handled(page, [ACK, TASK_START, RUN_STEP, MESSAGE, ELEMENT, TEXT])
    # The message does already: the element that follows it is handed over in its own task.
    assert log == [["lab_live_ack", 1], ["task_start", 4], ["new_message", 4], ["new_message", 4],
                   ["element", 5], ["lab_text", 6]]
    log = handled(page, [ACK, TASK_START, RUN_STEP, ELEMENT, TEXT])
    assert log == [["lab_live_ack", 1], ["task_start", 4], ["new_message", 4], ["element", 4], ["lab_text", 5]]


def test_control_a_page_the_app_has_not_answered_gets_every_frame_in_its_own_task(page):
    log = handled(page, [TASK_START, RUN_STEP, LIVE, MESSAGE, TEXT])
    assert log == [["task_start", 1], ["new_message", 2], ["lab_live", 3], ["new_message", 4], ["lab_text", 5]]


def test_another_event_hands_over_what_is_held_first_in_order(page):
    log = handled(page, [ACK, TASK_START, RUN_STEP, RUN_UPDATE, MESSAGE])
    assert log == [["lab_live_ack", 1], ["task_start", 4], ["new_message", 4], ["update_message", 4],
                   ["new_message", 5]]


def test_a_start_that_never_ends_is_handed_over_by_the_timer(page):
    log = handled(page, [ACK, TASK_START, RUN_STEP])
    assert log == [["lab_live_ack", 1], ["task_start", None], ["new_message", None]]


# A fetch that answers the stand-in's source and counts what reached it.
FAKE_FETCH_JS = """
window.__fetches = [];
window.__failFirst = %s;
window.fetch = (input, init) => {
  window.__fetches.push([typeof input === "string" ? input : input.url, (init && init.method) || "GET"]);
  const fail = window.__failFirst && window.__fetches.length === 1;
  return Promise.resolve(new Response(fail ? "gone" : "the stand-in", {status: fail ? 404 : 200}));
};
"""

STAND_IN = "http://127.0.0.1:1/public/elements/Metrics.jsx"


def fetched(page, calls: list[list[str]], fail_first: bool = False) -> tuple[list, list]:
    blank(page)
    page.add_script_tag(content=FAKE_FETCH_JS % ("true" if fail_first else "false"))
    page.add_script_tag(content=SCRIPT)
    answers = page.evaluate("""async (calls) => {
      const answers = [];
      for (const [url, method] of calls) {
        const response = await window.fetch(url, {method, credentials: "include"});
        answers.push([response.status, await response.text()]);
      }
      return answers;
    }""", calls)
    return answers, page.evaluate("window.__fetches")


def test_the_stand_in_is_fetched_once_a_page_and_answered_from_memory_after(page):
    answers, fetches = fetched(page, [[STAND_IN, "GET"]] * 3)
    assert answers == [[200, "the stand-in"]] * 3
    assert fetches == [[STAND_IN, "GET"]]


def test_control_other_requests_and_a_failed_read_go_to_the_network_each_time(page):
    other = "http://127.0.0.1:1/project/settings"
    answers, fetches = fetched(page, [[other, "GET"], [other, "GET"], [STAND_IN, "POST"], [STAND_IN, "POST"]])
    assert len(fetches) == 4 and [status for status, _ in answers] == [200] * 4
    answers, fetches = fetched(page, [[STAND_IN, "GET"], [STAND_IN, "GET"], [STAND_IN, "GET"]], fail_first=True)
    assert answers == [[404, "gone"], [200, "the stand-in"], [200, "the stand-in"]]
    assert len(fetches) == 2
