"""A fair share of the engine: one student's flood puts at most one reply ahead of anyone else.

The embedded engine's queue serves people in turn (backends/llamacpp.py `TurnQueue`), checked on
its own; then, on the running app with login on and the real embedded model (held before its
first token by the test-only hold file, so the queue is seen as it is on any machine), attacked
from outside over Chainlit's socket protocol:

- alice floods from 4 chats; bob's message then waits behind one reply (alice's generating), not
  four; her fifth message (a chat replying already), and one over her replies' cap, are refused;
- alice opens chat after chat (200 tries): the 7th and later are refused with a message that
  says why, and the app's memory does not grow with them; bob still opens his;
- a reply whose chat was closed is cancelled and its queued work dropped.
"""

from __future__ import annotations

import json
import secrets
import time
import urllib.request
import uuid
from pathlib import Path

import psutil
import pytest
import requests

from core.auth import hash_password
from core.fair_share import Share, ShareLimits
from backends.llamacpp import TurnQueue
from config import ConfigurationError
import socketio

from load.chainlit_client import (SOCKET_PATH, ChainlitClient, browser_auth, browser_headers, settings_form,
                                  user_message)
from servers.app import AppServer

PASSWORDS = {"alice": "alice-" + secrets.token_hex(4), "bob": "bob-" + secrets.token_hex(4),
             "teacher": "teacher-" + secrets.token_hex(4)}
REPLY_TIMEOUT_S = 240.0


def order(queue: TurnQueue, tickets: dict[str, object]) -> list[str]:
    return sorted(tickets, key=lambda name: queue.position(tickets[name]))


def test_the_queue_serves_people_in_turn_not_first_come():
    queue = TurnQueue()
    tickets = {f"alice{n}": queue.join("alice") for n in range(1, 5)}
    assert queue.position(tickets["alice1"]) == 0  # generating
    tickets["bob1"] = queue.join("bob")
    tickets["carol1"] = queue.join("carol")
    tickets["bob2"] = queue.join("bob")
    assert order(queue, tickets) == ["alice1", "bob1", "carol1", "alice2", "bob2", "alice3", "alice4"]
    queue.leave(tickets.pop("alice1"))
    assert queue.position(tickets["bob1"]) == 0
    tickets["dave1"] = queue.join("dave")  # a newcomer waits behind nobody's second turn
    assert order(queue, tickets) == ["bob1", "carol1", "dave1", "alice2", "bob2", "alice3", "alice4"]


def test_first_come_is_what_one_person_alone_gets():
    """The control: with one person (or nobody in particular) the queue is first come, first served."""
    queue = TurnQueue()
    tickets = {f"r{n}": queue.join(None) for n in range(4)}
    assert order(queue, tickets) == ["r0", "r1", "r2", "r3"]
    alone = {f"a{n}": queue.join("alice") for n in range(3)}
    assert order(queue, {**tickets, **alone})[4:] == ["a0", "a1", "a2"]


def test_the_caps_count_per_person_and_per_chat():
    share = Share(ShareLimits(chats_per_person=2, replies_per_person=2))
    assert share.may_open("alice")
    share.opened("alice", "s1")
    share.opened("alice", "s2")
    assert not share.may_open("alice") and share.may_open("bob")
    share.closed("s1")
    assert share.may_open("alice")
    share.started("alice", "chat1")
    assert share.refusal("alice", "chat1") == "share_one_reply_per_chat"
    assert share.refusal("alice", "chat2") is None
    share.started("alice", "chat2")
    assert share.refusal("alice", "chat3") == "share_replies_per_person"
    assert share.refusal("bob", "chat4") is None
    share.ended("alice", "chat1")
    assert share.refusal("alice", "chat3") is None


def test_caps_come_from_the_environment_and_bad_ones_say_what_to_write():
    assert ShareLimits.from_env({}) == ShareLimits(6, 2)
    assert ShareLimits.from_env({"LAB_MAX_CHATS_PER_PERSON": "3", "LAB_MAX_REPLIES_PER_PERSON": "1"}) == ShareLimits(3, 1)
    with pytest.raises(ConfigurationError, match="LAB_MAX_CHATS_PER_PERSON='0'.*at least 1"):
        ShareLimits.from_env({"LAB_MAX_CHATS_PER_PERSON": "0"})


# ---------------------------------------------------------------- the running app, attacked


