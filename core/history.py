"""The conversation of one session and fitting it into a backend's context."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Awaitable, Callable, Sequence

from backends.base import ChatMessage
from store.records import CompareRound, StoredReply

TokenCounter = Callable[[Sequence[ChatMessage]], Awaitable[int | None]]


def estimate_tokens(messages: Sequence[ChatMessage]) -> int:
    """A deliberately generous estimate for backends that cannot count
    (about 3 characters per token, plus the template's per-message overhead)."""
    return sum(len(m.content) // 3 + 8 for m in messages) + 8


# A bound no tokenizer exceeds: a token covers at least one UTF-8 byte of the text, a chat template
# adds a few tokens per message, and some templates add a default system prompt.
TEMPLATE_TOKENS_PER_MESSAGE = 16
TEMPLATE_TOKENS_FIXED = 128


def most_tokens(messages: Sequence[ChatMessage]) -> int:
    """At least as many tokens as `messages` can take once templated, on any tokenizer."""
    return sum(len(m.content.encode("utf-8")) + TEMPLATE_TOKENS_PER_MESSAGE for m in messages) + TEMPLATE_TOKENS_FIXED


@dataclass(frozen=True)
class FittedPrompt:
    """The messages to send, and what had to give way."""

    messages: list[ChatMessage]
    dropped_messages: int
    prompt_tokens: int | None
    max_new_tokens: int


async def fit_to_context(
    system: ChatMessage | None,
    turns: Sequence[ChatMessage],
    count_tokens: TokenCounter,
    context_length: int | None,
    max_new_tokens: int,
) -> FittedPrompt:
    """Drop the oldest turns until prompt + max_new_tokens fits the context.

    The system prompt and the newest user message are always kept. If even
    they do not leave room for `max_new_tokens`, the reply is capped to the
    room left; if they do not fit at all, they are sent anyway so that the
    server's own, precise error reaches the user.
    """
    head = [system] if system and system.content.strip() else []
    turns = list(turns)
    if not context_length or most_tokens(head + turns) + max_new_tokens <= context_length:
        # Fits whatever the tokenizer: no count is asked for (a request to the engine before the reply's).
        return FittedPrompt(head + turns, 0, None, max_new_tokens)

    async def count(messages: list[ChatMessage]) -> int:
        counted = await count_tokens(messages)
        return counted if counted is not None else estimate_tokens(messages)

    dropped = 0
    tokens = await count(head + turns)
    while tokens + max_new_tokens > context_length and len(turns) > 1:
        # Drop a whole exchange (user + assistant) where possible, so roles still alternate.
        step = 2 if len(turns) > 2 and turns[0].role == "user" and turns[1].role == "assistant" else 1
        turns = turns[step:]
        dropped += step
        tokens = await count(head + turns)
    room = context_length - tokens
    capped = max(1, min(max_new_tokens, room)) if room > 0 else max_new_tokens
    return FittedPrompt(head + turns, dropped, tokens, capped)


# The most conversation one session keeps in the app's memory: far more than any model's context
# here (about 100k tokens), so fitting (above) decides what is sent; this only bounds memory.
MAX_HISTORY_CHARS = 400_000


def bounded_history(history: Sequence[ChatMessage], max_chars: int = MAX_HISTORY_CHARS) -> list[ChatMessage]:
    """The newest messages whose text adds up to at most `max_chars`, whole turns only (a kept
    assistant message keeps its user message); the newest turn is always kept."""
    kept: list[ChatMessage] = []
    total = 0
    for index in range(len(history) - 1, -1, -1):
        message = history[index]
        total += len(message.content)
        if kept and total > max_chars:
            break
        kept.append(message)
    kept.reverse()
    while len(kept) > 1 and kept[0].role == "assistant":
        kept.pop(0)  # a reply whose question was dropped
    return kept


@dataclass
class Conversation:
    """What a session sends as context: the single-backend chat, and each backend's own thread in
    compare and blind rounds (the user's round prompts plus that backend's own replies; a backend
    joining its first round starts from the single-backend chat so far)."""

    history: list[ChatMessage] = field(default_factory=list)
    threads: dict[str, list[ChatMessage]] = field(default_factory=dict)


def rebuild_conversation(replies: Sequence[StoredReply], rounds: Sequence[CompareRound]) -> Conversation:
    """A reopened chat's conversation from what the database kept, as the session had built it.

    The same rules as a live session: a reply that failed without any text
    adds nothing (its question waits for Retry); a stopped reply keeps its
    partial text; a round column without text adds nothing to its thread.
    Replies of other modes (replay) never joined the conversation.
    """
    in_round: dict[str, dict[str, StoredReply]] = {}
    for reply in replies:
        if reply.round_id is not None and reply.column_label is not None:
            in_round.setdefault(reply.round_id, {})[reply.column_label] = reply
    events: list[StoredReply | CompareRound] = [*(r for r in replies if r.mode == "chat"), *rounds]
    conversation = Conversation()
    # A round is stored when it starts, a chat reply when it ends: one session does one at a time.
    for event in sorted(events, key=lambda event: event.created_at):
        if isinstance(event, StoredReply):
            if event.status == "error" and not event.reply_text:
                continue
            conversation.history += [ChatMessage("user", event.prompt), ChatMessage("assistant", event.reply_text)]
            continue
        for column in event.columns:
            thread = conversation.threads.setdefault(column.backend, list(conversation.history))
            reply = in_round.get(event.id, {}).get(column.label)
            if reply is not None and reply.reply_text:
                thread += [ChatMessage("user", event.prompt), ChatMessage("assistant", reply.reply_text)]
    conversation.history = bounded_history(conversation.history)
    conversation.threads = {name: bounded_history(thread) for name, thread in conversation.threads.items()}
    return conversation
