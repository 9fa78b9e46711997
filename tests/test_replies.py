"""A chat reply end to end without Chainlit (core.replies.answer): plan, stream, store, tell, and
the conversation that goes on, driven through a recording view and fake backends."""

from __future__ import annotations

import asyncio

from core.replies import answer
from core.session_state import LabSession
from core.settings import SessionSettings
from core.streaming import Stopped, consume
from tests.fakes import FakeBackend, FakeReply, fake_state


class RecordingView:
    """A ReplyView that keeps what it was asked to show."""

    def __init__(self, stop_after_words: int | None = None) -> None:
        self.notices, self.failures, self.checked, self.streamed = [], [], [], []
        self.stop_after_words = stop_after_words

    async def notice(self, notice) -> None:
        self.notices.append(notice.key)

    async def failed(self, label: str, reason: str) -> None:
        self.failures.append((label, reason))

    async def stream(self, plan):
        words = 0
        task = asyncio.current_task()

        def take(chunk) -> None:
            nonlocal words
            words += bool(chunk.text)
            if self.stop_after_words is not None and words == self.stop_after_words:
                task.cancel()  # the person's Stop

        try:
            outcome = await consume(plan.open_stream(), on_chunk=take)
        except Stopped as stopped:
            task.uncancel()
            outcome = stopped.outcome
        self.streamed.append(outcome)
        return outcome, f"reply-{len(self.streamed)}"

    async def backends_checked(self, failed) -> None:
        self.checked.append(list(failed))


def session_for(state) -> LabSession:
    return LabSession(settings=SessionSettings.initial(state.defaults, state.presets, state.registry.names))


async def test_a_reply_streams_goes_into_the_conversation_and_says_it_was_not_saved():
    backend = FakeBackend("alpha", replies=[FakeReply(["Hello", " there"])])
    state = fake_state(backend)
    session, view = session_for(state), RecordingView()
    await answer(state, session, "Hi?", view, thread_id="t", user=None)
    (outcome,) = view.streamed
    assert outcome.text == "Hello there" and outcome.status == "completed"
    assert view.notices == ["not_saved"]  # this state has no database: said beside the reply
    assert view.failures == [] and view.checked == [[("alpha", None)]]
    assert [(m.role, m.content) for m in session.history] == [("user", "Hi?"), ("assistant", "Hello there")]
    assert session.pending is None


async def test_a_backend_that_is_down_is_refused_before_streaming_and_the_message_waits():
    backend = FakeBackend("alpha", available=False)
    state = fake_state(backend)
    session, view = session_for(state), RecordingView()
    await answer(state, session, "Hi?", view, thread_id="t", user=None)
    assert view.streamed == [] and view.failures and view.failures[0][0] == "alpha"
    assert session.pending == "Hi?" and session.history == []


async def test_a_failure_mid_reply_keeps_the_partial_text_and_the_message_for_retry():
    backend = FakeBackend("alpha", replies=[FakeReply(["one", " two", " three"], fail_after=2)])
    state = fake_state(backend)
    session, view = session_for(state), RecordingView()
    await answer(state, session, "Count", view, thread_id="t", user=None)
    (outcome,) = view.streamed
    assert outcome.status == "error" and outcome.text == "one two"
    assert view.failures and session.pending == "Count"
    assert session.history[-1].content == "one two"


async def test_stop_keeps_the_partial_reply_measured_as_stopped():
    backend = FakeBackend("alpha", replies=[FakeReply([f" w{i}" for i in range(50)], interval_s=0.01)])
    state = fake_state(backend)
    session, view = session_for(state), RecordingView(stop_after_words=3)
    await answer(state, session, "Go", view, thread_id="t", user=None)
    (outcome,) = view.streamed
    assert outcome.status == "stopped" and outcome.record.output_tokens == 3 and backend.closed == 1
    assert session.history[-1].content == outcome.text == " w0 w1 w2"
