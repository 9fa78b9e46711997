"""The blind rule per person (core/disclosure.py) without a browser: one person's rule is shared by
all their sessions in a process, holds replies from a waiting round's backends, can be given up
(the round is then not rated), is read from the database once and again only after a change, and
says "unsure" while the database cannot say. Rounds run their sequential columns in a random order;
Stop before the vote marks the round as one whose vote saw speed. Fake backends; SQLite where a
database is needed (tests/test_blind_replicas.py does PostgreSQL and two replicas)."""

from __future__ import annotations

import asyncio
from dataclasses import replace

import pytest

from core.disclosure import (HIDDEN, STALE_AFTER_S, Disclosure, DisclosureBook, HeldRound, identifying_words,
                             person_key)
from core.figures import live_props
from core.ratings.battles import Battle, PromptCatalogue, Side, battle_from_json, battle_to_json, battles_from_votes
from core.ratings.controlled import covariate_matrix
from core.replies import ReplyPlan, answer
from core.round_flow import cast_vote, close_class_rounds, give_up_rounds, play
from core.rounds import RoundRun, random_run_sequence
from core.session_state import LabSession
from core.settings import SessionSettings
from core.streaming import consume
from core.timing import LiveFigures
from store import StoreError
from store.records import UNRATED_CLOSED_BY_TEACHER, UNRATED_SHOWN_BEFORE_VOTE
from tests.fakes import FakeBackend, FakeReply, fake_state
from ui.browser_id import COOKIE, BrowserId, browser_id
from tests.virtual_time import run_in_virtual_time

WORDS = [f"w{i} " for i in range(40)]


# ---------------------------------------------------------------- helpers


def held(*backends: str) -> HeldRound:
    return HeldRound(frozenset(backends) | {f"{name}-model" for name in backends}, frozenset(backends))


def session_of(state, person: str, *, mode: str = "blind", backend: str = "left",
               compare: tuple[str, ...] = ("left", "right"), run_order: str = "concurrent",
               reveal: str = "finished") -> LabSession:
    settings = replace(SessionSettings.initial(state.defaults, state.presets, state.registry.names),
                       mode=mode, backend=backend, compare_backends=compare, run_order=run_order, reveal=reveal)
    return LabSession(settings=settings, person=person, disclosure=state.disclosures.person(person))


class Display:
    """core.round_flow.RoundDisplay, keeping what it was told."""

    def __init__(self) -> None:
        self.waited, self.notices, self.rounds = [], [], []

    async def not_possible(self, reason: str) -> None:
        raise AssertionError(reason)

    async def waits(self, wait) -> None:
        self.waited.append(wait)

    async def show(self, round_):
        self.rounds.append(round_)

        async def redraw() -> None:
            return None

        return redraw

    async def notice(self, notice) -> None:
        self.notices.append(notice)

    async def backends_checked(self, failed) -> None:
        return None


class ChatView:
    """core.replies.ReplyView, keeping what it was told and the plans it streamed."""

    def __init__(self) -> None:
        self.waited, self.notices, self.plans = [], [], []

    async def notice(self, notice) -> None:
        self.notices.append(notice)

    async def failed(self, label: str, reason: str) -> None:
        raise AssertionError(f"{label}: {reason}")

    async def waits(self, wait) -> None:
        self.waited.append(wait)

    async def stream(self, plan: ReplyPlan):
        self.plans.append(plan)
        return await consume(plan.open_stream()), f"reply-{len(self.plans)}"

    async def backends_checked(self, failed) -> None:
        return None


def pair(words: int = 40, interval_s: float = 0.01, replies: int = 3):
    left = FakeBackend("left", label="Left Engine", url="http://10.9.9.1:8001/v1",
                       replies=[FakeReply(WORDS[:words], interval_s) for _ in range(replies)])
    right = FakeBackend("right", label="Right Engine", url="http://10.9.9.2:8002/v1",
                        replies=[FakeReply(WORDS[:words], interval_s) for _ in range(replies)])
    return left, right