@pytest.fixture(scope="module")
def hold_file(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("hold") / "hold"


@pytest.fixture(scope="module")
def class_app(app_factory, hold_file, tmp_path_factory) -> AppServer:
    users = ",".join(f"{name}:{hash_password(password, iterations=1000)}" for name, password in PASSWORDS.items())
    return app_factory({"BACKENDS": "llama_cpp", "DEFAULT_SYSTEM_PROMPT": "none", "DEFAULT_MAX_NEW_TOKENS": "16",
                        "AUTH_USERS": users, "TEACHERS": "teacher", "CHAINLIT_AUTH_SECRET": secrets.token_urlsafe(32),
                        "LAB_MAX_REPLIES_PER_PERSON": "4", "LAB_MAX_CHATS_PER_PERSON": "6",
                        "LAB_TEST_EMBEDDED_HOLD_FILE": str(hold_file),
                        "DATABASE_URL": f"sqlite:///{tmp_path_factory.mktemp('share') / 'lab.db'}"},
                       name="chainlit-fair-share")


def logged_in(app: AppServer, user: str) -> requests.Session:
    browser = requests.Session()
    response = browser.post(app.url + "/login", data={"username": user, "password": PASSWORDS[user]}, timeout=30)
    assert response.status_code == 200, response.text[:300]
    return browser


def chat(app: AppServer, browser: requests.Session) -> ChainlitClient:
    client = ChainlitClient(app.url, http=browser, record_events=True)
    client.open_chat(timeout_s=120)
    return client


def said(client: ChainlitClient, fragment: str, timeout_s: float = 30.0) -> None:
    """Wait until the app said `fragment` in this chat (any message it sent)."""
    def found() -> bool:
        return any(fragment in json.dumps(data, ensure_ascii=False) for _, event, data in list(client.events)
                   if event == "new_message")
    wait_for(found, f"the message {fragment!r}", timeout_s)


def forged_send(client: ChainlitClient, text: str) -> None:
    """A message sent past the page (which disables sending while a reply streams), as a script would."""
    client._sio.emit("client_message", user_message(text, client.base_url + "/"))


def try_socket(app: AppServer, browser: requests.Session) -> tuple[socketio.Client | None, str]:
    """Open one chat socket as the page does; (the socket, "") or (None, why the app refused it)."""
    sio = socketio.Client(http_session=browser, reconnection=False)
    reasons: list[str] = []
    sio.on("connect_error", lambda data=None: reasons.append(json.dumps(data)))
    try:
        sio.connect(app.url, socketio_path=SOCKET_PATH, transports=["websocket"],
                    headers=browser_headers(app.url, "en-US"), auth=browser_auth(str(uuid.uuid4())),
                    wait_timeout=30)
    except socketio.exceptions.ConnectionError as error:
        return None, " ".join(reasons) or str(error)
    return sio, ""


def embedded(app: AppServer) -> dict:
    with urllib.request.urlopen(f"{app.url}/lab/state", timeout=10) as response:
        (model,) = json.loads(response.read())["embedded_models"].values()
    return model


def wait_for(condition, what: str, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"no {what} within {timeout_s:g} s"
        time.sleep(0.1)


@pytest.mark.slow
def test_alices_flood_from_four_chats_puts_one_reply_ahead_of_bob(class_app: AppServer, hold_file: Path):
    app = class_app
    alice_browser, bob_browser = logged_in(app, "alice"), logged_in(app, "bob")
    alices = [chat(app, alice_browser) for _ in range(5)]
    bob = chat(app, bob_browser)
    hold_file.touch()  # the first request keeps the model before its first token: the queue stands still
    try:
        floods = [client.send(f"flood {n}: write a long story") for n, client in enumerate(alices[:4])]
        wait_for(lambda: embedded(app)["generating"] + embedded(app)["waiting"] == 4, "four of alice's in the queue")
        forged_send(alices[0], "one more in a chat that is replying")
        said(alices[0], "still on its way in this chat")
        forged_send(alices[4], "a fifth reply at once")
        said(alices[4], "4 replies on their way")
        assert embedded(app)["generating"] + embedded(app)["waiting"] == 4  # neither reached the engine
        mine = bob.send("bob's question")
        wait_for(lambda: mine.queue_positions, "bob's place in the queue")
        assert mine.queue_positions[0] == 1, mine.queue_positions  # behind alice's first only, not her four
        teacher = chat(app, logged_in(app, "teacher"))
        teacher.send("/engines")
        wait_for(lambda: any('"alice 4 · bob 1"' in json.dumps(data, ensure_ascii=False)
                             for _, _, data in list(teacher.events)), "the teacher's queue by person")
        student_panel = bob.events
        teacher.close()
    finally:
        hold_file.unlink(missing_ok=True)
    bob.wait_reply(REPLY_TIMEOUT_S)
    assert mine.outcome == "replied", mine
    for client, record in zip(alices, floods):
        client.wait_reply(REPLY_TIMEOUT_S)
        assert record.outcome == "replied", record
    assert not any("queue by person" in json.dumps(data) for _, _, data in list(student_panel))
    # Served in turn: the one of alice's that held the engine, then bob's, then her other three.
    ahead = [record for record in floods if record.first_token_at_s < mine.first_token_at_s]
    assert len(ahead) == 1, [(record.prompt, record.first_token_at_s) for record in floods]
    for client in [*alices, bob]:
        client.close()


@pytest.mark.slow
def test_chat_after_chat_is_refused_past_the_cap_and_memory_stays_put(class_app: AppServer):
    app = class_app
    process = psutil.Process(app.process.process.pid)
    alice_browser = logged_in(app, "alice")
    wait_for(lambda: not any(embedded(app)[key] for key in ("generating", "waiting")), "an idle engine")
    opened, refused, reasons = [], 0, set()
    rss_before = process.memory_info().rss
    for _ in range(200):
        sio, reason = try_socket(app, alice_browser)
        if sio is None:
            refused += 1
            reasons.add(reason)
        else:
            opened.append(sio)
    grown_mb = (process.memory_info().rss - rss_before) / 2**20
    try:
        assert len(opened) == 6 and refused == 194, reasons
        assert any("6 chats open already" in reason for reason in reasons), reasons
        assert grown_mb < 60, f"the app grew {grown_mb:.0f} MB"
        teacher = chat(app, logged_in(app, "teacher"))  # another person is not held by alice's cap
        bob = chat(app, logged_in(app, "bob"))
        teacher.close()
        bob.close()
    finally:
        for sio in opened:
            sio.disconnect()
    # Once she closes them, she opens a chat again.
    wait_for(lambda: _opens(app, alice_browser), "a chat of alice's after she closed hers", timeout_s=30)


def _opens(app: AppServer, browser: requests.Session) -> bool:
    sio, _ = try_socket(app, browser)
    if sio is not None:
        sio.disconnect()
    return sio is not None


@pytest.mark.slow
def test_a_reply_whose_chat_was_closed_is_cancelled_and_its_queued_work_dropped(class_app: AppServer,
                                                                                 hold_file: Path):
    app = class_app
    browser = logged_in(app, "alice")
    wait_for(lambda: not any(embedded(app)[key] for key in ("generating", "waiting")), "an idle engine")
    first, second = chat(app, browser), chat(app, browser)
    hold_file.touch()
    try:
        first.send("held at its turn")
        second.send("queued behind it")
        wait_for(lambda: embedded(app)["generating"] + embedded(app)["waiting"] == 2, "both in the queue")
        first.close()
        second.close()
        # The control: within the grace a closed chat keeps its reply (a page may reconnect).
        assert embedded(app)["generating"] + embedded(app)["waiting"] == 2
        wait_for(lambda: embedded(app)["generating"] + embedded(app)["waiting"] == 0, "the queue emptied",
                 timeout_s=30)
    finally:
        hold_file.unlink(missing_ok=True)


@pytest.mark.slow
@pytest.mark.parametrize("action, payload", [("cache_lesson", {}), ("simulate", {"users": 999}),
                                             ("capacity_sweep", {}), ("class_fit", {})])
def test_a_teacher_only_action_refuses_a_student_before_it_says_anything_else(class_app: AppServer, action, payload):
    """The lesson is not configured, 999 users is not allowed: a teacher hears that (the control); a
    student hears only that the action is a teacher's."""
    answers = {}
    for user in ("alice", "teacher"):
        browser = logged_in(class_app, user)
        client = chat(class_app, browser)
        try:
            response = browser.post(f"{class_app.url}/project/action", timeout=60, json={
                "sessionId": client.session_id, "action": {"name": action, "payload": payload}})
            assert response.ok, response.text
            answers[user] = response.json()["response"]["message"]
        finally:
            client.close()
    assert answers["alice"].startswith("Only a teacher may start load"), answers
    if action in ("cache_lesson", "simulate"):
        assert not answers["teacher"].startswith("Only a teacher"), answers


@pytest.mark.slow
def test_settings_keys_the_panel_does_not_have_are_dropped_before_they_are_kept(class_app: AppServer):
    """The attack: 100 settings changes, each with a 2 MB key of its own, grew the app by 200 MB for
    the session's life. Only the panel's fields are kept now (the others by name, to say so); a
    clean change still applies (the control)."""
    app = class_app
    process = psutil.Process(app.process.process.pid)
    client = chat(app, logged_in(app, "bob"))
    try:
        rss_before = process.memory_info().rss
        for n in range(100):
            values = {**settings_form(client.tracker.settings_widgets, temperature=0.3), f"junk{n}": "x" * 2_000_000}
            answer = client.emit_for_message("chat_settings_change", values, timeout_s=60)
            assert f"unknown setting(s) junk{n}" in answer, answer[:300]
        grown_mb = (process.memory_info().rss - rss_before) / 2**20
        assert grown_mb < 60, f"the app grew {grown_mb:.0f} MB"
        answer = client.emit_for_message("chat_settings_change",
                                         settings_form(client.tracker.settings_widgets, temperature=0.3))
        assert "0.3" in answer and "unknown" not in answer, answer[:300]
    finally:
        client.close()
