"""What a chat session does, behind the thin handlers in app.py.

One `AppState` per process (backends, defaults, presets); per session the
settings, the conversation and a pending message to retry live in
`cl.user_session`.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import time
from dataclasses import dataclass, field, replace

import chainlit as cl

from backends.base import ChatMessage
from backends.errors import BackendError, UnknownBackend
from backends.registry import BackendStatus, Registry
from chat.history import fit_to_context
from chat.i18n import language_of, text
from chat.live import LiveReply
from chat.settings import SessionSettings, load_presets, settings_widgets
from config import ChatDefaults, backend_names, load_env
from timing import TimedStream

INFO_CACHE_S = 30.0
STATUS_TIMEOUT_S = 4.0


@dataclass
class AppState:
    """Shared by every session in this process."""

    registry: Registry
    defaults: ChatDefaults
    presets: dict[str, str]
    _info: dict[str, tuple[float, BackendStatus]] = field(default_factory=dict)

    @classmethod
    def from_env(cls) -> "AppState":
        load_env()
        env = dict(os.environ)
        return cls(
            registry=Registry.from_env(env),
            defaults=ChatDefaults.from_env(env, backend_names(env)),
            presets=load_presets(),
        )

    async def status(self, name: str, fresh: bool = False) -> BackendStatus:
        """Health + info of one backend, cached briefly so a classroom does not hammer servers."""
        cached = self._info.get(name)
        if cached and not fresh and time.monotonic() - cached[0] < INFO_CACHE_S and cached[1].available:
            return cached[1]
        status = await self.registry.status(name, STATUS_TIMEOUT_S)
        self._info[name] = (time.monotonic(), status)
        return status


class MetricsElement(cl.CustomElement):
    """The live figures (public/elements/Metrics.jsx).

    A plain CustomElement writes a new file under .files/ at every update (~10 a
    second while streaming, per session). Live refreshes only need the new props
    in the browser, so only the final figures are written.
    """

    async def update(self) -> None:
        final = self.props.get("state") in ("completed", "stopped", "error")
        self.updatable = final
        if final:
            self.content = json.dumps(self.props)
        await super().update()


_state: AppState | None = None


def app_state() -> AppState:
    global _state
    if _state is None:
        _state = AppState.from_env()
    return _state


def _lang() -> str:
    return language_of(getattr(cl.context.session, "language", None))


def _settings() -> SessionSettings:
    return cl.user_session.get("settings")


def _history() -> list[ChatMessage]:
    return cl.user_session.get("history")


def _labels(statuses: dict[str, BackendStatus] | None, lang: str) -> dict[str, str]:
    labels = {}
    for backend in app_state().registry:
        label = f"{backend.label} ({backend.name})"
        status = (statuses or {}).get(backend.name)
        if status is not None and not status.available:
            label += f" · {text('unavailable', lang)}"
        labels[backend.name] = label
    return labels


async def _send_settings(statuses: dict[str, BackendStatus] | None = None) -> None:
    state, lang = app_state(), _lang()
    widgets = settings_widgets(_settings(), state.defaults, _labels(statuses, lang), state.presets, lang)
    await cl.ChatSettings(widgets).send()


async def start() -> None:
    """New chat: settings panel, then the backends' status (a down backend is shown, not hidden)."""
    state, lang = app_state(), _lang()
    cl.user_session.set("settings", SessionSettings.initial(state.defaults, state.presets))
    cl.user_session.set("history", [])
    cl.user_session.set("pending", None)
    await _send_settings()
    await _load_default_model(lang)
    statuses = {s.name: s for s in await asyncio.gather(*(state.status(n) for n in state.registry.names))}
    await _send_settings(statuses)
    lines = [text("status_title", lang)]
    for status in statuses.values():
        if status.available and status.info:
            version = f" · {status.info.server_version}" if status.info.server_version else ""
            detail = text("status_ok", lang, model=status.info.model_id,
                          context=status.info.context_length or "?", version=version)
            lines.append(f"- ✅ **{status.label}** (`{status.name}`, {status.url}): {detail}")
        else:
            lines.append(f"- ❌ **{status.label}** (`{status.name}`): {text('status_down', lang, reason=status.reason)}")
    await cl.Message(content="\n".join(lines), author="Serving Lab").send()


