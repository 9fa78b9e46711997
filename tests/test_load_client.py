"""The load test's Chainlit client: protocol parsing on recorded events, then the real app.

Recordings (tests/recordings/, written by `python -m load.chainlit_client URL
-m TEXT --record FILE` against the real app on chainlit 2.12.0):
- chainlit-2.12-paced-two-replies.json: a chat opened on the paced test server
  (30 tokens per reply at 50 tokens/s), two messages, two whole replies;
- chainlit-2.12-backend-down.json: the only backend is down; the chat opens
  and the message gets the app's "could not answer" message;
- chainlit-2.12-llamacpp-queued.json: the embedded llama.cpp model, the third
  of three students asking at once: its place in the queue goes 2, 1, then
  the reply streams.

The slow tests start the app against the paced server and drive it with the
sync client (in threads; long-polling where `websocket-client` is missing, as
in the app's venv) and the asyncio client (websocket over aiohttp).
"""

from __future__ import annotations

import copy
import json
import re
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from core.texts import STRINGS
from core.figures import live_props
from load.chainlit_client import (
    ERROR_MARKERS,
    LIVE_TEXT,
    SENT_MESSAGE,
    AsyncChainlitClient,
    ChainlitClient,
    ChatTracker,
    browser_auth,
    replay,
    settings_form,
    user_message,
)
from servers.app import AppServer, backend_env
from servers.paced_openai import PacedServer
from tests.fixtures_app import closed_loopback_url
from core.timing import LiveFigures

RECORDINGS = Path(__file__).parent / "recordings"
MARKER = re.compile(r"pacedend\d+x[0-9a-f]+$")


def recording(name: str) -> list[dict]:
    return json.loads((RECORDINGS / name).read_text(encoding="utf-8"))


def paced_reply_text(tokens: int, marker: str) -> str:
    """What the paced server streams (servers/paced_openai.py `reply_tokens`)."""
    return "".join(f" w{i}" for i in range(1, tokens)) + f" {marker}"


# ---------------------------------------------------------------- recorded events


def test_chat_is_ready_when_on_chat_start_ends_not_at_the_first_task_end():
    events = recording("chainlit-2.12-paced-two-replies.json")
    tracker, _ = replay(events)
    # connection_successful answers task_end before on_chat_start even begins.
    assert events[0]["event"] == "task_end"
    chat_start_end = next(e["at_s"] for e in events if e["event"] == "update_message"
                          and e["data"].get("name") == "on_chat_start")
    assert tracker.ready_at_s > events[0]["at_s"]
    assert tracker.ready_at_s >= chat_start_end
    assert any(text.startswith("**Backends**") for text in tracker.startup_messages.values())
    assert [w["id"] for w in tracker.settings_widgets][:1] == ["backend"]


def test_recorded_replies_are_complete_with_ordered_times():
    events = recording("chainlit-2.12-paced-two-replies.json")
    _, records = replay(events)
    assert len(records) == 2
    for record in records:
        assert record.outcome == "replied" and record.ok and record.error is None
        marker = MARKER.search(record.text).group(0)
        assert record.text == paced_reply_text(30, marker)
        assert record.sent_at_s < record.task_started_at_s <= record.first_token_at_s
        assert record.first_token_at_s < record.final_update_at_s <= record.completed_at_s
        assert 0 < record.first_token_s < record.reply_s
        assert not record.queued and record.notes == []
        # The reply's final figures, as the app measured it: 30 tokens at 50 tokens/s.
        assert record.output_tokens == 30 and record.ms_per_token == pytest.approx(20.0, abs=0.5)
    # The first text arrives inside stream_start, not in a stream_token.
    first_stream_start = next(e for e in events if e["event"] == "stream_start")
    assert records[0].first_token_at_s == first_stream_start["at_s"]
    assert records[0].text.startswith(first_stream_start["data"]["output"])


def test_a_reply_by_the_live_tap_is_recorded_as_the_same_reply_by_chainlits_stream():
    """A tab that took the app's live tap gets the text as `lab_text` events instead of `stream_start`
    and `stream_token` (ui/live_tap.py): the same replies, texts and times come out."""
    events = recording("chainlit-2.12-paced-two-replies.json")
    tapped = []
    for event in events:
        name, data = event["event"], event["data"]
        if name == "stream_start":
            tapped.append({**event, "event": "new_message", "data": {**data, "output": ""}})
            tapped.append({**event, "event": LIVE_TEXT, "data": {"id": "figures", "for": data["id"],
                                                                  "text": data["output"]}})
        elif name == "stream_token":
            tapped.append({**event, "event": LIVE_TEXT, "data": {"id": "figures", "for": data["id"],
                                                                  "text": data["token"]}})
        else:
            tapped.append(event)
    assert [e for e in tapped if e["event"] in ("stream_start", "stream_token")] == []
    _, expected = replay(events)
    _, records = replay(tapped)
    assert [record.as_dict() for record in records] == [record.as_dict() for record in expected]
    assert [record.outcome for record in records] == ["replied", "replied"]


