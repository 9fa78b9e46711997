"""Blind is per person, in a real browser: a blind round in one tab, and every view in another tab
(and in a new tab, and on another replica) of the same person waits until the vote.

Two paced OpenAI-protocol servers stand in for two engines with distinctive names, labels and
addresses (kind vllm: each serves /metrics, so the engine panel would show which one runs), plus a
configured backend that is down (so the settings panel would mark it "unavailable"). While the
round of tab 1 runs, tab 2 tries the engine panel, /status, a chat reply from one of the round's
backends, and a new tab opens. Every socket.io frame the other tabs receive from then on is scanned
for each name, label, model id and address of the round's backends (the settings panel's
`chat_settings` frames too, less its list of configured backends, which names no column: an entry
with a health mark added is found by the names in it), and for engine figures (an engine panel with engines, an engine state at a reply's
start, a queue position); so are the steps the other tabs show. Then the person insists ("Send
anyway"): the reply comes, and the round's vote is kept but not rated. Login off (one browser: the
rule follows its id cookie); and login on, two replicas on PostgreSQL, a tab on each, with a
classmate on the second replica kept from the engines' live load while the round is open.
"""

from __future__ import annotations

import json
import re
import secrets
import time

import pytest
from playwright.sync_api import Page, expect

from core.auth import hash_password
from servers.app import backend_env, run_coroutine, stored
from servers.paced_openai import start_paced_server
from store.records import UNRATED_SHOWN_BEFORE_VOTE
from tests.browser_frames import collect_frames, drain_frames, events
from tests.fixtures_app import closed_loopback_url
from tests.fixtures_postgres import new_postgres_database
from tests.test_compare_browser import SNAPSHOT_JS, change_settings, send
from tests.test_reports_browser import log_in

pytestmark = pytest.mark.slow

NAMES = {"alpha_engine": "Alpha Engine", "beta_engine": "Beta Engine"}
WAITS = "waits until you have voted"
READY_TIMEOUT_MS = 120_000
PASSWORDS = {"alice": "alice-" + secrets.token_hex(4), "bob": "bob-" + secrets.token_hex(4),
             "teach": "teach-" + secrets.token_hex(4)}


@pytest.fixture(scope="module")
def engines():
    """Two engines slow enough that a sequential round of both lasts ~20 s: long enough to try every
    view in another tab while a column streams."""
    servers = []
    try:
        for side in ("alpha", "beta"):
            servers.append(start_paced_server(rate_tokens_per_s=20, tokens=200, name=f"paced-blind-tabs-{side}"))
        yield servers
    finally:
        for server in servers:
            server.stop()


def app_env(engines, database_url: str, **more: str) -> dict[str, str]:
    alpha, beta = engines
    return {
        "BACKENDS": "alpha_engine,beta_engine,down",
        **backend_env("alpha_engine", kind="vllm", base_url=alpha.base_url, label=NAMES["alpha_engine"]),
        **backend_env("beta_engine", kind="vllm", base_url=beta.base_url, label=NAMES["beta_engine"]),
        **backend_env("down", kind="openai", base_url=closed_loopback_url(), label="Down server", connect_timeout_s="2"),
        "DEFAULT_SYSTEM_PROMPT": "none", "DEFAULT_COMPARE_BACKENDS": "alpha_engine,beta_engine",
        "DEFAULT_BACKEND": "alpha_engine", "DEFAULT_MODE": "chat", "DEFAULT_RUN_ORDER": "sequential",
        "DEFAULT_TEMPERATURE": "0", "DATABASE_URL": database_url, **more,
    }


def secret_words(engines) -> list[str]:
    """What would name a column: each backend's name, label, model id and address."""
    return [*NAMES, *NAMES.values(), "paced-test-model",
            *(re.sub(r"^https?://", "", server.root_url) for server in engines)]


def configured_list(backends: dict[str, str] | None = None) -> list[str]:
    """The settings panel's entries for the configured backends, exactly as the panel lists every one
    of them whatever the round (`Label (name)`, ui/session_view.py), then their bare names (the
    widgets' values and selections): the same in every tab, naming no column."""
    backends = backends or {**NAMES, "down": "Down server"}
    return [f"{label} ({name})" for name, label in backends.items()] + list(backends)


def without_configured_list(frame: str, entries: list[str]) -> str:
    """A `chat_settings` frame with the configured list taken out: each entry as a whole JSON string
    (or a selection of bare names, in a JSON list). An entry with anything added (a health mark:
    "Label (name) · unavailable") is no longer the entry and stays, for the scan to find."""
    for entry in entries:
        frame = frame.replace(json.dumps(entry), '""')
    return frame