def sqlite_state(tmp_path, *backends):
    state = fake_state(*backends)
    state.database_url, state.storage_problem, state._storage_tried = f"sqlite:///{tmp_path / 'lab.db'}", None, False
    return state


async def close(state) -> None:
    if state._store is not None:
        await state._store.aclose()


# ---------------------------------------------------------------- the rule itself


def test_a_person_is_the_user_else_the_browser_as_a_digest_else_the_session():
    assert person_key(user="alice", browser_id="b" * 24, session_id="s1") == "user:alice"
    browser = person_key(user=None, browser_id="secret-browser-id-123", session_id="s1")
    assert browser.startswith("browser:") and "secret" not in browser
    assert browser == person_key(user=None, browser_id="secret-browser-id-123", session_id="s2")
    assert person_key(user=None, browser_id=None, session_id="s1") == "session:s1"


def test_a_waiting_round_holds_views_and_replies_from_its_backends_only():
    rule = Disclosure("user:alice")
    rule.hide("r1", identifying_words(name="left", label="Left Engine", url="http://10.9.9.1:8001/v1"),
              ("left", "right"))
    assert rule.refusal("engines").key == "blind_wait" and rule.refusal("status") is not None
    assert rule.load_refusal() is not None
    assert not rule.health_shown() and not rule.engine_state_shown() and not rule.panel_allowed("compare")
    assert rule.reply_wait(["left"]).key == "blind_wait_reply"
    assert rule.reply_wait(["right", "third"]) is not None
    assert rule.reply_wait(["third"]) is None  # another backend's reply says nothing of this round
    assert rule.screen("Left Engine at 10.9.9.1:8001 failed") == f"{HIDDEN} at {HIDDEN} failed"


def test_giving_up_releases_only_the_rounds_that_share_a_backend():
    rule = Disclosure("user:alice")
    rule.hide("r1", {"left"}, ("left", "right"))
    rule.hide("r2", {"third"}, ("third", "fourth"))
    assert rule.give_up(["left"]) == ["r1"]
    assert rule.reply_wait(["left"]) is None and rule.reply_wait(["third"]) is not None
    assert rule.give_up(None) == ["r2"] and rule.waiting_rounds == 0


def test_a_read_keeps_rounds_not_yet_written_and_never_brings_back_a_released_one():
    rule = Disclosure("user:alice")
    rule.hide("local", {"left"}, ("left",))  # started here, its row not written yet
    rule.load({"elsewhere": held("right")})
    assert rule.waiting_rounds == 2 and rule.reply_wait(["right"]) is not None
    rule.stored("local")  # written: from now on the database speaks for it
    rule.reveal("elsewhere")  # voted on here, while a read that still has it was under way
    rule.load({"elsewhere": held("right")})
    assert rule.waiting_rounds == 0  # "local" was voted on elsewhere (absent), "elsewhere" stays released


def test_the_queue_position_is_not_shown_while_the_rule_holds():
    figures = LiveFigures(elapsed_s=1.0, first_token_s=None, output_tokens=0, decode_tokens_per_s=None,
                          tokens_exact=True, queue_position=3)
    shown = live_props(figures, backend="x", model="m", lang="en")
    assert shown["state"] == "queued" and shown["queuePosition"] == 3
    hidden = live_props(figures, backend="x", model="m", lang="en", queue_shown=False)
    assert hidden["queuePosition"] is None and hidden["state"] == "starting"


# ---------------------------------------------------------------- the book: read once, again on change


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


async def test_one_rule_per_person_read_once_and_again_only_after_a_change():
    reads = []

    async def read(person):
        reads.append(person)
        return {"r1": held("left")} if person == "user:alice" else {}

    book = DisclosureBook(read, clock=Clock())
    book.feed_live = True
    first, second = book.person("user:alice"), book.person("user:alice")
    assert first is second and book.person("user:bob") is not first
    for _ in range(50):  # fifty views: one read
        assert (await book.current("user:alice")).reply_wait(["left"]) is not None
    assert reads == ["user:alice"]
    book.changed("user:bob")  # someone else's change: alice's answer holds
    await book.current("user:alice")
    assert reads == ["user:alice"]
    book.changed("user:alice")
    await book.current("user:alice")
    assert reads == ["user:alice"] * 2


