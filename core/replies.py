"""The reply flow without Chainlit, end to end: plan -> stream -> store -> notices.

`plan_reply` does everything that happens before a reply streams - checking
the backend, fitting the history into its context, fixing the sampling
settings and preparing the request (lookups, templating), and reading the
engine's state - and returns a `ReplyPlan` or a `Refusal`. `answer` runs a
chat reply through it: the plan's notices, the stream (drawn by the view,
consumed by the one loop, core.streaming), the stored row, what the person
must be told (not saved, an empty reply, an error with Retry), and the
conversation that goes on. The UI (ui/session_view.py) only implements
`ReplyView`: how to show a notice, an error, a streaming reply.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from dataclasses import asdict, dataclass, field, replace
from typing import Mapping, Protocol, Sequence

from backends.base import Backend, ChatMessage, PreparedRequest, display_label
from backends.engine_metrics import EngineSnapshot
from backends.errors import BackendError
from backends.watchdog import watched
from core.app_state import AppState
from core.disclosure import Disclosure, Wait
from core.engines import reading_age_note, state_summary
from core.figures import ignored_lines
from core.history import fit_to_context
from core.notices import Notice
from core.session_state import LabSession
from core.settings import SessionSettings
from core.streaming import StreamOutcome
from core.timing import RequestRecord, TimedStream
from store import StoredReply
from store.records import utc_now

ENGINE_STATE_TIMEOUT_S = 1.0


@dataclass(frozen=True)
class ReplyPlan:
    """A reply ready to stream: the backend, the prepared request, notices to show first, and
    the engine's state when it started (running/waiting requests, KV cache), where reported.

    The engine's state is the process's shared reading (core.engines.EngineReadings): one at most
    a few hundred ms old, or the one being taken as the request leaves; nothing waits for it
    before the request leaves. `engine_at_start` is it once taken (the stream's end awaits it:
    `engine_state`), and `engine_summary` says how far from the request it was read - nothing while
    the person's blind rule holds (`rule`, core.disclosure: with a round of theirs running, an
    engine's state at another reply's start says which engine is busy when). The stored reply
    keeps the reading whatever the rule (shown by /stats, after the vote)."""

    backend: Backend
    model: str
    request: PreparedRequest
    notices: tuple[Notice, ...] = ()
    engine_reading: asyncio.Future | None = field(default=None, compare=False, repr=False)
    stand_in: str | None = None  # the server stands in for another engine (the TGI-protocol test server)
    planned_at_s: float = field(default_factory=time.monotonic)  # the clock of EngineSnapshot.taken_at_s
    rule: Disclosure | None = field(default=None, compare=False, repr=False)  # whose blind rule it shows under

    @property
    def label(self) -> str:
        """The backend's name wherever this reply's numbers are shown ("TGI (stand-in)")."""
        return display_label(self.backend.label, self.stand_in)

    @property
    def engine_at_start(self) -> EngineSnapshot | None:
        """The engine's state as the request left, once read (None: not read yet, or not reported)."""
        reading = self.engine_reading
        if reading is None or not reading.done() or reading.cancelled() or reading.exception() is not None:
            return None
        return reading.result().snapshot

    async def engine_state(self, timeout_s: float = ENGINE_STATE_TIMEOUT_S) -> EngineSnapshot | None:
        """`engine_at_start`, waiting up to `timeout_s` for a reading still being taken."""
        if self.engine_reading is not None and not self.engine_reading.done():
            await asyncio.wait([self.engine_reading], timeout=timeout_s)
        return self.engine_at_start

    def engine_summary(self, shown: bool | None = None) -> str | None:
        """The engine's state in one line, with how far from the request it was read (None when it is
        not known, or not `shown`: by default, while the person's blind rule holds)."""
        if shown is None:
            shown = self.rule is None or self.rule.engine_state_shown()
        if not shown:
            return None
        snapshot = self.engine_at_start
        summary = state_summary(snapshot)
        return None if summary is None else f"{summary} ({reading_age_note(snapshot, self.planned_at_s)})"

    def open_stream(self) -> TimedStream:
        """The measured stream under the backend's first-token and stall limits; the request
        leaves (and the clock starts) on its first iteration."""
        return TimedStream(watched(self.backend, self.request), backend=self.label, model=self.model)


@dataclass(frozen=True)
class Refusal:
    """The reply cannot be sent now; `reason` says why and what to do."""

    label: str
    reason: str


def system_message(settings: SessionSettings, presets: Mapping[str, str]) -> ChatMessage | None:
    prompt = settings.system_prompt(presets)
    return ChatMessage("system", prompt) if prompt else None


async def plan_reply(
    state: AppState,
    settings: SessionSettings,
    history: Sequence[ChatMessage],
    user_text: str,
    rule: Disclosure | None = None,
) -> ReplyPlan | Refusal:
    """Check the backend, fit the conversation into its context, prepare the request (shown under
    the person's blind `rule`)."""
    backend = state.registry.get(settings.backend)
    turns = [*history, ChatMessage("user", user_text)]
    try:
        status = await state.status(settings.backend)
        if not status.available:
            status = await state.status(settings.backend, fresh=True)
        if not status.available:
            return Refusal(status.label, status.reason or "")
        context = status.info.context_length if status.info else None
        fitted = await fit_to_context(system_message(settings, state.presets), turns,
                                      backend.count_prompt_tokens, context, settings.max_new_tokens)
        params = replace(settings.params(), max_new_tokens=fitted.max_new_tokens)
        request = await backend.prepare(fitted.messages, params)
    except BackendError as error:
        return Refusal(backend.label, error.describe())
    notices = []
    if fitted.dropped_messages:
        notices.append(Notice("trimmed", {"dropped": fitted.dropped_messages, "backend": backend.label,
                                          "context": context}))
    if fitted.max_new_tokens < settings.max_new_tokens:
        notices.append(Notice("capped", {"tokens": fitted.max_new_tokens, "backend": backend.label}))
    model = status.info.model_id if status.info else request.model
    # What the engine was busy with, so a slow reply can be explained later: the shared reading,
    # never a scrape of this reply's own before its request leaves.
    return ReplyPlan(backend, model, request, tuple(notices), state.readings.reading_now(backend),
                     stand_in=status.info.stand_in if status.info else None, rule=rule)


