"""Compare and blind rounds without Chainlit or servers: fake backends with queued replies."""

from __future__ import annotations

import asyncio
import json
import random

import pytest

from backends.base import ChatMessage
from core.replies import Refusal, plan_reply
from core.settings import SessionSettings
from core.rounds import (
    Column,
    RevealPace,
    RoundRun,
    RoundSettings,
    RoundSettingsError,
    assign_labels,
    round_props,
    run_order_for,
    runs_on_this_machine,
)
from tests.fakes import FakeBackend, FakeReply, fake_state

WORDS = [f"w{i} " for i in range(20)]


def settings_for(state, **values) -> SessionSettings:
    return SessionSettings.initial(state.defaults, state.presets, state.registry.names)


async def columns_for(state, names, user_text="hello", history=None) -> list[Column]:
    settings = settings_for(state)
    columns = []
    for label, name in assign_labels(names, blind=False):
        plan = await plan_reply(state, settings.for_backend(name), history or [], user_text)
        column = Column(label=label, backend=name, backend_label=state.registry.get(name).label)
        if isinstance(plan, Refusal):
            column.refusal = plan
        else:
            column.plan = plan
        columns.append(column)
    return columns


class Renders:
    def __init__(self):
        self.count = 0

    async def __call__(self):
        self.count += 1


def test_labels_keep_the_chosen_order_or_are_shuffled_for_blind():
    names = ("vllm", "tgi", "llama_cpp")
    assert assign_labels(names, blind=False) == (("A", "vllm"), ("B", "tgi"), ("C", "llama_cpp"))
    orders = {tuple(name for _, name in assign_labels(names, blind=True, rng=random.Random(seed))) for seed in range(20)}
    assert len(orders) > 1 and all(sorted(order) == sorted(names) for order in orders)


def test_round_settings_are_checked_with_clear_reasons():
    configured = ["a", "b", "c", "d", "e"]
    RoundSettings(("a", "b")).check(configured)
    for names, words in [(("a",), "choose 2 to 4"), (("a", "b", "c", "d", "e"), "choose 2 to 4"),
                         (("a", "zz"), r"unknown backend\(s\) zz"), (("a", "a"), "chosen twice")]:
        with pytest.raises(RoundSettingsError, match=words):
            RoundSettings(names).check(configured)


def test_auto_run_order_is_sequential_when_two_backends_share_this_machine():
    local_server = FakeBackend("local", url="http://127.0.0.1:8001/v1")
    embedded = FakeBackend("embedded", kind="llamacpp", url="in-process: model.gguf", in_process=True)
    remote = FakeBackend("remote", url="http://gpu-box.example:8000/v1")
    other_remote = FakeBackend("remote2", url="http://10.1.2.3:8080")
    assert runs_on_this_machine(local_server) and runs_on_this_machine(embedded) and not runs_on_this_machine(remote)
    auto = RoundSettings(("x", "y"))
    assert run_order_for(auto, [local_server, embedded]) == "sequential"
    assert run_order_for(auto, [local_server, remote]) == "concurrent"
    assert run_order_for(auto, [remote, other_remote]) == "concurrent"
    assert run_order_for(RoundSettings(("x", "y"), run_order="concurrent"), [local_server, embedded]) == "concurrent"


async def test_concurrent_columns_get_the_same_prompt_and_a_slow_one_holds_up_nobody():
    fast = FakeBackend("fast", replies=[FakeReply(WORDS[:5], 0.01)])
    slow = FakeBackend("slow", replies=[FakeReply(WORDS, 0.05)])
    state = fake_state(fast, slow)
    columns = await columns_for(state, ("fast", "slow"))
    renders = Renders()
    run = RoundRun(columns, "concurrent", renders, tick_s=0.05)
    await run.run()
    assert [c.state for c in columns] == ["completed", "completed"]
    assert columns[0].text == "".join(WORDS[:5]) and columns[1].text == "".join(WORDS)
    # Both started together; the fast one finished long before the slow one.
    assert abs(fast.started_at[0] - slow.started_at[0]) < 0.05
    assert fast.ended_at[0] < slow.ended_at[0] - 0.5
    # Every column got the same conversation and the same sampling settings.
    assert fast.requests[0].messages == slow.requests[0].messages == (ChatMessage("user", "hello"),)
    assert fast.requests[0].params == slow.requests[0].params
    # One render per tick for the whole round, not one per column per token.
    assert renders.count <= (slow.ended_at[0] - slow.started_at[0]) / 0.05 + 3
    assert columns[1].record.output_tokens == 20 and columns[1].record.status == "completed"


