"""experiments/class_burst.py measures what it says, for both apps it compares (a few tabs, not a class).

Its tabs speak Chainlit's socket.io as the page does, and offer the app's live tap as the page does
(ui/live_tap.py): this app then sends a reply's text as `lab_text` and its final figures as
`lab_live`, the bare Chainlit floor as `stream_token`. Either way every reply must end with its
marker, its first text and end must be timed against the paced server's own send times, and this
app's shown TTFT must be read; a tab that missed one of those kinds of event would count a failure
or no reply here (as it once did when the tap started carrying the text).
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
from pathlib import Path

import pytest

from experiments.class_burst import Tab, burst, start_floor, start_lab
from servers.paced_openai import start_paced_server

pytestmark = pytest.mark.slow

STUDENTS = 3
TTFT_S = 0.3
TOKENS = 50  # at 50 tokens/s: a reply streams for a second, 20 ms a token


@pytest.fixture(scope="module")
def paced():
    server = start_paced_server(50, TOKENS, name="paced-class-burst-tabs")
    server.set_pace(50, TOKENS, first_token_s=TTFT_S)
    yield server
    server.stop()


def one_burst(app, paced, events: list[str], scenario: str = "connected"):
    """A burst of STUDENTS tabs; the names of the events the tabs received are added to `events`."""
    original = Tab._event

    async def recording(tab, event, data=None, *rest):
        events.append(event)
        await original(tab, event, data, *rest)

    Tab._event = recording
    try:
        return asyncio.run(burst(app, paced, STUDENTS, 1, None, scenario))
    finally:
        Tab._event = original


def check(phase) -> None:
    assert phase.failures == [] and phase.replies == STUDENTS, phase.failures
    # Timed against the server's own sends: the first text after its first token, the end after its
    # last, each well within the second the reply streams for ...
    assert all(0 <= ms < 500 for ms in phase.first_text_ms), phase.first_text_ms
    assert all(0 <= ms < 500 for ms in phase.reply_end_ms), phase.reply_end_ms
    # ... and the text seen streaming at the server's pace in between (20 ms a token), not all at the end.
    assert all(10 <= per_token <= 40 for _, per_token in phase.seen), phase.seen


def test_this_apps_tabs_take_the_text_and_figures_by_the_live_tap_and_measure_every_reply(paced):
    database_dir = Path(tempfile.mkdtemp(prefix="class-burst-tabs-"))
    app = start_lab(paced, "openai", 1, database_dir)
    events: list[str] = []
    try:
        phase = one_burst(app, paced, events)
    finally:
        app.stop()
        shutil.rmtree(database_dir, ignore_errors=True)
    assert "lab_text" in events and "stream_token" not in events
    check(phase)
    assert len(phase.ttft_shown_ms) == STUDENTS
    assert all(abs(bias) < 200 for bias in phase.ttft_bias_ms), phase.ttft_bias_ms


def test_control_the_floors_tabs_get_chainlits_stream_and_measure_every_reply(paced):
    app = start_floor(paced, 1)
    events: list[str] = []
    try:
        phase = one_burst(app, paced, events)
    finally:
        app.stop()
    assert "stream_token" in events and "lab_text" not in events
    check(phase)


@pytest.mark.parametrize("flavour", ["app", "floor"])
def test_a_class_that_joins_and_sends_at_once_is_measured_as_each_tab_sent(paced, flavour):
    """The join-and-send scenario: each tab opens its page and sends as soon as its chat has started,
    so the messages leave at different moments; every reply is still measured against its own send."""
    database_dir = Path(tempfile.mkdtemp(prefix="class-burst-join-"))
    app = start_lab(paced, "openai", 1, database_dir) if flavour == "app" else start_floor(paced, 1)
    try:
        phase = one_burst(app, paced, [], scenario="join")
    finally:
        app.stop()
        shutil.rmtree(database_dir, ignore_errors=True)
    assert phase.scenario == "join" and "join+send" in phase.name
    check(phase)
    assert phase.cpu_s > 0  # the chat starts' CPU is inside the measured span
