"""The Chainlit side of a chat session, behind the one-line handlers in app.py.

Everything that decides something lives in `core.replies` (Chainlit-free); this
module reads and writes `cl.user_session`, sends messages and elements, and
renders the flow's notices. Per session: the settings, the conversation and
a pending message to retry; per person (`person`): the blind rule every view asks.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import re
import time
import uuid

import chainlit as cl
from chainlit.chat_context import chat_context
from chainlit.data import get_data_layer

from backends.base import ChatMessage
from backends.errors import BackendError, UnknownBackend
from backends.registry import BackendStatus
from core.app_state import AppState, server_may_be_down
from core.disclosure import Wait, person_key
from core.notices import Notice
from core.replies import answer
from core.streaming import StreamOutcome
from core.history import Conversation, rebuild_conversation
from core.texts import language_of, text
from core.input import Checked, check_message, refusal_of
from core.session_state import LabSession
from core.figures import initial_props
from ui.browser_id import browser_id
from ui.chat_history import write_history_soon
from ui.live import LiveReply
from ui import live_tap
from core.images import configured_image_origins, remote_images_as_links
from ui.session_memory import free_closed_sessions
from core.settings import SessionSettings, SettingsRejected
from ui.settings_panel import settings_widgets
from store import StoreError
from core.timing import FINAL_STATES

APP_AUTHOR = "Serving Lab"
log = logging.getLogger(__name__)


class MetricsElement(cl.CustomElement):
    """The live figures and compare rounds (public/elements/Metrics.jsx).

    A plain CustomElement writes a new file under .files/ and (with a data
    layer) a database row at every update: ~10 a second while streaming, per
    session. Live refreshes only need the new props in the browser, so only
    final props are written: the reply's frozen figures, a round once every
    column has ended (and again when its vote reveals it). The database row
    is what a chat reopened from the history sidebar shows. A page that taps its
    socket gets every refresh after the creation past Chainlit's element list,
    the final one too (its row is written all the same; ui/live_tap.py); the
    props carry the element's id (`liveId`) so its view can find them.
    """

    @property
    def final(self) -> bool:
        if self.props.get("kind") == "compare":
            return bool(self.props.get("final"))
        return self.props.get("state") in FINAL_STATES

    async def send(self, for_id: str, persist: bool = True) -> None:
        await super().send(for_id, persist=persist and self.final)

    async def _create(self, persist: bool = True) -> bool:
        """Chainlit's, without the file: a custom element is its props, which the browser receives
        with every send, so the file Chainlit writes under .files/ for each sent element (a thread
        hop per reply) is never read. The database row is kept (final props only, see `send`)."""
        if self.persisted and not self.updatable:
            return True  # a live refresh: only its props go to the browser
        if persist and (data_layer := get_data_layer()) is not None:
            asyncio.create_task(data_layer.create_element(self))
        self.chainlit_key = self.chainlit_key or self.id  # Chainlit sends an element only with a key or a URL
        self.persisted = True
        return True

    def to_dict(self):
        element = super().to_dict()
        element["props"] = {**(self.props or {}), "liveId": self.id}
        return element

    def live_tap_props(self) -> dict | None:
        """The props a tapped page may take with a piece of text (`live_tap.send_text`): live ones
        only (final props go by `update`, which writes their row)."""
        return None if self.final else self.props

    async def update(self) -> None:
        final = self.final
        self.updatable = final
        if final:
            self.content = json.dumps(self.props)
        if live_tap.page_listens():
            if final:
                await self._create(persist=True)
            await live_tap.send(self.id, self.props)
            return
        await super().update()


_state: AppState | None = None


def app_state() -> AppState:
    global _state
    if _state is None:
        _state = AppState.from_env()
    return _state


def start_up() -> None:
    """At import of the app, before it serves: build the backends and let each pay its start-up
    costs (the embedded engine's import and model load, Backend.start_up)."""
    for backend in app_state().registry:
        backend.start_up()


def lang() -> str:
    return language_of(getattr(cl.context.session, "language", None))


def lab() -> LabSession:
    """This chat session's state (core.session_state)."""
    return cl.user_session.get("lab")


def session_settings() -> SessionSettings:
    return lab().settings


def current_user() -> str | None:
    """The logged-in user's identifier, or None when login is off."""
    user = getattr(cl.context.session, "user", None)
    return user.identifier if user else None


def current_person() -> str:
    """Whose blind rule this session follows (core.disclosure.person_key): the user with login, else
    the browser's id cookie as its socket connection sent it (ui/browser_id.py), else the session."""
    session = cl.context.session
    environ = getattr(session, "environ", None) or {}
    return person_key(user=current_user(), browser_id=browser_id(environ.get("HTTP_COOKIE")),
                      session_id=session.id)


async def current_rule():
    """This session's person's blind rule, up to date (core.disclosure)."""
    return await app_state().rule(lab().person)


def guarded(handler):
    """A Chainlit handler whose unexpected errors go to the app's log, never to the browser.

    Chainlit shows an exception that escapes a handler to the page, its text included; a
    library's exception (a database driver's, say) can carry SQL, addresses or row values, and in a
    blind round a backend's name. The error is logged whole (with a reference); the person gets a
    short message with that reference and the chat goes on. Errors a person can act on
    (BackendError, StoreError) are handled inside the handlers and never get here."""
    @functools.wraps(handler)
    async def run(*args, **kwargs):
        try:
            return await handler(*args, **kwargs)
        except asyncio.CancelledError:
            raise
        except Exception:  # noqa: BLE001 - logged whole right here; only its text stays off the page
            reference = uuid.uuid4().hex[:8]
            log.exception("unexpected error in %s (reference %s)", handler.__name__, reference)
            await say(text("internal_error", lang(), reference=reference))
            return None

    return run


def screened(content: str) -> str:
    """A text the app wrote, passed through the disclosure rule (core.disclosure): while a blind
    round waits for its vote, no name, model or address of its backends is in it."""
    session = cl.user_session.get("lab")
    return session.disclosure.screen(content) if session is not None else content


async def say(content: str, *, author: str = APP_AUTHOR, **kwargs) -> cl.Message:
    """A message from the app itself (not a backend's reply), screened (`screened`)."""
    message = cl.Message(content=screened(content), author=author, **kwargs)
    await message.send()
    return message


def _labels(statuses: dict[str, BackendStatus] | None, lang: str) -> dict[str, str]:
    """Each backend's entry in the panel's list, marked unavailable where it is (unless a blind round
    waits for its vote: a mark could name the column that failed)."""
    if not lab().disclosure.health_shown():
        statuses = None
    labels = {}
    for backend in app_state().registry:
        label = f"{backend.label} ({backend.name})"
        status = (statuses or {}).get(backend.name)
        if status is not None and not status.available:
            label += f" · {text('unavailable', lang)}"
        labels[backend.name] = label
    return labels


async def _send_settings(statuses: dict[str, BackendStatus] | None = None) -> None:
    state, lang_code = app_state(), lang()
    widgets = settings_widgets(session_settings(), state.defaults, _labels(statuses, lang_code), state.presets, lang_code)
    await cl.ChatSettings(widgets).send()
    lab().shown_down = _down(statuses)


def _down(statuses: dict[str, BackendStatus] | None) -> set[str]:
    return {name for name, status in (statuses or {}).items() if not status.available}


async def refresh_backend_list(failed: list[tuple[str, BackendError | None]] = ()) -> None:
    """After replies: probe again each backend whose reply failed in a way that may mean its
    server is down, then re-send the settings panel if a backend went down or came back, so
    its list says "unavailable" exactly while that is true."""
    state = app_state()
    for name, error in failed:
        if server_may_be_down(error):
            await state.status(name, fresh=True)
    if not lab().disclosure.health_shown():
        return  # shown again once the blind round has its vote
    statuses = state.cached_statuses()
    if _down(statuses) != (lab().shown_down or set()):
        await _send_settings(statuses)


def _status_lines(statuses: dict[str, BackendStatus], lang_code: str) -> list[str]:
    """The backend list: each backend ready (model, context, version) or unavailable and why."""
    lines = [text("status_title", lang_code)]
    for status in statuses.values():
        if status.available and status.info:
            version = f" · {status.info.server_version}" if status.info.server_version else ""
            if status.info.stand_in:
                version += f" · ⚠ stand-in: {status.info.stand_in}"
            detail = text("status_ok", lang_code, model=status.info.model_id,
                          context=status.info.context_length or "?", version=version)
            lines.append(f"- ✅ **{status.label}** (`{status.name}`, {status.url}): {detail}")
        else:
            lines.append(f"- ❌ **{status.label}** (`{status.name}`): {text('status_down', lang_code, reason=status.reason)}")
    return lines


async def show_status() -> None:
    """/status: probe every backend now, list them as a new chat does, and update the settings panel."""
    statuses = await app_state().statuses(fresh=True)
    await _send_settings(statuses)
    await say("\n".join(_status_lines(statuses, lang())))


def _new_session(state: AppState, conversation: Conversation | None = None,
                 prompts: list[str] | None = None) -> LabSession:
    """This session's state, fresh. A reopened chat's session comes back from Chainlit with what it
    could save of the old one as JSON (nulls, for the one LabSession object): nothing of that is used."""
    person = current_person()
    session = LabSession(settings=SessionSettings.initial(state.defaults, state.presets, state.registry.names),
                         conversation=conversation or Conversation(), user_prompts=prompts or [],
                         person=person, disclosure=state.disclosures.person(person))
    cl.user_session.set("lab", session)
    return session


async def start(actions: list[cl.Action] | None = None) -> None:
    """New chat: settings panel, then the backends' status (a down backend is shown, not hidden), or,
    while a blind round of the person waits for its vote, that the status waits too."""
    state, lang_code = app_state(), lang()
    session = _new_session(state)
    free_closed_sessions()
    rule = await state.rule(session.person)  # another tab of this person may have a blind round waiting
    if await state.storage() is None:
        await say(text("storage_unavailable", lang_code, problem=state.storage_problem))
    elif state.storage_problem:  # down since start: writes wait, the app keeps trying (AppState.storage)
        await say(text("storage_waiting", lang_code, problem=state.storage_problem))
    await _send_settings()
    await _warm_up_backends(lang_code)
    statuses = await state.statuses()
    await _send_settings(statuses)
    if (wait := rule.refusal("status")) is not None:  # health and model ids could name a column
        await say(f"{text('status_title', lang_code)}\n\n{text(wait.key, lang_code, **wait.values)}",
                  actions=actions or [])
        return
    await say("\n".join(_status_lines(statuses, lang_code)), actions=actions or [])


def backend_threads() -> dict[str, list[ChatMessage]]:
    """Each backend's own thread of the conversation in compare and blind rounds (core.history.Conversation)."""
    return lab().threads


async def resume(thread: dict) -> None:
    """A chat reopened from the history sidebar (or after a restart): its conversation continues where
    it stopped, each backend with its own thread, as the database kept them."""
    state = app_state()
    steps = thread.get("steps") or []
    prompts = [step["output"] for step in steps if step.get("type") == "user_message" and step.get("output")]
    conversation = await _stored_conversation(state, thread.get("id"))
    if conversation is None:
        conversation = Conversation(history=_history_from_steps(steps))
    session = _new_session(state, conversation, prompts)
    await state.rule(session.person)
    restored = _saved_settings(state, thread)
    if restored is not None:
        session.settings = restored
    await _send_settings(await state.statuses())


async def _stored_conversation(state: AppState, thread_id: str | None) -> Conversation | None:
    store = await state.storage()
    if store is None or not thread_id:
        return None
    try:
        replies = await store.replies_for_thread(thread_id)
        rounds = await store.rounds(limit=10_000, thread_id=thread_id)
    except StoreError as error:
        await say(text("storage_read_failed", lang(), problem=str(error)))
        return None
    return rebuild_conversation(replies, rounds)


def _saved_settings(state: AppState, thread: dict) -> SessionSettings | None:
    """The settings panel as it was when the chat was left (Chainlit keeps its values with the
    thread), if they still make sense for the backends configured now."""
    metadata = thread.get("metadata") or {}
    if isinstance(metadata, str):
        try:
            metadata = json.loads(metadata)
        except ValueError:
            return None
    values = metadata.get("chat_settings") if isinstance(metadata, dict) else None
    if not isinstance(values, dict) or not values:
        return None
    try:
        return SessionSettings.from_form(values, state.defaults, state.registry.names, state.presets)
    except (UnknownBackend, SettingsRejected):
        return None  # e.g. a backend removed from .env since: the defaults apply


def _history_from_steps(steps: list[dict]) -> list[ChatMessage]:
    """Without the database: the single-backend exchanges as Chainlit kept them (a user message
    answered by a reply with its record; round prompts and refused messages are left out)."""
    history: list[ChatMessage] = []
    for question, reply_step in zip(steps, steps[1:]):
        if (question.get("type") == "user_message" and question.get("output")
                and reply_step.get("type") == "assistant_message" and (reply_step.get("metadata") or {}).get("record")):
            history += [ChatMessage("user", question["output"]), ChatMessage("assistant", reply_step.get("output") or "")]
    return history


async def _warm_up_backends(lang: str) -> None:
    """Load what a backend still needs (the shared embedded model: once per process), visibly."""
    for backend in app_state().registry:
        pending = backend.pending_warm_up()
        if pending is None:
            continue
        note = await say(text("loading_model", lang, name=pending))
        started = time.perf_counter()
        try:
            await backend.warm_up()
        except BackendError as error:
            note.content = f"❌ {error.describe()}"
        else:
            note.content = text("loaded_model", lang, name=pending, seconds=time.perf_counter() - started)
        await note.update()


async def update_settings(values: dict) -> None:
    state, lang_code = app_state(), lang()
    try:
        settings = SessionSettings.from_form(values, state.defaults, state.registry.names, state.presets)
    except UnknownBackend as error:
        await say(f"⚠️ {error}")
        return
    except SettingsRejected as error:
        problems = "\n".join(f"- {problem}" for problem in error.problems)
        await say(text("settings_rejected", lang_code, problems=problems))
        return
    lab().settings = settings
    system = settings.system_custom.strip() and text("custom", lang_code) or settings.system_preset
    optional = ", ".join(f"{name.replace('_', '-')} {value}" for name, value in
                         (("top_k", settings.top_k), ("min_p", settings.min_p),
                          ("repetition_penalty", settings.repetition_penalty), ("seed", settings.seed))
                         if value is not None) or text("none_set", lang_code)
    await say(text("settings_applied", lang_code, backend=state.registry.get(settings.backend).label,
                    temperature=settings.temperature, top_p=settings.top_p,
                    max_new_tokens=settings.max_new_tokens, optional=optional, system=system))


async def checked_input(raw: object, message: cl.Message | None = None) -> str | None:
    """The text to send for what arrived as a message, or None when it was refused (the person is told
    why; an earlier message waiting for Retry stays pending). A message refused where it arrived
    (ui/socket_guard.py: its text was never stored) carries that refusal. When characters were removed,
    the shown and stored user message becomes the text that is sent (PostgreSQL cannot store NUL)."""
    refused_on_arrival = refusal_of(message.metadata) if message is not None else None
    checked = Checked(None, refusal=refused_on_arrival) if refused_on_arrival else check_message(raw)
    lang_code = lang()
    if checked.refused:
        if message is not None:
            chat_context.remove(message)  # the page still shows it; the server need not hold 200 KB of it
        await say(checked.refusal.render(lang_code))
        return None
    if message is not None and checked.text_to_send != message.content:
        message.content = checked.text_to_send
        await message.update()
    for notice in checked.notices:
        await say(notice.render(lang_code))
    return checked.text_to_send


async def reply(user_text: str) -> None:
    """Answer one user message with the session's backend and settings (core.replies.answer)."""
    await answer(app_state(), lab(), user_text, ChatReplyView(lang()), thread_id=cl.context.session.thread_id,
                 user=current_user())


class ChatReplyView:
    """How a chat reply is shown in Chainlit (core.replies.ReplyView)."""

    def __init__(self, lang_code: str) -> None:
        self.lang = lang_code

    async def notice(self, notice: Notice) -> None:
        await say(notice.render(self.lang))

    async def failed(self, label: str, reason: str) -> None:
        await show_error(label, reason, self.lang)

    async def waits(self, wait: Wait) -> None:
        await show_reply_wait(wait, self.lang)

    async def stream(self, plan) -> tuple[StreamOutcome, str]:
        backend = plan.backend
        props = initial_props(backend=plan.label, model=plan.model, request=plan.request, lang=self.lang)
        ready = take_ready_figures()
        if ready is None:
            message = cl.Message(content="", author=_author(backend.label, backend.name))
            metrics = MetricsElement(name="Metrics", props=props, display="inline")
            message.elements = [metrics]
        else:  # the page has this reply's figures element already: it gets their props by the tap
            message = cl.Message(content="", author=_author(backend.label, backend.name), id=ready.for_id)
            metrics = ready
            metrics.props = props

        async def shown() -> None:
            # Marked with this process until it ends (the update below replaces the metadata).
            message.metadata = await app_state().in_flight_mark()
            if ready is not None:
                await live_tap.send(metrics.id, props)
            await message.send()
            write_history_soon()  # the person's message and this mark outlive the replica from now on

        async def engine_at_start() -> str | None:
            await plan.engine_state()
            return plan.engine_summary()

        # The request leaves first; the message and its figures go on screen while it is on its way.
        rule = lab().disclosure
        outcome = await LiveReply(plan.open_stream(), ReplyText(message, metrics), metrics, lang=self.lang,
                                  request=plan.request, engine_at_start=engine_at_start,
                                  queue_shown=rule.engine_state_shown).run(shown())
        # The per-chunk timeline is in the database (and in the figures element), not on every message.
        message.metadata = {"record": outcome.record.as_dict(), "sent": dict(plan.request.sent)}
        # The figures were sent and stored final already: Chainlit's update would send and store them again.
        message.elements = []
        # The final text replaces the streamed one: images from elsewhere become links (core/images.py).
        message.content = remote_images_as_links(message.content, configured_image_origins(), self.lang)
        await message.update()
        await ready_next_figures()
        return outcome, message.id

    async def backends_checked(self, failed) -> None:
        await refresh_backend_list(failed)


READY_FIGURES = "ready_reply_figures"  # user_session: (socket id, MetricsElement) for the next chat reply


async def ready_next_figures() -> None:
    """Send the next chat reply's figures element now, while the page is idle, for a message id
    chosen now; the reply then uses both (`take_ready_figures`). Chainlit keeps a chat's elements in
    one list, and a new element makes every message of the chat render again, its Markdown parsed
    again: done when the reply starts, that drawing (30-50 ms of the page's main thread with ten
    replies on it, in the same task as the new message's) held back the reply's first text. The
    element is mounted only once a message with its id exists, so until then the page shows
    nothing of it. Only for a page that takes the live tap (it gets the reply's props that way)."""
    if not live_tap.page_listens() or cl.user_session.get(READY_FIGURES) is not None:
        return
    element = MetricsElement(name="Metrics", props={"state": "starting", "lang": lang()}, display="inline")
    await element.send(for_id=str(uuid.uuid4()), persist=False)
    cl.user_session.set(READY_FIGURES, (cl.context.session.socket_id, element))


def take_ready_figures() -> MetricsElement | None:
    """The figures element `ready_next_figures` sent, if the page that has it still takes the tap."""
    ready = cl.user_session.get(READY_FIGURES)
    if ready is None:
        return None
    cl.user_session.set(READY_FIGURES, None)
    socket_id, element = ready
    if socket_id != cl.context.session.socket_id or not live_tap.page_listens():
        return None  # a page reconnected (or gone to long-polling) may not have it: a new one
    return element


class ReplyText:
    """Where a chat reply's streamed text goes (ui/live.py's text sink), decided at its first piece:
    to the page's tap when the page listens then (ui/live_tap.py; the view of the reply's figures
    `element` shows it until the message's final update brings the whole text), else to Chainlit's
    stream. Either way the text is the message's content, which that final update sends and stores."""

    def __init__(self, message: cl.Message, element: MetricsElement) -> None:
        self.message = message
        self.element = element
        self.tapped: bool | None = None

    async def stream_token(self, token: str, figures: MetricsElement | None = None) -> None:
        """The next piece of text; with `figures` (this reply's element), their live props too: in the
        same event on a tapped page (one drawing), else the element's update after the text."""
        if self.tapped is None:
            self.tapped = live_tap.page_listens()
        if self.tapped:
            self.message.content += token
            props = None if figures is None else figures.live_tap_props()
            await live_tap.send_text(self.element.id, self.message.id, token, props)
            if props is None and figures is not None:
                await figures.update()  # final props: the element's own path (its row is written)
        else:
            await self.message.stream_token(token)
            if figures is not None:
                await figures.update()


def _author(label: str, name: str) -> str:
    """Chainlit serves avatars only for names made of [A-Za-z0-9_ .-]; others get a broken image."""
    return re.sub(r"[^A-Za-z0-9_ .-]", "", label).strip() or name


def insist_action(lang: str, command: str | None = None) -> cl.Action:
    """"Show anyway": the person insists on a view or a reply while a blind round of theirs waits;
    that round then no longer counts as blind (core.round_flow.give_up_rounds)."""
    if command is None:
        return cl.Action(name="blind_insist", payload={}, label=text("blind_insist_reply", lang), icon="eye")
    return cl.Action(name="blind_insist", payload={"command": command}, label=text("blind_insist_view", lang),
                     icon="eye")


async def show_reply_wait(wait: Wait, lang_code: str) -> None:
    """A reply (or a round) waits for the vote of a blind round with its backends; the message is kept."""
    await say(text(wait.key, lang_code, **wait.values), actions=[insist_action(lang_code)])


async def show_command_wait(wait: Wait, command: str, lang_code: str) -> None:
    """A view waits for the vote of a blind round (core.disclosure); with a button to see it anyway,
    unless the rule cannot say which rounds wait (the database is unavailable)."""
    actions = [insist_action(lang_code, command)] if wait.key == "blind_wait" else []
    await say(text(wait.key, lang_code, **wait.values), actions=actions)


def retry_action(lang: str) -> cl.Action:
    """The Retry button: it sends the pending message again, with the settings in effect then."""
    return cl.Action(name="retry", payload={}, label=text("retry", lang), icon="rotate-ccw")


async def show_error(label: str, reason: str, lang: str) -> None:
    """`label` could not answer, why, and the Retry button (the message waits in `pending`)."""
    await say(f"{text('error_title', lang, backend=label)}\n\n{reason}\n\n{text('error_keep', lang)}",
               actions=[retry_action(lang)])