async def test_without_a_change_feed_an_answer_is_read_again_after_a_moment():
    reads = []

    async def read(person):
        reads.append(person)
        return {}

    clock = Clock()
    book = DisclosureBook(read, clock=clock)  # no feed, not one process: answers age
    kept = book.person("user:alice")  # a session holds it (the book keeps no one nobody holds)
    await book.current("user:alice")
    await book.current("user:alice")
    assert len(reads) == 1
    clock.now += STALE_AFTER_S + 0.1
    assert await book.current("user:alice") is kept
    assert len(reads) == 2


async def test_a_person_never_read_is_unsure_while_the_database_cannot_say_and_kept_after():
    failing = True

    async def read(person):
        if failing:
            raise StoreError("the database is unavailable")
        return {"r1": held("left")}

    clock = Clock()
    book = DisclosureBook(read, clock=clock)
    book.feed_live = True
    rule = await book.current("user:alice")  # kept by this test, as a session keeps it
    assert rule.unsure and rule.refusal("status").key == "blind_wait_unsure" and not rule.health_shown()
    assert rule.reply_wait(["left"]) is None  # replies go during an outage (README)
    failing = False
    clock.now += 10
    rule = await book.current("user:alice")
    assert not rule.unsure and rule.reply_wait(["left"]) is not None
    failing = True
    book.changed("user:alice")
    rule = await book.current("user:alice")
    assert not rule.unsure and rule.waiting_rounds == 1  # read once: the last answer holds meanwhile


def test_a_slow_read_holds_a_view_at_most_the_wait_and_counts_as_unsure_meanwhile():
    """On a virtual clock (tests/virtual_time.py): the view waits exactly its 0.2 s for a read that
    has not answered, then goes on unsure; the read's answer, when it comes, settles the rule."""

    async def main():
        release = asyncio.Event()

        async def read(person):
            await release.wait()
            return {}

        book = DisclosureBook(read)
        loop = asyncio.get_running_loop()
        started = loop.time()
        rule = await book.current("user:alice", wait_s=0.2)
        held_s, unsure_while_held = loop.time() - started, rule.unsure
        release.set()
        await asyncio.sleep(0.05)
        return held_s, unsure_while_held, rule.unsure

    held_s, unsure_while_held, unsure_after = run_in_virtual_time(main())
    assert held_s == pytest.approx(0.2) and unsure_while_held and not unsure_after


async def test_the_deployment_is_open_while_anyone_has_a_round_here_or_in_the_database():
    count = 0

    async def count_open():
        return count

    book = DisclosureBook(lambda person: asyncio.sleep(0, {}), count_open)
    book.feed_live = True
    assert not await book.deployment_open()
    rule = book.person("user:bob")
    rule.hide("r1", {"left"}, ("left",))  # bob's round, not written yet: open at once
    assert await book.deployment_open()
    rule.stored("r1")
    count = 1
    assert await book.deployment_open()
    count = 0
    book.changed("user:bob")  # bob voted on another replica
    assert not await book.deployment_open()

    async def failing():
        raise StoreError("down")

    book.count_open = failing
    book.changed(None)
    assert await book.deployment_open()  # the database cannot say: open


# ---------------------------------------------------------------- through the flows