async def test_sequential_columns_run_one_after_another():
    first = FakeBackend("first", replies=[FakeReply(WORDS[:5], 0.02)])
    second = FakeBackend("second", replies=[FakeReply(WORDS[:5], 0.02)])
    columns = await columns_for(fake_state(first, second), ("first", "second"))
    await RoundRun(columns, "sequential", Renders()).run()
    assert second.started_at[0] >= first.ended_at[0]
    assert [c.state for c in columns] == ["completed", "completed"]


async def test_a_failing_or_unreachable_backend_breaks_only_its_own_column():
    good = FakeBackend("good", replies=[FakeReply(WORDS[:6])])
    failing = FakeBackend("failing", replies=[FakeReply(WORDS, fail_after=3)])
    down = FakeBackend("down", available=False)
    columns = await columns_for(fake_state(good, failing, down), ("good", "failing", "down"))
    assert columns[2].refusal is not None
    await RoundRun(columns, "concurrent", Renders()).run()
    assert [c.state for c in columns] == ["completed", "error", "error"]
    assert columns[0].text == "".join(WORDS[:6])
    assert columns[1].text == "".join(WORDS[:3])  # the partial text stays
    assert "overloaded" in columns[1].error_text("en", named=True)
    assert "not reachable" in columns[2].error_text("en", named=True)
    assert failing.closed == 1


@pytest.mark.parametrize("order", ["concurrent", "sequential"])
@pytest.mark.parametrize("close_s", [0.0, 0.3], ids=["quick-close", "one-slow-close"])
async def test_stop_ends_every_columns_request_and_keeps_the_partial_text(order, close_s):
    """One column whose stream takes a while to close (as the embedded model's does) must still
    end 'stopped' with its record before the round is final."""
    a = FakeBackend("a", replies=[FakeReply(WORDS, 0.05, close_s=close_s)])
    b = FakeBackend("b", replies=[FakeReply(WORDS, 0.05)])
    columns = await columns_for(fake_state(a, b), ("a", "b"))
    run = RoundRun(columns, order, Renders())
    task = asyncio.create_task(run.run())
    await asyncio.sleep(0.3)
    task.cancel()  # what Chainlit does on Stop
    await task  # the round itself does not raise
    assert run.stopped
    assert [c.state for c in columns] == ["stopped", "stopped"]
    assert columns[0].text and len(columns[0].text) < len("".join(WORDS))
    assert a.closed == 1 and b.closed == (1 if order == "concurrent" else 0)
    if order == "sequential":
        assert columns[1].record is None and columns[1].text == ""  # never sent
    else:
        assert columns[1].record.status == "stopped"


