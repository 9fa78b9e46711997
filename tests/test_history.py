"""Fitting a conversation into a backend's context."""

from backends.base import ChatMessage
from chat.history import estimate_tokens, fit_to_context


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
    from chat.history import bounded_history

    turns = [ChatMessage(role, f"{role[0]}{i}" + "x" * 98) for i in range(10) for role in ("user", "assistant")]
    assert bounded_history(turns, max_chars=10_000) == turns  # under the bound: untouched
    kept = bounded_history(turns, max_chars=450)
    assert [m.content[:2] for m in kept] == ["u8", "a8", "u9", "a9"]  # 4 x 100 chars; a 5th is an orphan reply
    assert bounded_history(turns, max_chars=10) == turns[-1:]  # the newest message always stays
    assert bounded_history([], max_chars=10) == []


def test_chainlits_message_lists_of_freed_sessions_are_dropped():
    from chainlit.chat_context import chat_contexts
    from chainlit.session import ws_sessions_id

    from chat.memory import free_closed_sessions

    chat_contexts.update({"gone-1": [object()], "gone-2": [], "alive": [object()]})
    ws_sessions_id["alive"] = object()
    try:
        assert free_closed_sessions() == 2
        assert "alive" in chat_contexts and "gone-1" not in chat_contexts and "gone-2" not in chat_contexts
    finally:
        chat_contexts.pop("alive", None)
        ws_sessions_id.pop("alive", None)