def test_the_apps_error_message_is_an_error_not_a_reply():
    tracker, [record] = replay(recording("chainlit-2.12-backend-down.json"))
    assert tracker.chat_ready
    assert record.outcome == "error" and not record.ok
    assert "could not answer" in record.error and "not reachable" in record.error
    assert record.text == "" and record.first_token_s is None and record.reply_s is not None


def test_error_markers_match_the_apps_error_title_in_both_languages():
    for lang, strings in STRINGS.items():
        title = strings["error_title"].format(backend="X")
        assert any(marker in title for marker in ERROR_MARKERS), lang


def _with_queue(positions: list[int]) -> list[dict]:
    """The paced recording's first reply, with queue figures (built by the app's own code) before its text."""
    events = copy.deepcopy(recording("chainlit-2.12-paced-two-replies.json"))
    stream_start = next(i for i, e in enumerate(events) if e["event"] == "stream_start")
    element = next(e for e in events[:stream_start] if e["event"] == "element")
    at_s = events[stream_start]["at_s"]
    queued = []
    for position in positions:
        figures = LiveFigures(elapsed_s=0.1, first_token_s=None, output_tokens=0, decode_tokens_per_s=None,
                              queue_position=position, tokens_exact=True)
        data = {**element["data"], "props": live_props(figures, backend="b", model="m", lang="en")}
        queued.append({"at_s": at_s, "event": "element", "data": data})
    return events[:stream_start] + queued + events[stream_start:]


def test_a_queued_reply_records_its_places_then_streams():
    _, [record] = replay(recording("chainlit-2.12-llamacpp-queued.json"))
    assert record.queue_positions == [2, 1] and record.queue_moved
    assert record.outcome == "replied" and record.text.strip()
    assert record.first_token_s > 1.0  # it waited for two replies ahead of it


def test_queue_places_are_recorded_and_moving_is_told_from_stuck():
    _, records = replay(_with_queue([3, 3, 2, 1]))
    assert records[0].queue_positions == [3, 2, 1]
    assert records[0].queued and records[0].queue_moved and records[0].ok
    assert not records[1].queued
    _, stuck = replay(_with_queue([2, 2, 2]))
    assert stuck[0].queue_positions == [2] and not stuck[0].queue_moved


def test_events_of_other_messages_do_not_leak_into_the_reply():
    events = recording("chainlit-2.12-paced-two-replies.json")
    sent = [i for i, e in enumerate(events) if e["event"] == SENT_MESSAGE]
    tracker, records = replay(events[:sent[1] + 1])  # the second message is in flight
    stale = {"id": str(uuid.uuid4()), "parentId": str(uuid.uuid4()), "type": "assistant_message",
             "output": "⚠️ **Old** could not answer.", "isError": False}
    tracker.handle("new_message", stale, 100.0)
    tracker.handle("task_start", {}, 100.1)
    tracker.handle("task_end", {}, 100.2)  # e.g. after a reconnect: no on_message step for our message yet
    assert not records[1].done and records[1].error is None
    replay(events[sent[1] + 1:], tracker)
    assert records[1].outcome == "replied" and records[1].error is None


def test_a_lost_socket_ends_the_reply_as_disconnected():
    events = recording("chainlit-2.12-paced-two-replies.json")
    first_token = next(i for i, e in enumerate(events) if e["event"] == "stream_token")
    tracker, [record, *_] = replay(events[:first_token + 1])
    tracker.handle("disconnect", "transport close", 50.0)
    assert record.outcome == "disconnected" and record.first_token_s is not None
    assert record.completed_at_s is None and record.reply_s is None