async def test_a_blind_round_sends_no_names_models_or_figures_before_the_vote():
    a = FakeBackend("alpha-engine", label="Alpha Engine", replies=[FakeReply(WORDS[:3], 0.01)])
    b = FakeBackend("beta-engine", label="Beta Engine", replies=[FakeReply(WORDS[:8], 0.03)])
    columns = await columns_for(fake_state(a, b), ("alpha-engine", "beta-engine"))
    snapshots = []

    async def render():
        snapshots.append(round_props(round_id="r1", columns=columns, blind=True, run_order="concurrent",
                                     reveal="finished", lang="en"))

    await RoundRun(columns, "concurrent", render, tick_s=0.02).run()
    final = round_props(round_id="r1", columns=columns, blind=True, run_order="concurrent", reveal="finished",
                        lang="en", final=True)
    for props in [*snapshots, final]:
        dumped = json.dumps(props)
        for secret in ("alpha", "Alpha", "beta", "Beta", "model", "ttft", "figures", "tokens"):
            assert secret not in dumped, (secret, dumped)
    # Which column finished first does not show: all "generating" until all have finished, text withheld.
    streaming_snapshots = [p for p in snapshots if any(c["state"] == "generating" for c in p["columns"])]
    assert streaming_snapshots
    assert all({c["state"] for c in p["columns"]} == {"generating"} and all(c["text"] == "" for c in p["columns"])
               for p in streaming_snapshots)
    assert [c["text"] for c in final["columns"]] == ["".join(WORDS[:3]), "".join(WORDS[:8])]
    revealed = round_props(round_id="r1", columns=columns, blind=True, run_order="concurrent", reveal="finished",
                           lang="en", revealed=True, vote={"outcome": "win", "winner": "A"}, final=True)
    assert [c["backend"] for c in revealed["columns"]] == ["Alpha Engine", "Beta Engine"]
    assert revealed["columns"][0]["figures"]["tokens"] == 3


def column_with(label: str, state: str, chunks: list[tuple[str, int]]) -> Column:
    """A column as it stands mid-round: its state and the (text, tokens) chunks received so far."""
    column = Column(label=label, backend=label.lower(), backend_label=label, state=state)
    for chunk_text, tokens in chunks:
        column.tokens += tokens
        column.parts.append(chunk_text)
        column.part_tokens.append(column.tokens)
    return column


def one_token_chunks(prefix: str, count: int) -> list[tuple[str, int]]:
    return [(f"{prefix}{i} ", 1) for i in range(count)]


def paced(columns, pace=None) -> list[str]:
    props = round_props(round_id="r", columns=columns, blind=True, run_order="concurrent", reveal="pace", lang="en",
                        pace=pace)
    return [c["text"] for c in props["columns"]]


def test_pace_counts_tokens_not_chunks():
    # B's engine sends three tokens per chunk: it has 3 tokens after 1 chunk, A has 5 in 5 chunks.
    a = column_with("A", "streaming", one_token_chunks("a", 5))
    b = column_with("B", "streaming", [("bbb ", 3)])
    assert paced([a, b]) == ["a0 a1 a2 ", "bbb "]
    # A chunk shows only once all of its tokens fit: B at 6 tokens, the pace at A's 5.
    b = column_with("B", "streaming", [("bbb ", 3), ("BBB ", 3)])
    assert paced([a, b]) == ["".join(a.parts), "bbb "]


def test_pace_a_finished_column_no_longer_holds_the_others_back():
    short = column_with("A", "completed", one_token_chunks("a", 2))
    failed = column_with("B", "error", [])
    slow = column_with("C", "streaming", one_token_chunks("c", 5))
    fast = column_with("D", "streaming", one_token_chunks("d", 9))
    assert paced([short, failed, slow, fast]) == ["a0 a1 ", "", "c0 c1 c2 c3 c4 ", "d0 d1 d2 d3 d4 "]


def test_live_reveal_shows_each_column_as_it_streams_and_still_no_name_or_figure():
    slow = column_with("A", "streaming", one_token_chunks("a", 2))
    fast = column_with("B", "streaming", one_token_chunks("b", 9))
    waiting = column_with("C", "waiting", [])
    props = round_props(round_id="r", columns=[slow, fast, waiting], blind=True, run_order="concurrent",
                        reveal="live", lang="en")
    assert [c["text"] for c in props["columns"]] == ["a0 a1 ", "".join(fast.parts), ""]
    for column in props["columns"]:
        assert set(column) == {"label", "text", "state", "error", "notes"}  # no backend, model or figures
        assert column["state"] == "generating"