def leaks(frames: list[str], words: list[str], entries: list[str] | None = None) -> list[str]:
    """Each word of `words` in a frame, with its excerpt. The settings panel's frames are scanned too,
    less the list of configured backends (`configured_list`, the same for every round)."""
    entries = configured_list() if entries is None else entries
    found = []
    for frame in frames:
        if frame.lstrip("0123456789").startswith('["chat_settings"'):
            frame = without_configured_list(frame, entries)
        lowered = frame.lower()
        for word in words:
            at = lowered.find(word.lower())
            if at >= 0:
                found.append(f"{word!r} in {frame[max(0, at - 80):at + 80]!r}")
    return found


def figures(frames: list[str]) -> list[str]:
    """Engine figures in `frames`: an engine panel with any engine, an engine's state at a reply's start,
    a queue position, or a health mark in the settings panel."""
    found = []

    def walk(value, where: str) -> None:
        if isinstance(value, dict):
            if value.get("engines"):
                found.append(f"engine panel figures in {where}")
            if value.get("engineAtStart"):
                found.append(f"engine at start {value['engineAtStart']!r} in {where}")
            if value.get("queuePosition"):
                found.append(f"queue position {value['queuePosition']!r} in {where}")
            for key, inner in value.items():
                if key == "props" and isinstance(inner, str):
                    try:
                        inner = json.loads(inner)
                    except ValueError:
                        pass
                walk(inner, where)
        elif isinstance(value, list):
            for inner in value:
                walk(inner, where)

    for name, args in events(frames):
        walk(args, name)
        if name == "chat_settings" and "unavailable" in json.dumps(args):
            found.append("an 'unavailable' mark in the settings panel")
    return found


def new_steps_text(page: Page, count_before: int) -> str:
    return "\n".join(page.evaluate(
        "(n) => [...document.querySelectorAll('.step')].slice(n).map(s => s.innerText)", count_before))


def round_snapshot(page: Page) -> dict | None:
    return page.evaluate(SNAPSHOT_JS, False)


def wait_round_streaming(page: Page, timeout_s: float = 60) -> None:
    """Until the page shows its blind round with some column generating (not final)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        snapshot = round_snapshot(page)
        if snapshot and not snapshot["final"] and snapshot["blind"]:
            return
        time.sleep(0.1)
    raise AssertionError("the blind round did not start")


def wait_round_final(page: Page, timeout_s: float = 120) -> dict:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        snapshot = round_snapshot(page)
        if snapshot and snapshot["final"]:
            return snapshot
        time.sleep(0.2)
    raise AssertionError("the blind round did not end")


def ready(page: Page) -> None:
    """The chat has started: its backends step is shown (their status, or that it waits)."""
    expect(page.locator('.step[data-step-type="assistant_message"]', has_text="Backends").first).to_be_visible(
        timeout=READY_TIMEOUT_MS)


def waits_for(page: Page, command: str) -> None:
    before = page.locator(".step", has_text=WAITS).count()
    send(page, command)
    expect(page.locator(".step", has_text=WAITS)).to_have_count(before + 1, timeout=30_000)


def start_blind_round(page: Page, prompt: str) -> None:
    change_settings(page, mode="Blind comparison (vote first)")
    send(page, prompt)
    wait_round_streaming(page)


def try_every_view(tab: Page) -> None:
    """The engine panel, /status and a chat reply from one of the round's backends: each waits."""
    waits_for(tab, "/engines")
    waits_for(tab, "/status")
    before = tab.locator(".step", has_text="Your message waits").count()
    send(tab, "Tell me about the sea.")
    expect(tab.locator(".step", has_text="Your message waits")).to_have_count(before + 1, timeout=30_000)
    expect(tab.get_by_role("button", name="Send anyway").last).to_be_visible()