async def test_a_blind_round_in_one_session_holds_the_same_persons_other_session_at_once():
    left, right = pair(interval_s=0.02)
    third = FakeBackend("third", label="Third Engine", replies=[FakeReply(WORDS[:3])])
    state = fake_state(left, right, third)
    tab1 = session_of(state, "user:alice")
    tab2 = session_of(state, "user:alice", mode="chat", backend="left")
    other_person = session_of(state, "user:bob", mode="chat", backend="left")
    round_task = asyncio.create_task(play(state, tab1, "hello", Display(), thread_id=None, user="alice", lang="en"))
    await asyncio.sleep(0.1)  # the round streams
    assert tab2.disclosure is tab1.disclosure
    view = ChatView()
    await answer(state, tab2, "hello", view, thread_id=None, user="alice")
    assert [wait.key for wait in view.waited] == ["blind_wait_reply"] and view.plans == []
    assert tab2.pending == "hello"
    assert tab2.disclosure.refusal("engines") is not None
    # Another backend answers, without the engine's state at its start; another person is not held.
    tab2.settings = replace(tab2.settings, backend="third")
    await answer(state, tab2, "hi", view, thread_id=None, user="alice")
    assert len(view.plans) == 1 and view.plans[0].engine_summary() is None
    compare = Display()  # a compare round on the same backends, from the other tab: waits too
    tab2.settings = replace(tab2.settings, mode="compare")
    assert await play(state, tab2, "hello", compare, thread_id=None, user="alice", lang="en") is None
    assert [wait.key for wait in compare.waited] == ["blind_wait_reply"] and compare.rounds == []
    bob_view = ChatView()
    await answer(state, other_person, "hello", bob_view, thread_id=None, user="bob")
    assert bob_view.waited == [] and len(bob_view.plans) == 1
    round_ = await round_task
    assert round_ is not None and tab2.disclosure.waiting_rounds == 1  # still waits for its vote


async def test_a_second_round_on_the_same_backends_waits_for_the_first_ones_vote(tmp_path):
    left, right = pair(words=4)
    state = sqlite_state(tmp_path, left, right)
    try:
        tab = session_of(state, "user:alice")
        first = await play(state, tab, "hello", Display(), thread_id="t1", user="alice", lang="en")
        display = Display()
        assert await play(state, tab, "hello again", display, thread_id="t1", user="alice", lang="en") is None
        assert [wait.key for wait in display.waited] == ["blind_wait_reply"] and tab.pending == "hello again"
        result = await cast_vote(state, tab, {"round_id": first.round_id, "outcome": "tie"}, thread_id="t1",
                                 user="alice", lang="en")
        assert result.ok and "not rated" not in result.message
        assert await play(state, tab, "hello again", Display(), thread_id="t1", user="alice", lang="en") is not None
    finally:
        await close(state)


async def test_insisting_gives_the_round_up_on_every_replica_and_its_vote_is_kept_not_rated(tmp_path):
    left, right = pair(words=4)
    state = sqlite_state(tmp_path, left, right)
    try:
        tab1 = session_of(state, "user:alice")
        round_ = await play(state, tab1, "hello", Display(), thread_id="t1", user="alice", lang="en")
        store = await state.storage()
        assert [r.id for r in await store.waiting_blind_rounds("user:alice")] == [round_.round_id]
        tab2 = session_of(state, "user:alice", mode="chat", backend="right")
        notice = await give_up_rounds(state, tab2, ["right"])
        assert notice.key == "blind_given_up" and notice.values == {"rounds": 1}
        assert tab1.disclosure.refusal("engines") is None
        assert await store.waiting_blind_rounds("user:alice") == []
        assert (await store.get_round(round_.round_id)).not_blind_reason == UNRATED_SHOWN_BEFORE_VOTE
        view = ChatView()
        await answer(state, tab2, "hello", view, thread_id="t2", user="alice")
        assert view.waited == [] and len(view.plans) == 1
        result = await cast_vote(state, tab1, {"round_id": round_.round_id, "outcome": "win", "winner": "A"},
                                 thread_id="t1", user="alice", lang="en")
        assert result.ok and "kept but not rated" in result.message
        (record,) = await store.votes()
        assert record.vote.unrated_reason == UNRATED_SHOWN_BEFORE_VOTE and not record.rated
    finally:
        await close(state)


