"""Bounds on what one chat session holds in the app's memory, so 30 people for a whole lesson
(and every page reload, each a new session) do not grow it without end.

Chainlit keeps every message of a session, with its elements and metadata, in
`chat_context` (used by its message editing and favourites, both off here) and
never frees a session's list, not even after it frees the session itself. Here:
each session keeps only its newest messages there, and a new chat frees the
lists of sessions Chainlit no longer has. The conversation sent to the models
lives in the session's own history (bounded in core/history.py), the lab's
records in the database.
"""

from __future__ import annotations

import chainlit as cl
from chainlit.chat_context import chat_contexts
from chainlit.session import ws_sessions_id

from core.history import bounded_history

KEEP_CONTEXT_MESSAGES = 20  # Chainlit's chat_context per session
MAX_PROMPTS = 100  # the user's prompts kept for /replay


def bound_session() -> None:
    """After a reply: the session's history and threads, its prompts and Chainlit's list of its
    messages, bounded."""
    state = cl.user_session.get("lab")
    if state is None:
        return
    history = state.history
    if history:
        history[:] = bounded_history(history)
    for thread in state.threads.values():  # each backend's, in rounds
        thread[:] = bounded_history(thread)
    prompts = state.user_prompts
    if prompts and len(prompts) > MAX_PROMPTS:
        del prompts[:-MAX_PROMPTS]
    session = cl.context.session
    messages = chat_contexts.get(session.id) if session else None
    if messages and len(messages) > KEEP_CONTEXT_MESSAGES:
        del messages[:-KEEP_CONTEXT_MESSAGES]


def free_closed_sessions() -> int:
    """Drop Chainlit's message lists of sessions it has freed; how many were dropped."""
    gone = [session_id for session_id in list(chat_contexts) if session_id not in ws_sessions_id]
    for session_id in gone:
        chat_contexts.pop(session_id, None)
    return len(gone)
