"""Preparing a reply without Chainlit: what plan_reply tells the person, as data (fake backends)."""

from __future__ import annotations

from dataclasses import replace

from backends.base import ChatMessage
from core.notices import Notice
from core.replies import ReplyPlan, plan_reply
from core.settings import SessionSettings
from tests.fakes import FakeBackend, fake_state

# The fake backend counts a message as its words plus 4 tokens of template.
TEN_WORDS = "one two three four five six seven eight nine ten"


def conversation(exchanges: int) -> list[ChatMessage]:
    turns = []
    for index in range(exchanges):
        distinct = f"question{index} " + TEN_WORDS.split(" ", 1)[1]  # still ten words
        turns += [ChatMessage("user", distinct), ChatMessage("assistant", TEN_WORDS)]
    return turns


def settings(state, max_new_tokens: int) -> SessionSettings:
    initial = SessionSettings.initial(state.defaults, state.presets, state.registry.names)
    return replace(initial, max_new_tokens=max_new_tokens)


async def test_a_long_history_is_trimmed_whole_exchanges_first_and_the_person_is_told():
    backend = FakeBackend("small", label="Small engine", context_length=60)
    state = fake_state(backend)
    history = conversation(3)  # 6 messages of 14 tokens
    plan = await plan_reply(state, settings(state, 20), history, "short question here")  # 7 tokens
    assert isinstance(plan, ReplyPlan)
    # 91 + 20 > 60; without the two oldest exchanges 35 + 20 fits.
    assert plan.request.messages == (*history[4:], ChatMessage("user", "short question here"))
    assert plan.notices == (Notice("trimmed", {"dropped": 4, "backend": "Small engine", "context": 60}),)
    assert plan.request.params.max_new_tokens == 20
    assert plan.notices[0].render("en") == ("Trimmed 4 earlier message(s) so the conversation fits "
                                            "Small engine's context of 60 tokens.")
    assert "Small engine" in plan.notices[0].render("zh") and "4" in plan.notices[0].render("zh")


async def test_max_new_tokens_is_capped_by_the_room_left_in_the_context():
    backend = FakeBackend("small", label="Small engine", context_length=30)
    state = fake_state(backend)
    long_question = " ".join(["word"] * 20)  # 24 tokens: 6 left of the 30
    plan = await plan_reply(state, settings(state, 20), [], long_question)
    assert plan.request.params.max_new_tokens == 6
    assert plan.notices == (Notice("capped", {"tokens": 6, "backend": "Small engine"}),)
    assert plan.notices[0].render("en") == "Only 6 new tokens fit in Small engine's context; the reply is capped there."


async def test_trimming_and_capping_together_and_neither_when_it_fits():
    backend = FakeBackend("small", label="Small engine", context_length=40)
    state = fake_state(backend)
    long_question = " ".join(["word"] * 26)  # 30 tokens: even alone it leaves only 10 of 20
    plan = await plan_reply(state, settings(state, 20), conversation(2), long_question)
    assert plan.request.messages == (ChatMessage("user", long_question),)
    assert [notice.key for notice in plan.notices] == ["trimmed", "capped"]
    assert plan.notices[0].values["dropped"] == 4 and plan.notices[1].values["tokens"] == 10

    roomy = fake_state(FakeBackend("big", context_length=4096))
    plan = await plan_reply(roomy, settings(roomy, 20), conversation(2), long_question)
    assert plan.notices == () and len(plan.request.messages) == 5
