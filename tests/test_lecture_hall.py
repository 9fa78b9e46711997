"""Two app replicas behind a real nginx on one real PostgreSQL (scripts/lecture_hall.sh), driven
through the proxy with the project's socket.io client: both replicas serve, each browser sticks to
one (polling and websocket alike), a login made on one replica is valid on the other, a chat
written through one replica is the same history read through the other, and when a replica is
killed mid-reply its people reconnect to the other with their history, the reply it was writing
marked interrupted (never stored as complete), while the other replica's stream goes on.
The last test kills app-1: it stays last in this module.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections import Counter

import pytest
import requests

from core.replica import REPLICA_HEADER
from load.chainlit_client import ChainlitClient
from servers.app import stored
from tests.fixtures_hall import PASSWORDS, Hall, alive

pytestmark = pytest.mark.slow
REPLY_TIMEOUT_S = 60.0


def replica_of(response: requests.Response) -> str:
    return response.headers[REPLICA_HEADER]


def reply_after(thread: dict, prompt: str) -> dict:
    """The first assistant message after the person's message `prompt` in a stored thread."""
    messages = [step for step in thread["steps"] if "message" in step["type"]]
    asked = next(i for i, step in enumerate(messages) if step["type"] == "user_message" and step["output"] == prompt)
    return next(step for step in messages[asked + 1:] if step["type"] == "assistant_message")


def log_in(hall: Hall, user: str) -> tuple[requests.Session, str]:
    """A browser's cookie jar after logging in through the proxy, and the replica that checked the password."""
    browser = requests.Session()
    response = browser.post(hall.url + "/login", data={"username": user, "password": PASSWORDS[user]}, timeout=30)
    assert response.status_code == 200, response.text[:300]
    assert browser.cookies.get("access_token") and browser.cookies.get("lab_route")
    return browser, replica_of(response)


def log_in_on(hall: Hall, user: str, replica: str, tries: int = 40) -> requests.Session:
    """A login (through the proxy) whose route cookie sends this browser to `replica`."""
    for _ in range(tries):
        browser, landed = log_in(hall, user)
        if landed == replica:
            return browser
    raise AssertionError(f"{tries} logins never landed on {replica}")


def test_the_proxy_spreads_browsers_over_both_replicas_and_each_sticks_to_one(hall: Hall):
    landed = Counter()
    for _ in range(40):
        browser = requests.Session()
        first = browser.get(hall.url + "/auth/config", timeout=10)
        assert first.status_code == 200
        again = {replica_of(browser.get(hall.url + path, timeout=10))
                 for path in ("/auth/config", "/project/settings?language=en-US", "/health") * 3}
        assert again == {replica_of(first)}, "one browser's requests went to more than one replica"
        landed[replica_of(first)] += 1
    assert set(landed) == {"app-1", "app-2"}, landed


def test_each_replica_names_itself_and_its_state_goes_through_the_proxy_to_a_teacher_only(hall: Hall):
    for name, replica in hall.replicas.items():
        state = requests.get(replica.url + "/lab/state", timeout=10)
        assert state.status_code == 200 and state.json()["replica"] == name and state.json()["pid"] == replica.pid
        assert replica_of(state) == name
    through_proxy = requests.get(hall.url + "/lab/state", timeout=10)
    assert through_proxy.status_code == 403 and replica_of(through_proxy) in hall.replicas
    # Through the proxy, a teacher's login reads it (from whichever replica answers), a student's does not.
    teacher, _ = log_in(hall, "alice")
    student, _ = log_in(hall, "bob")
    as_teacher = teacher.get(hall.url + "/lab/state", timeout=10)
    assert as_teacher.status_code == 200 and as_teacher.json()["replica"] == replica_of(as_teacher)
    assert student.get(hall.url + "/lab/state", timeout=10).status_code == 403


def test_a_login_on_one_replica_is_valid_on_every_replica(hall: Hall):
    browser, checked_on = log_in(hall, "bob")
    token = browser.cookies["access_token"]
    for replica in hall.replicas.values():
        user = requests.get(replica.url + "/user", cookies={"access_token": token}, timeout=10)
        assert user.status_code == 200 and user.json()["identifier"] == "bob", (replica.name, user.text[:200])
        assert replica_of(user) == replica.name
    forged = requests.get(hall.replicas["app-2"].url + "/user", cookies={"access_token": token[:-4] + "AAAA"}, timeout=10)
    assert forged.status_code == 401


def test_a_chat_through_one_replica_is_the_same_history_through_the_other(hall: Hall):
    on_first = log_in_on(hall, "alice", "app-1")
    prompt = "Hall history check " + hall.logs.name
    with ChainlitClient(hall.url, http=on_first) as client:
        client.open_chat()
        assert client.transport == "websocket"  # upgraded from polling, on the same replica
        record = client.ask(prompt, REPLY_TIMEOUT_S)
    assert record.outcome == "replied" and record.text, record.as_dict()
    on_second = log_in_on(hall, "alice", "app-2")
    listed = on_second.post(hall.url + "/project/threads", json={"pagination": {"first": 20}, "filter": {}}, timeout=10)
    assert listed.status_code == 200 and replica_of(listed) == "app-2"
    threads = [t for t in listed.json()["data"] if prompt in (t.get("name") or "")]
    assert len(threads) == 1, listed.json()["data"]
    thread = on_second.get(f"{hall.url}/project/thread/{threads[0]['id']}", timeout=10)
    assert thread.status_code == 200 and replica_of(thread) == "app-2"
    reply = reply_after(thread.json(), prompt)
    assert reply["output"] == record.text and not reply["isError"]
    # The reply's own row (its figures) is in the one database too, complete.
    replies = asyncio.run(stored(hall.database_url, "replies_for_thread", threads[0]["id"]))
    assert [(r.prompt, r.reply_text, r.status) for r in replies] == [(prompt, record.text, "completed")]
    # Bob, on either replica, does not see Alice's chat.
    bob, _ = log_in(hall, "bob")
    theirs = bob.post(hall.url + "/project/threads", json={"pagination": {"first": 20}, "filter": {}}, timeout=10)
    assert all(prompt not in (t.get("name") or "") for t in theirs.json()["data"])