def request_shape(messages: Sequence[ChatMessage]) -> dict:
    """How many messages a request sent and its system prompt (None: none): with the thread's stored
    replies, exactly the conversation it sent."""
    system = next((m.content for m in messages if m.role == "system"), None)
    return {"messages": len(messages), "system_prompt": system}


def empty_reply_notice(record: RequestRecord, reply_text: str) -> Notice | None:
    """A reply that completed without any text must not pass as a normal answer: say so."""
    if record.status != "completed" or reply_text.strip():
        return None
    return Notice("empty_reply", {"tokens": record.output_tokens, "finish_reason": record.finish_reason or "?"})


def stored_reply(
    plan: ReplyPlan,
    record: RequestRecord,
    *,
    user_text: str,
    reply_text: str,
    mode: str = "chat",
    reply_id: str | None = None,
    thread_id: str | None = None,
    user_identifier: str | None = None,
    round_id: str | None = None,
    column_label: str | None = None,
) -> StoredReply:
    """What the database keeps of a finished reply: who answered, what was sent, every figure."""
    return StoredReply(
        id=reply_id or str(uuid.uuid4()),
        thread_id=thread_id,
        user_identifier=user_identifier,
        created_at=utc_now(),
        backend=plan.backend.name,
        backend_label=plan.label,
        model=plan.model,
        mode=mode,
        round_id=round_id,
        column_label=column_label,
        prompt=user_text,
        reply_text=reply_text,
        status=record.status,
        first_token_s=record.first_token_s,
        decode_tokens_per_s=record.decode_tokens_per_s,
        output_tokens=record.output_tokens,
        total_s=record.total_s,
        ms_per_output_token=record.ms_per_output_token,
        settings_sent={"sent": dict(plan.request.sent), "chosen": plan.request.params.chosen(),
                       "ignored": ignored_lines(plan.request), "notes": list(plan.request.notes)},
        record={**record.as_dict(include_timeline=True),
                "engine_at_start": asdict(plan.engine_at_start) if plan.engine_at_start else None,
                # What the request carried besides this message (a class trace rebuilds it: core/load/trace.py):
                # how many messages, and the system prompt the class shared.
                "request": request_shape(plan.request.messages)},
        error=record.error,
    )


# ---------------------------------------------------------------- a chat reply, end to end


class ReplyView(Protocol):
    """What a chat reply needs from the screen it is shown on (ui/session_view.py in the app)."""

    async def notice(self, notice: Notice) -> None:
        """Tell the person something (a trimmed history, a row not saved, an empty reply)."""

    async def failed(self, label: str, reason: str) -> None:
        """Say that `label` could not answer and why; offer to send the message again."""

    async def waits(self, wait: Wait) -> None:
        """A blind round of the person with this backend waits for its vote: say so, offer to vote
        first or to send anyway (core.round_flow.give_up_rounds); the message waits."""

    async def stream(self, plan: ReplyPlan) -> tuple[StreamOutcome, str]:
        """Show the reply as it streams (`plan.open_stream()`, consumed by core.streaming) and its
        final figures; return how it ended and the id the reply is shown (and stored) under."""

    async def backends_checked(self, failed: Sequence[tuple[str, BackendError | None]]) -> None:
        """After replies: the backends whose reply failed may be down; show the list as it is now."""


async def answer(state: AppState, session: LabSession, user_text: str, view: ReplyView, *,
                 thread_id: str | None, user: str | None) -> None:
    """Answer one message with the session's backend and settings: plan, stream, store, tell. A reply
    from a backend of a blind round of the person that waits for its vote waits (core.disclosure)."""
    rule = await state.rule(session.person)
    if (wait := rule.reply_wait([session.settings.backend])) is not None:
        session.pending = user_text
        await view.waits(wait)
        return
    plan = await plan_reply(state, session.settings, session.history, user_text, rule)
    if isinstance(plan, Refusal):
        session.pending = user_text
        await view.failed(plan.label, plan.reason)
        await view.backends_checked(())
        return
    for notice in plan.notices:
        await view.notice(notice)
    outcome, reply_id = await view.stream(plan)
    await plan.engine_state()
    not_saved = await state.save_reply(stored_reply(plan, outcome.record, user_text=user_text,
                                                    reply_text=outcome.text, reply_id=reply_id,
                                                    thread_id=thread_id, user_identifier=user))
    for notice in (not_saved, empty_reply_notice(outcome.record, outcome.text)):
        if notice is not None:
            await view.notice(notice)
    if outcome.error is not None:
        session.pending = user_text
        await view.failed(plan.backend.label, outcome.error.describe())
    await view.backends_checked([(plan.backend.name, outcome.error)])
    if outcome.error is not None and not outcome.text:
        return  # nothing to keep: the question waits for Retry
    # The partial text of a stopped or failed reply stays in the conversation.
    session.history.extend([ChatMessage("user", user_text), ChatMessage("assistant", outcome.text)])
    if outcome.error is None:
        session.pending = None