async def test_a_teacher_closes_every_open_round_of_the_class_a_student_cannot_and_a_late_vote_is_not_rated(tmp_path):
    left, right = pair(words=4, replies=6)
    state = sqlite_state(tmp_path, left, right)
    state.auth = replace(state.auth, users={"alice": "x", "bob": "x", "teacher": "x"}, teachers=frozenset({"teacher"}))
    try:
        alice, bob = session_of(state, "user:alice"), session_of(state, "user:bob")
        first = await play(state, alice, "hello", Display(), thread_id="t1", user="alice", lang="en")
        await play(state, bob, "hello", Display(), thread_id="t2", user="bob", lang="en")
        voted = await play(state, bob, "again", Display(), thread_id="t2", user="bob", lang="en")
        assert voted is None  # bob's second round waits for his first one's vote: vote on it instead
        assert await state.disclosures.deployment_open()
        assert (await close_class_rounds(state, "bob")).key == "close_rounds_teachers_only"
        store = await state.storage()
        assert len(await store.waiting_blind_rounds("user:alice")) == 1  # control: nothing closed by bob

        notice = await close_class_rounds(state, "teacher")
        assert notice.key == "rounds_closed" and notice.values == {"rounds": 2, "people": 2}
        assert alice.disclosure.refusal("engines") is None and bob.disclosure.refusal("engines") is None
        assert not await state.disclosures.deployment_open()
        assert (await store.get_round(first.round_id)).not_blind_reason == UNRATED_CLOSED_BY_TEACHER
        result = await cast_vote(state, alice, {"round_id": first.round_id, "outcome": "win", "winner": "A"},
                                 thread_id="t1", user="alice", lang="en")
        assert result.ok and "kept but not rated" in result.message
        (record,) = await store.votes()
        assert record.vote.unrated_reason == UNRATED_CLOSED_BY_TEACHER and not record.rated
        assert (await close_class_rounds(state, "teacher")).key == "no_rounds_open"
    finally:
        await close(state)


async def test_without_login_the_one_person_may_close_the_rounds_and_a_round_holds_ten_minutes():
    from core.app_state import AppState

    state = AppState.from_env({"BACKENDS": "llama_cpp"})
    assert not state.auth.enabled and state.blind_open_s == 600
    left, right = pair()
    assert (await close_class_rounds(fake_state(left, right), None)).key != "close_rounds_teachers_only"
    with_login = AppState.from_env({"BACKENDS": "llama_cpp", "AUTH_USERS": "a:pbkdf2_sha256$1$c2FsdA==$aGFzaA==",
                                    "CHAINLIT_AUTH_SECRET": "s" * 40})
    assert with_login.blind_open_s == 7200
    assert AppState.from_env({"BACKENDS": "llama_cpp", "BLIND_OPEN_S": "60"}).blind_open_s == 60


async def test_sequential_rounds_run_their_columns_in_a_random_order_not_a_b_c():
    orders = {random_run_sequence(3) for _ in range(200)}
    assert len(orders) == 6  # every order of three columns comes up
    first_engines = set()
    for _ in range(30):
        left, right = pair(words=2)
        state = fake_state(left, right)
        tab = session_of(state, f"session:{_}", run_order="sequential")
        round_ = await play(state, tab, "hello", Display(), thread_id=None, user=None, lang="en")
        ran_first = min((left, right), key=lambda backend: backend.started_at[0])
        column_a = round_.columns[0].backend
        first_engines.add(ran_first.name == column_a)
        assert max(left.started_at[0], right.started_at[0]) >= min(left.ended_at[0], right.ended_at[0])
    assert first_engines == {True, False}  # column A ran first in some rounds, second in others


async def test_a_run_sequence_must_be_an_order_of_the_columns():
    with pytest.raises(ValueError):
        RoundRun([], "sequential", lambda: asyncio.sleep(0), sequence=(0,))