async def _load_default_model(lang: str) -> None:
    """Show the shared llama.cpp model loading (once per process; later sessions see it ready)."""
    from backends.llamacpp import LlamaCppBackend

    for backend in app_state().registry:
        if isinstance(backend, LlamaCppBackend) and backend.model.llama is None:
            name = backend.model.path.name
            note = cl.Message(content=text("loading_model", lang, name=name), author="Serving Lab")
            await note.send()
            try:
                await backend.ensure_loaded()
            except BackendError as error:
                note.content = f"❌ {error.describe()}"
            else:
                note.content = text("loaded_model", lang, name=name, seconds=backend.model.status().load_s or 0)
            await note.update()


async def update_settings(values: dict) -> None:
    state, lang = app_state(), _lang()
    try:
        settings = SessionSettings.from_form(values, state.defaults, state.registry.names, state.presets)
    except UnknownBackend as error:
        await cl.Message(content=f"⚠️ {error}", author="Serving Lab").send()
        return
    cl.user_session.set("settings", settings)
    system = settings.system_custom.strip() and text("custom", lang) or settings.system_preset
    label = state.registry.get(settings.backend).label
    await cl.Message(
        content=text("settings_applied", lang, backend=label, temperature=settings.temperature,
                     top_p=settings.top_p, max_new_tokens=settings.max_new_tokens, system=system),
        author="Serving Lab",
    ).send()


async def reply(user_text: str) -> None:
    """Answer one user message with the session's current backend and settings."""
    state, lang, settings = app_state(), _lang(), _settings()
    backend = state.registry.get(settings.backend)
    history = _history()
    turns = [*history, ChatMessage("user", user_text)]
    system_prompt = settings.system_prompt(state.presets)
    system = ChatMessage("system", system_prompt) if system_prompt else None
    try:
        status = await state.status(settings.backend)
        if not status.available:
            status = await state.status(settings.backend, fresh=True)
        if not status.available:
            await _show_error(status.label, status.reason or "", user_text, lang)
            return
        context = status.info.context_length if status.info else None
        fitted = await fit_to_context(system, turns, backend.count_prompt_tokens, context,
                                      settings.max_new_tokens)
    except BackendError as error:
        await _show_error(backend.label, error.describe(), user_text, lang)
        return
    if fitted.dropped_messages:
        await cl.Message(content=text("trimmed", lang, dropped=fitted.dropped_messages,
                                      backend=backend.label, context=context), author="Serving Lab").send()
    if fitted.max_new_tokens < settings.max_new_tokens:
        await cl.Message(content=text("capped", lang, tokens=fitted.max_new_tokens, backend=backend.label),
                         author="Serving Lab").send()

    model = status.info.model_id if status.info else backend.name
    params = replace(settings.params(), max_new_tokens=fitted.max_new_tokens)
    message = cl.Message(content="", author=_author(backend.label, backend.name))
    metrics = MetricsElement(name="Metrics", props={"state": "starting", "lang": lang,
                                                   "backend": backend.label, "model": model},
                             display="inline")
    message.elements = [metrics]
    await message.send()
    timed = TimedStream(backend.stream(fitted.messages, params), backend=backend.label, model=model)
    outcome = await LiveReply(timed, message, metrics, lang=lang).run()

    message.metadata = outcome.record.as_dict()
    await message.update()
    if outcome.error is not None:
        await _show_error(backend.label, outcome.error.describe(), user_text, lang)
        if not outcome.text:
            return
    # The partial text of a stopped or failed reply stays in the conversation.
    history.extend([ChatMessage("user", user_text), ChatMessage("assistant", outcome.text)])
    cl.user_session.set("pending", None)


def _author(label: str, name: str) -> str:
    """Chainlit serves avatars only for names made of [A-Za-z0-9_ .-]; others get a broken image."""
    return re.sub(r"[^A-Za-z0-9_ .-]", "", label).strip() or name


async def _show_error(label: str, reason: str, user_text: str, lang: str) -> None:
    cl.user_session.set("pending", user_text)
    retry = cl.Action(name="retry", payload={}, label=text("retry", lang), icon="rotate-ccw")
    await cl.Message(
        content=f"{text('error_title', lang, backend=label)}\n\n{reason}\n\n{text('error_keep', lang)}",
        author="Serving Lab",
        actions=[retry],
    ).send()


async def retry() -> None:
    """Resend the message that failed, to the backend now selected. Stop works here too."""
    pending = cl.user_session.get("pending")
    if not pending:
        await cl.Message(content=text("retry_gone", _lang()), author="Serving Lab").send()
        return
    session = cl.context.session
    session.current_task = asyncio.current_task()
    await cl.context.emitter.task_start()
    try:
        await cl.Message(content=pending, author="You", type="user_message").send()
        await reply(pending)
    finally:
        await cl.context.emitter.task_end()
