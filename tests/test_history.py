"""Fitting a conversation into a backend's context; rebuilding a reopened chat's conversation."""

from dataclasses import replace
from datetime import datetime, timedelta, timezone

from backends.base import ChatMessage
from core.history import estimate_tokens, fit_to_context, most_tokens, rebuild_conversation
from store.records import CompareRound, RoundColumn, StoredReply


def conversation(exchanges: int) -> list[ChatMessage]:
    turns = []
    for i in range(exchanges):
        turns += [ChatMessage("user", f"question {i} " + "x" * 30), ChatMessage("assistant", f"answer {i} " + "y" * 30)]
    return turns + [ChatMessage("user", "latest question")]


async def count_words(messages):
    return sum(len(m.content.split()) + 10 for m in messages)


async def test_everything_fits_nothing_dropped():
    turns = conversation(2)
    fitted = await fit_to_context(ChatMessage("system", "be brief"), turns, count_words, 1000, 100)
    assert fitted.dropped_messages == 0
    assert fitted.messages[0].role == "system" and fitted.messages[1:] == turns


async def test_oldest_exchanges_go_first_system_and_latest_stay():
    turns = conversation(5)
    fitted = await fit_to_context(ChatMessage("system", "be brief"), turns, count_words, 80, 20)
    assert fitted.dropped_messages > 0 and fitted.dropped_messages % 2 == 0
    assert fitted.messages[0].content == "be brief"
    assert fitted.messages[-1].content == "latest question"
    assert fitted.messages[1].role == "user"  # roles still alternate after trimming
    assert fitted.prompt_tokens + fitted.max_new_tokens <= 80


async def test_reply_is_capped_when_only_the_latest_message_fits():
    fitted = await fit_to_context(None, [ChatMessage("user", "one two three")], count_words, 20, 100)
    assert fitted.max_new_tokens == 20 - 13


async def test_backends_that_cannot_count_use_a_generous_estimate():
    async def cannot_count(messages):
        return None

    turns = conversation(3)
    fitted = await fit_to_context(None, turns, cannot_count, 100, 10)
    assert fitted.prompt_tokens == estimate_tokens(fitted.messages)
    assert fitted.dropped_messages > 0


async def test_unknown_context_sends_everything():
    turns = conversation(3)
    fitted = await fit_to_context(None, turns, count_words, None, 10)
    assert fitted.messages == turns and fitted.prompt_tokens is None


def test_bounded_history_keeps_the_newest_whole_turns_within_the_bound():
    from core.history import bounded_history

    turns = [ChatMessage(role, f"{role[0]}{i}" + "x" * 98) for i in range(10) for role in ("user", "assistant")]
    assert bounded_history(turns, max_chars=10_000) == turns  # under the bound: untouched
    kept = bounded_history(turns, max_chars=450)
    assert [m.content[:2] for m in kept] == ["u8", "a8", "u9", "a9"]  # 4 x 100 chars; a 5th is an orphan reply
    assert bounded_history(turns, max_chars=10) == turns[-1:]  # the newest message always stays
    assert bounded_history([], max_chars=10) == []


def test_chainlits_message_lists_of_freed_sessions_are_dropped():
    from chainlit.chat_context import chat_contexts
    from chainlit.session import ws_sessions_id

    from ui.session_memory import free_closed_sessions

    chat_contexts.update({"gone-1": [object()], "gone-2": [], "alive": [object()]})
    ws_sessions_id["alive"] = object()
    try:
        assert free_closed_sessions() == 2
        assert "alive" in chat_contexts and "gone-1" not in chat_contexts and "gone-2" not in chat_contexts
    finally:
        chat_contexts.pop("alive", None)
        ws_sessions_id.pop("alive", None)


# --- a chat reopened from the history sidebar ------------------------------------

T0 = datetime(2026, 3, 1, 12, 0, tzinfo=timezone.utc)


def stored(prompt: str, text: str, *, at: int, backend: str = "vllm", mode: str = "chat", status: str = "completed",
           round_id: str | None = None, label: str | None = None) -> StoredReply:
    return StoredReply(
        id=f"{prompt}-{backend}", thread_id="t", user_identifier=None, created_at=T0 + timedelta(seconds=at),
        backend=backend, backend_label=backend, model="m", mode=mode, round_id=round_id, column_label=label,
        prompt=prompt, reply_text=text, status=status, first_token_s=0.1, decode_tokens_per_s=50.0,
        output_tokens=len(text.split()), total_s=1.0, ms_per_output_token=20.0, settings_sent={}, record={},
    )