@pytest.mark.parametrize("reveal", ["finished", "pace"])
async def test_stop_during_a_blind_round_marks_its_vote_as_one_that_saw_speed(tmp_path, reveal):
    left, right = pair(interval_s=0.03)
    state = sqlite_state(tmp_path, left, right)
    try:
        tab = session_of(state, "user:alice", reveal=reveal)
        display = Display()
        task = asyncio.create_task(play(state, tab, "hello", display, thread_id="t1", user="alice", lang="en"))
        await asyncio.sleep(0.4)
        task.cancel()  # Stop
        round_ = await task
        assert round_.speed_seen and [n.key for n in display.notices][0] == "round_speed_seen"
        store = await state.storage()
        assert (await store.get_round(round_.round_id)).speed_seen is True
        assert (await cast_vote(state, tab, {"round_id": round_.round_id, "outcome": "win", "winner": "A"},
                                thread_id="t1", user="alice", lang="en")).ok
        records = await store.votes(with_replies=True)
        assert records[0].speed_seen and records[0].rated
        (battle,) = battles_from_votes(records, PromptCatalogue({}))
        assert battle.speed_shown and battle.speed_seen and battle.reveal == reveal
    finally:
        await close(state)


def test_a_vote_that_saw_speed_carries_its_speed_difference_and_one_that_did_not_carries_none():
    fast = Side("fast", first_token_s=0.1, decode_tokens_per_s=80.0)
    slow = Side("slow", first_token_s=0.4, decode_tokens_per_s=20.0)
    unseen = Battle("r1", fast, slow, "model_a", reveal="finished")
    stopped = replace(unseen, speed_seen=True)
    assert not unseen.speed_shown and stopped.speed_shown
    assert covariate_matrix([unseen], ["first_token", "decode"]).tolist() == [[0.0, 0.0]]
    assert covariate_matrix([stopped], ["first_token", "decode"]).tolist() == [[2.0, 2.0]]
    # And in an exported file and back.
    assert battle_from_json(battle_to_json(stopped)).speed_seen and not battle_from_json(battle_to_json(unseen)).speed_seen


async def test_a_round_stopped_before_any_text_still_counts_as_one_that_saw_no_speed(tmp_path):
    left = FakeBackend("left", replies=[FakeReply(WORDS, 0.5)])
    right = FakeBackend("right", replies=[FakeReply(WORDS, 0.5)])
    state = sqlite_state(tmp_path, left, right)
    try:
        tab = session_of(state, "user:alice")
        display = Display()
        task = asyncio.create_task(play(state, tab, "hello", display, thread_id="t1", user="alice", lang="en"))
        await asyncio.sleep(0.2)
        task.cancel()
        round_ = await task
        assert not round_.speed_seen and "round_speed_seen" not in [n.key for n in display.notices]
        assert not (await (await state.storage()).get_round(round_.round_id)).speed_seen
    finally:
        await close(state)


# ---------------------------------------------------------------- the browser's id


def test_a_browser_id_is_read_only_from_its_own_cookie():
    assert browser_id(f"{COOKIE}=abcdefghijklmnopqrstuvwx; other=1") == "abcdefghijklmnopqrstuvwx"
    assert browser_id("other=1") is None and browser_id(None) is None
    assert browser_id(f"{COOKIE}=short") is None and browser_id(f'{COOKIE}="a b"') is None


async def test_every_answer_without_a_browser_id_sets_one_and_never_replaces_one():
    async def app(scope, receive, send):
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    middleware = BrowserId(app)

    async def headers_for(cookie: str | None) -> list[tuple[bytes, bytes]]:
        sent = []

        async def send(message):
            sent.append(message)

        scope = {"type": "http", "scheme": "http", "headers": [(b"cookie", cookie.encode())] if cookie else []}
        await middleware(scope, None, send)
        return sent[0]["headers"]

    first = dict(await headers_for(None))[b"set-cookie"].decode()
    assert first.startswith(f"{COOKIE}=") and "HttpOnly" in first and "SameSite=Lax" in first
    value = first.split(";")[0].split("=", 1)[1]
    assert browser_id(f"{COOKIE}={value}") == value
    assert await headers_for(f"{COOKIE}={value}") == []
    assert dict(await headers_for(None))[b"set-cookie"].decode() != first  # a new browser, a new id