def test_pace_in_sequential_order_moves_from_the_second_column_on_and_never_goes_back():
    pace = RevealPace()
    first = column_with("A", "streaming", one_token_chunks("a", 4))
    second, third = column_with("B", "waiting", []), column_with("C", "waiting", [])
    # The first column alone: its text would show its own speed, so nothing moves yet.
    assert paced([first, second, third], pace) == ["", "", ""]
    # The second runs: the first is shown at its pace, token for token.
    first = column_with("A", "completed", one_token_chunks("a", 6))
    second = column_with("B", "streaming", one_token_chunks("b", 3))
    assert paced([first, second, third], pace) == ["a0 a1 a2 ", "b0 b1 b2 ", ""]
    second = column_with("B", "streaming", one_token_chunks("b", 8))
    assert paced([first, second, third], pace) == ["".join(first.parts), "".join(second.parts), ""]
    # The third starts behind the pace (8 tokens): it shows nothing until it has caught up,
    # and what is shown does not go back.
    second = column_with("B", "completed", one_token_chunks("b", 8))
    third = column_with("C", "streaming", one_token_chunks("c", 2))
    assert paced([first, second, third], pace) == ["".join(first.parts), "".join(second.parts), ""]
    assert pace.tokens == 8
    third = column_with("C", "streaming", one_token_chunks("c", 10))
    assert paced([first, second, third], pace) == ["".join(first.parts), "".join(second.parts),
                                                   "".join(third.parts)]
    third = column_with("C", "streaming", one_token_chunks("c", 12))
    first_shown, second_shown, third_shown = paced([first, second, third], pace)
    assert third_shown == "".join(third.parts) and pace.tokens == 12
    third = column_with("C", "completed", one_token_chunks("c", 15))
    assert paced([first, second, third], pace) == [c.text for c in (first, second, third)]


async def paced_round(backends: list[FakeBackend], order: str, tick_s: float = 0.02):
    """Run a blind round with reveal "pace"; return (loop time, shown texts, all finished) per update."""
    columns = await columns_for(fake_state(*backends), tuple(b.name for b in backends))
    pace = RevealPace()
    loop = asyncio.get_running_loop()
    shown = []

    async def render():
        props = round_props(round_id="r", columns=columns, blind=True, run_order=order, reveal="pace",
                            lang="en", pace=pace)
        shown.append((loop.time(), [c["text"] for c in props["columns"]], all(c.finished for c in columns)))

    await RoundRun(columns, order, render, tick_s=tick_s).run()
    await render()  # the final update, as the Chainlit side sends it
    return columns, shown


def shown_tokens(shown_text: str, tokens_per_word: int) -> int:
    return len(shown_text.split()) * tokens_per_word


async def test_concurrent_columns_are_shown_at_one_pace_in_tokens():
    # The fast engine sends one token per chunk, the slow one three per chunk.
    fast = FakeBackend("fast", replies=[FakeReply(WORDS[:18], 0.01)])
    slow = FakeBackend("slow", replies=[FakeReply([f"s{i} " for i in range(6)], 0.09, tokens_per_word=3)])
    columns, shown = await paced_round([fast, slow], "concurrent")
    while_streaming = [texts for _, texts, done in shown if not done]
    assert any(texts[1] for texts in while_streaming), "the text moved before the end"
    for texts in while_streaming:
        fast_tokens, slow_tokens = shown_tokens(texts[0], 1), shown_tokens(texts[1], 3)
        # Token for token (the slow column moves in steps of its 3-token chunks), never chunk for chunk.
        assert slow_tokens <= fast_tokens < slow_tokens + 3, texts
        assert columns[0].text.startswith(texts[0]) and columns[1].text.startswith(texts[1])
    assert shown[-1][1] == [columns[0].text, columns[1].text]