def round_of(round_id: str, prompt: str, *, at: int, backends: tuple[str, ...]) -> CompareRound:
    return CompareRound(id=round_id, thread_id="t", user_identifier=None, created_at=T0 + timedelta(seconds=at),
                        prompt=prompt, mode="blind", run_order="sequential",
                        columns=tuple(RoundColumn(label, name) for label, name in zip("ABCD", backends)))


def turns(*pairs: tuple[str, str]) -> list[ChatMessage]:
    return [ChatMessage(role, content) for role, content in pairs]


def test_a_reopened_chat_gets_back_its_history_and_each_backends_own_thread():
    r1 = round_of("r1", "round one", at=10, backends=("vllm", "tgi"))
    r2 = round_of("r2", "round two", at=30, backends=("tgi", "embedded"))
    replies = [
        stored("hello", "hi there", at=5),
        stored("failed", "", at=8, status="error"),  # failed without text: its question waits for Retry
        # Saved after the round started, in the order its columns ended.
        stored("round one", "tgi one", at=13, backend="tgi", mode="blind", round_id="r1", label="B"),
        stored("round one", "vllm one", at=12, backend="vllm", mode="blind", round_id="r1", label="A"),
        stored("stopped", "half a", at=20, status="stopped"),  # the partial text stays
        stored("replayed", "not part of it", at=25, mode="replay"),
        stored("round two", "tgi two", at=31, backend="tgi", mode="blind", round_id="r2", label="A"),
        stored("round two", "", at=32, backend="embedded", mode="blind", round_id="r2", label="B", status="error"),
    ]
    conversation = rebuild_conversation(list(reversed(replies)), [r2, r1])  # any order in, time order out
    assert conversation.history == turns(("user", "hello"), ("assistant", "hi there"),
                                         ("user", "stopped"), ("assistant", "half a"))
    assert conversation.threads == {
        "vllm": turns(("user", "hello"), ("assistant", "hi there"), ("user", "round one"), ("assistant", "vllm one")),
        "tgi": turns(("user", "hello"), ("assistant", "hi there"), ("user", "round one"), ("assistant", "tgi one"),
                     ("user", "round two"), ("assistant", "tgi two")),
        # Joined at round two, from the chat so far; its failed column added nothing.
        "embedded": turns(("user", "hello"), ("assistant", "hi there"), ("user", "stopped"), ("assistant", "half a")),
    }


def test_a_round_whose_replies_were_never_saved_still_starts_each_thread():
    conversation = rebuild_conversation([], [round_of("r", "p", at=0, backends=("a", "b"))])
    assert conversation.history == [] and conversation.threads == {"a": [], "b": []}


def test_a_rebuilt_conversation_is_bounded_like_a_live_one():
    long_reply = "y" * 300_000
    replies = [stored(f"q{i}", long_reply, at=i) for i in range(3)]
    conversation = rebuild_conversation(replies, [])
    assert [m.content for m in conversation.history] == ["q2", long_reply]
    assert conversation.threads == {}
    assert rebuild_conversation([replace(replies[0], reply_text="short")], []).history == turns(
        ("user", "q0"), ("assistant", "short"))


async def test_no_count_is_asked_for_a_conversation_that_fits_any_tokenizer_and_one_is_when_it_may_not():
    """Counting is a request to the engine before the reply's own: asked only when the conversation's
    bound (every byte a token, plus the template's share) could exceed the context."""
    asked = []

    async def counting(messages):
        asked.append(len(messages))
        return sum(len(m.content.split()) for m in messages)

    turns = conversation(2)
    context = most_tokens(turns) + 100
    fitted = await fit_to_context(None, turns, counting, context, 100)
    assert asked == [] and fitted.messages == turns and fitted.prompt_tokens is None
    fitted = await fit_to_context(None, turns, counting, context - 1, 100)  # the bound no longer fits
    assert asked == [len(turns)] and fitted.messages == turns and fitted.prompt_tokens is not None


def test_the_bound_is_at_least_the_bytes_of_every_message():
    messages = [ChatMessage("user", "天空 👍" * 50), ChatMessage("assistant", "plain text")]
    assert most_tokens(messages) >= sum(len(m.content.encode("utf-8")) for m in messages)