def _thread_of(browser: requests.Session, hall: Hall, prompt: str) -> dict:
    listed = browser.post(hall.url + "/project/threads", json={"pagination": {"first": 20}, "filter": {}}, timeout=10)
    assert listed.status_code == 200
    ids = [t["id"] for t in listed.json()["data"] if prompt in (t.get("name") or "")]
    assert len(ids) == 1, listed.json()["data"]
    thread = browser.get(f"{hall.url}/project/thread/{ids[0]}", timeout=10)
    assert thread.status_code == 200
    return thread.json()


def _stored_reply(browser: requests.Session, hall: Hall, chat: str, prompt: str) -> dict | None:
    """The stored reply to `prompt`, in the chat named by `chat` (its first prompt), as `browser`
    reads it now; None while there is none."""
    try:
        return reply_after(_thread_of(browser, hall, chat), prompt)
    except StopIteration:
        return None


def test_killing_a_replica_mid_reply(hall: Hall):
    alice_jar, bob_jar = log_in_on(hall, "alice", "app-1"), log_in_on(hall, "bob", "app-2")
    # Her chat read through the other replica, which cannot write what app-1 still has queued.
    alice_elsewhere = log_in_on(hall, "alice", "app-2")
    first_prompt, cut_prompt = "Before the fault " + hall.logs.name, "During the fault " + hall.logs.name
    alice = ChainlitClient(hall.url, http=alice_jar)
    bob = ChainlitClient(hall.url, http=bob_jar, record_events=True)
    try:
        alice.open_chat()
        bob.open_chat()
        first = alice.ask(first_prompt, REPLY_TIMEOUT_S)
        assert first.outcome == "replied"
        # A reply she saw end is in the database when its task ends (not a batch window later):
        # read at once, it is whole, and app-1 may die from here on without losing it.
        kept = _stored_reply(alice_elsewhere, hall, first_prompt, first_prompt)
        assert kept is not None and kept["output"] == first.text and "in_flight" not in str(kept.get("metadata")), kept
        cut = alice.send(cut_prompt)
        deadline = time.monotonic() + 30
        while cut.first_token_at_s is None and time.monotonic() < deadline:
            time.sleep(0.005)
        assert cut.first_token_at_s is not None and not cut.done, cut.as_dict()
        # Her message and its reply's in-flight mark were written as the reply showed, not a batch
        # window (100 ms) later: read as its first text arrives, the database knows it is under way.
        in_flight = _stored_reply(alice_elsewhere, hall, first_prompt, cut_prompt)
        assert in_flight is not None and "in_flight" in str(in_flight.get("metadata")) \
            and not in_flight["isError"], in_flight
        survivor = bob.send("A question on the other replica")
        while survivor.first_token_at_s is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert survivor.first_token_at_s is not None
        killed_at = time.perf_counter()
        os.kill(hall.replicas["app-1"].pid, signal.SIGKILL)
        # Alice's page: the socket is lost, the reply never completes.
        assert alice.wait_reply(15).outcome in ("disconnected", "timeout")
        assert alice.tracker.disconnected_at_s is not None
        # Bob's stream on app-2 goes on to its end, without a stall at the moment app-1 died.
        assert bob.wait_reply(REPLY_TIMEOUT_S).outcome == "replied" and survivor.output_tokens == 200
        # Text arrives in a stream_start (its first text) and then stream_token events.
        token_times = [survivor.first_token_at_s] + [at for at, event, _ in bob.events
                                                     if event == "stream_token" and at >= survivor.sent_at_s]
        gaps = [later - earlier for earlier, later in zip(token_times, token_times[1:])]
        assert token_times[0] < killed_at < token_times[-1], (token_times[0], killed_at, token_times[-1])
        # No stall a person would notice while app-1 died (the engine sends every 25 ms): a safety
        # bound only, which a loaded machine's late drawing stays far under.
        assert max(gaps) < 3.0, max(gaps)
    finally:
        alice.close()
        bob.close()
    assert not alive(hall.replicas["app-1"].pid)
    # Alice reconnects through the proxy: the same browser (cookies) now lands on app-2 and chats.
    landed = alice_jar.get(hall.url + "/auth/config", timeout=10)
    assert replica_of(landed) == "app-2"
    with ChainlitClient(hall.url, http=alice_jar) as again:
        again.open_chat()
        assert again.ask("After the fault", REPLY_TIMEOUT_S).outcome == "replied"
    # Her history is there, read through app-2; the cut reply says it was interrupted, as an error.
    thread = _thread_of(alice_jar, hall, first_prompt)
    assert reply_after(thread, first_prompt)["output"] == first.text
    interrupted = reply_after(thread, cut_prompt)
    assert interrupted["isError"]
    assert "Interrupted: the app process answering this (replica app-1) stopped" in interrupted["output"]
    assert "in_flight" not in (interrupted.get("metadata") or {})
    # The database keeps the first reply complete and no row at all for the cut one.
    replies = asyncio.run(stored(hall.database_url, "replies_for_thread", thread["id"]))
    assert [(r.prompt, r.status) for r in replies] == [(first_prompt, "completed")]