async def test_sequential_columns_are_shown_at_one_pace_before_the_last_one_starts():
    backends = [FakeBackend(name, replies=[FakeReply(WORDS[:8], 0.02)]) for name in ("first", "second", "third")]
    columns, shown = await paced_round(backends, "sequential")
    first, second, third = backends
    # Nothing while the first ran alone (and the screen was drawn in that time).
    alone = [texts for at, texts, _ in shown if at < second.started_at[0]]
    assert alone and all(texts == ["", "", ""] for texts in alone)
    before_the_last = [texts for at, texts, _ in shown if second.started_at[0] < at < third.started_at[0]]
    assert any(texts[0] and texts[1] for texts in before_the_last)
    for texts in before_the_last:
        assert len(texts[0].split()) == len(texts[1].split()) and texts[2] == ""
    lengths = [max(len(text.split()) for text in texts) for _, texts, _ in shown]
    assert lengths == sorted(lengths), "what is shown never goes back"
    assert shown[-1][1] == [c.text for c in columns]


async def test_an_unnamed_error_says_what_kind_of_failure_only():
    failing = FakeBackend("secret-engine", label="Secret Engine", url="http://10.0.0.9:1234/v1",
                          replies=[FakeReply(WORDS, fail_after=1)])
    ok = FakeBackend("ok")
    columns = await columns_for(fake_state(failing, ok), ("secret-engine", "ok"))
    await RoundRun(columns, "concurrent", Renders()).run()
    unnamed = columns[0].error_text("en", named=False)
    assert "capacity" in unnamed and "Secret" not in unnamed and "10.0.0.9" not in unnamed


@pytest.mark.parametrize("blind", [False, True])
def test_a_rounds_columns_show_an_image_from_elsewhere_as_a_link_with_its_address(blind: bool):
    """Each refresh carries every column's whole text: a remote image in it is a link there, split
    into chunks mid-address or not (core/images.py); an image on the app's own origin stays."""
    chunks = [("Look: ![a cat](htt", 1), ("ps://evil.example/cat.png) and ", 1), ("![own](/public/x.png)", 1)]
    columns = [column_with("A", "completed", chunks), column_with("B", "completed", [("plain", 1)])]
    props = round_props(round_id="r", columns=columns, blind=blind, run_order="concurrent", reveal="finished",
                        lang="en", final=True)
    assert props["columns"][0]["text"] == (
        'Look: [image not shown \\(\\"a cat\\"\\)\\: https\\:\\/\\/evil\\.example\\/cat\\.png]'
        '(<https\\:\\/\\/evil\\.example\\/cat\\.png>) and ![own](/public/x.png)')
    assert props["columns"][1]["text"] == "plain"


async def test_each_columns_first_text_is_drawn_at_once_not_at_the_next_tick():
    """A round is drawn once per tick, but a column's first text goes out when it comes: with a
    1 s tick, each column's first word is drawn within a few ms of arriving (control: a later word
    waits for the tick)."""
    loop = asyncio.get_running_loop()
    early = FakeBackend("early", replies=[FakeReply(WORDS[:3], 0.02)])
    late = FakeBackend("late", replies=[FakeReply(WORDS[:3], 0.3)])
    columns = await columns_for(fake_state(early, late), ("early", "late"))
    drawn: list[tuple[float, tuple[str, ...]]] = []

    async def render():
        drawn.append((loop.time(), tuple(column.text for column in columns)))

    await RoundRun(columns, "concurrent", render, tick_s=1.0).run()

    def first_drawn(index: int, text: str) -> float:
        return next(at for at, texts in drawn if texts[index].startswith(text))

    started = min(early.started_at[0], late.started_at[0])
    assert first_drawn(0, WORDS[0]) - started < 0.1  # its first word came after ~0.02 s
    assert first_drawn(1, WORDS[0]) - started < 0.4  # after ~0.3 s, not at the 1 s tick
    # Control: the early column's later words came within its first 0.06 s and waited for a tick.
    assert first_drawn(0, "".join(WORDS[:3])) - started > 0.2