def test_a_failing_handler_is_an_error_even_without_a_message():
    """on_message raising shows only in its run step (isError); no message says so."""
    tracker = ChatTracker()
    tracker.handle("task_start", {}, 0.0)
    tracker.handle("task_end", {}, 0.1)
    record = tracker.start_reply("hi", "m1", 1.0)
    tracker.handle("task_start", {}, 1.01)
    step = {"id": "run1", "name": "on_message", "type": "run", "parentId": "m1", "isError": False, "output": ""}
    tracker.handle("new_message", step, 1.02)
    tracker.handle("new_message", {"id": "a1", "parentId": "run1", "type": "assistant_message", "output": ""}, 1.03)
    tracker.handle("update_message", {**step, "isError": True, "output": "[Errno 2] No such file"}, 1.04)
    tracker.handle("task_end", {}, 1.05)
    assert record.outcome == "error" and "No such file" in record.error


def test_the_message_and_the_auth_are_what_the_browser_sends():
    payload = user_message("hello", "http://127.0.0.1:9/")
    step = payload["message"]
    assert payload["fileReferences"] == []
    assert uuid.UUID(step["id"]).version == 4  # the server asserts this
    assert step["type"] == "user_message" and step["output"] == "hello" and step["threadId"] == ""
    assert step["createdAt"].endswith("Z") and step["metadata"] == {"location": "http://127.0.0.1:9/"}
    auth = browser_auth("s1")
    assert auth == {"clientType": "webapp", "sessionId": "s1", "threadId": "", "userEnv": "{}", "chatProfile": ""}


def test_settings_form_sends_every_value_and_refuses_unknown_backends():
    tracker, _ = replay(recording("chainlit-2.12-paced-two-replies.json"))
    form = settings_form(tracker.settings_widgets, backend="paced")
    assert form["backend"] == "paced" and form["temperature"] == 0.7 and form["system_preset"] == "helpful"
    with pytest.raises(ValueError, match="the app has: paced"):
        settings_form(tracker.settings_widgets, backend="vllm")
    with pytest.raises(ValueError, match="no setting 'colour'"):
        settings_form(tracker.settings_widgets, colour="red")


# ---------------------------------------------------------------- the real app


@pytest.fixture(scope="module")
def load_app(app_factory, paced_server: PacedServer) -> AppServer:
    env = {
        "BACKENDS": "paced,down",
        "DEFAULT_BACKEND": "paced",
        **backend_env("paced", kind="openai", base_url=paced_server.base_url, label="Paced"),
        **backend_env("down", kind="openai", base_url=closed_loopback_url(), label="Down", connect_timeout_s="2"),
    }
    return app_factory(env, name="chainlit-load-client-tests")


@pytest.mark.slow
def test_three_users_get_every_reply_whole(load_app: AppServer, paced_server: PacedServer):
    paced_server.set_pace(rate_tokens_per_s=100, tokens=40)

    def student(number: int) -> list:
        with ChainlitClient(load_app.url) as client:
            client.open_chat(timeout_s=60)
            return [client.ask(f"student {number} question {turn}", timeout_s=60) for turn in (1, 2)]

    with ThreadPoolExecutor(max_workers=3) as pool:
        records = [record for replies in pool.map(student, range(3)) for record in replies]

    markers = {r["marker"]: r["last_user_text"] for r in paced_server.requests()}
    assert len(records) == 6
    for record in records:
        assert record.outcome == "replied", (record.outcome, record.error)
        marker = MARKER.search(record.text).group(0)
        assert record.text == paced_reply_text(40, marker)
        assert markers[marker] == record.prompt  # each reply answers its own message
        assert record.sent_at_s < record.first_token_at_s <= record.final_update_at_s <= record.completed_at_s
        assert record.first_token_s < 15.0  # a safety bound: ~0.1 s here when idle, seconds under load
        assert record.output_tokens == 40 and 5.0 < record.ms_per_token < 100.0  # the app's own final figures


@pytest.mark.slow
def test_switching_to_a_down_backend_gives_an_error_then_back_a_reply(load_app: AppServer):
    with ChainlitClient(load_app.url) as client:
        client.open_chat(timeout_s=60)
        assert "Down" in client.change_settings(backend="down")
        failed = client.ask("hello", timeout_s=30)
        assert failed.outcome == "error" and "could not answer" in failed.error
        client.change_settings(backend="paced")
        assert client.ask("hello again", timeout_s=30).outcome == "replied"


@pytest.mark.slow
async def test_the_asyncio_client_gets_a_whole_reply_over_a_websocket(load_app: AppServer):
    client = AsyncChainlitClient(load_app.url)
    try:
        await client.open_chat(timeout_s=60)
        transport = client.transport
        record = await client.ask("hello over a websocket", timeout_s=30)
    finally:
        await client.close()
    assert transport == "websocket"
    assert record.outcome == "replied" and MARKER.search(record.text)