def test_a_blind_round_in_one_tab_holds_every_view_in_the_other_tabs_of_that_browser(
        chromium, app_factory, engines, tmp_path):
    app = app_factory(app_env(engines, f"sqlite:///{tmp_path / 'lab.db'}"), name="chainlit-blind-tabs")
    words = secret_words(engines)
    context = chromium.new_context(locale="en-US", viewport={"width": 1400, "height": 1000})
    try:
        tab1, tab2 = context.new_page(), context.new_page()
        frames2 = collect_frames(tab2)
        for tab in (tab1, tab2):
            tab.goto(app.url)
            ready(tab)
        # Before any round, tab 2's own chat start showed the models and marked the down backend:
        # what the scans below must not find again is really there to find.
        before = drain_frames(tab2, frames2)
        assert leaks(before, ["paced-test-model"]), "tab 2's status before the round named no model"
        assert any("unavailable" in json.dumps(args) for name, args in events(before) if name == "chat_settings")
        # The settings scan finds a marked entry: the down backend's, by its label, before the round.
        settings_before = [frame for frame in before if frame.lstrip("0123456789").startswith('["chat_settings"')]
        assert leaks(settings_before, ["Down server"]) and not leaks(settings_before, words), leaks(settings_before, words)
        mark, steps_before = len(before), tab2.locator(".step").count()

        start_blind_round(tab1, "Describe the sea in one long paragraph.")
        try_every_view(tab2)
        assert not round_snapshot(tab1)["final"], "the round ended before every view was tried: nothing was tested"
        tab3 = context.new_page()  # a new tab while the round waits for its vote
        frames3 = collect_frames(tab3)
        tab3.goto(app.url)
        ready(tab3)
        expect(tab3.locator(".step", has_text=WAITS).first).to_be_visible()
        waits_for(tab3, "/engines")

        received2 = drain_frames(tab2, frames2, since=mark)
        received3 = drain_frames(tab3, frames3)
        for received in (received2, received3):
            assert not leaks(received, words), leaks(received, words)
            assert not figures(received), figures(received)
        assert any(name == "chat_settings" for name, _ in events(received3))  # scanned, and clean
        for shown in (new_steps_text(tab2, steps_before), new_steps_text(tab3, 0)):
            assert not [word for word in words if word.lower() in shown.lower()], shown

        # The person insists: the reply comes, and the round is no longer blind.
        tab2.get_by_role("button", name="Send anyway").last.click()
        expect(tab2.locator(".step", has_text="no longer count as blind").last).to_be_visible(timeout=30_000)
        expect(tab2.locator('[data-testid="metrics"][data-state="completed"]').last).to_be_visible(timeout=60_000)
        final = wait_round_final(tab1)
        assert final["blind"] and not final["revealed"]
        tab1.locator('[data-testid="vote-A"]').last.click()
        expect(tab1.locator(".step", has_text="Vote recorded").last).to_contain_text("kept but not rated")
    finally:
        context.close()
    (record,) = run_coroutine(stored(app.env["DATABASE_URL"], "votes"))
    assert record.vote.unrated_reason == UNRATED_SHOWN_BEFORE_VOTE and not record.rated


def test_two_replicas_on_postgresql_hold_the_person_and_keep_classmates_from_live_engine_load(
        chromium, app_factory, engines, postgres_url):
    database = run_coroutine(new_postgres_database(postgres_url))
    users = ",".join(f"{name}:{hash_password(password, iterations=1000)}" for name, password in PASSWORDS.items())
    common = app_env(engines, database, AUTH_USERS=users, TEACHERS="teach",
                     CHAINLIT_AUTH_SECRET=secrets.token_urlsafe(32))
    first = app_factory({**common, "LAB_REPLICA_ID": "app-1"}, name="chainlit-blind-replica-1")
    second = app_factory({**common, "LAB_REPLICA_ID": "app-2"}, name="chainlit-blind-replica-2")
    words = secret_words(engines)
    alice = chromium.new_context(locale="en-US", viewport={"width": 1400, "height": 1000})
    bob = chromium.new_context(locale="en-US", viewport={"width": 1400, "height": 1000})
    try:
        tab1 = alice.new_page()
        log_in(tab1, first, "alice", PASSWORDS["alice"])
        ready(tab1)
        tab2 = alice.new_page()  # the same browser, so the same login: on the other replica
        frames2 = collect_frames(tab2)
        tab2.goto(second.url)
        ready(tab2)
        classmate = bob.new_page()
        log_in(classmate, second, "bob", PASSWORDS["bob"])
        ready(classmate)
        send(classmate, "/engines")  # before any round: the panel opens for a student
        expect(classmate.locator('[data-testid="engines"]').first).to_be_visible(timeout=30_000)
        mark, steps_before = len(drain_frames(tab2, frames2)), tab2.locator(".step").count()

        start_blind_round(tab1, "Describe the sea in one long paragraph.")
        # The classmate's open panel closes at its next refresh, without any engine's figures.
        expect(classmate.locator(".step", has_text="for the teacher while a blind round is open").first) \
            .to_be_visible(timeout=15_000)
        try_every_view(tab2)
        assert not round_snapshot(tab1)["final"], "the round ended before every view was tried: nothing was tested"
        send(classmate, "/engines")
        expect(classmate.locator(".step", has_text="for the teacher while a blind round is open")).to_have_count(
            2, timeout=30_000)
        received = drain_frames(tab2, frames2, since=mark)
        assert not leaks(received, words), leaks(received, words)
        assert not figures(received), figures(received)
        shown = new_steps_text(tab2, steps_before)
        assert not [word for word in words if word.lower() in shown.lower()], shown

        # The vote on replica 1 releases the person on replica 2, and the class.
        wait_round_final(tab1)
        tab1.locator('[data-testid="vote-tie"]').last.click()
        expect(tab1.locator(".step", has_text="Vote recorded").last).to_be_visible(timeout=30_000)
        send(tab2, "/engines")
        expect(tab2.locator('[data-testid="engines"]').first).to_be_visible(timeout=30_000)
        send(classmate, "/engines")
        expect(classmate.locator('[data-testid="engines"]')).to_have_count(2, timeout=30_000)
    finally:
        alice.close()
        bob.close()
    (record,) = run_coroutine(stored(database, "votes"))
    assert record.rated and record.vote.unrated_reason is None
