"""The login limits' rules (core/login_limits.py) on a hand-driven clock, the hashing turns, the device
cookies, the settings, and the table shared by replicas on a real PostgreSQL (store/login_attempts.py).
The real app with two replicas is in tests/test_login_limits_app.py."""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time

import pytest

from config import ConfigurationError
from core.auth import AuthConfig, hash_password
from core.login_limits import (CLEAN, DEVICE, SUSPECT, Busy, DeviceCookies, HashingTurns, LimitSettings, LoginLimits,
                               address_key, growing_delay_s)
from store import Store, normalise_url
from store.db import create_engine
from store.login_attempts import FallbackAttempts, LocalAttempts, SharedAttempts
from tests.fixtures_postgres import new_postgres_database

SECRET = "test-secret"


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def limits_on(clock: Clock, **settings) -> LoginLimits:
    return LoginLimits(LimitSettings(**settings), secret=SECRET, clock=clock)


async def test_a_pair_gets_its_free_failures_then_waits_that_double_each_time():
    clock = Clock()
    limits = limits_on(clock, free_failures=3, max_delay_s=5)
    for _ in range(3):
        assert (await limits.admit("alice", "10.0.0.9", known=True)).admitted
    refused = await limits.admit("alice", "10.0.0.9", known=True)
    assert not refused.admitted and refused.wait_s == 1.0 and refused.held_by == "name"
    waits = []
    for _ in range(5):
        clock.now += (await limits.admit("alice", "10.0.0.9", known=True)).wait_s
        assert (await limits.admit("alice", "10.0.0.9", known=True)).admitted
        waits.append((await limits.admit("alice", "10.0.0.9", known=True)).wait_s)
    assert waits == [2.0, 4.0, 5.0, 5.0, 5.0]  # doubling, up to max_delay_s: never a lock
    assert [growing_delay_s(n, 3, 900) for n in (1, 2, 3, 4, 10)] == [0, 0, 1, 2, 128]


async def test_a_guesser_from_another_address_never_delays_the_right_person():
    clock = Clock()
    limits = limits_on(clock, free_failures=5, address_free_failures=30)
    for _ in range(40):
        await limits.admit("alice", "198.51.100.66", known=True)  # the guesser, refused after 5
    assert not (await limits.admit("alice", "198.51.100.66", known=True)).admitted
    alice = await limits.admit("alice", "10.0.0.7", known=True)  # alice, from her own address
    assert alice.admitted and alice.priority == CLEAN
    await limits.succeeded("alice", "10.0.0.7")
    assert not (await limits.admit("alice", "198.51.100.66", known=True)).admitted  # still slowed


async def test_a_right_password_forgets_the_pairs_failures_and_leaves_the_address_count():
    clock = Clock()
    limits = limits_on(clock, free_failures=2, address_free_failures=3)
    for _ in range(2):
        await limits.admit("alice", "10.0.0.7", known=True)
    await limits.succeeded("alice", "10.0.0.7")
    for _ in range(2):  # two fresh free failures
        assert (await limits.admit("alice", "10.0.0.7", known=True)).admitted
    assert not (await limits.admit("alice", "10.0.0.7", known=True)).admitted
    # The address counted 4 attempts and 1 success: 3 failures, its limit, so an unknown name waits.
    assert (await limits.admit("nobody", "10.0.0.7", known=False)).held_by == "address"


async def test_failures_are_forgotten_after_twice_the_longest_delay_without_one():
    clock = Clock()
    limits = limits_on(clock, free_failures=1, max_delay_s=10)
    assert (await limits.admit("alice", "a", known=True)).admitted
    assert not (await limits.admit("alice", "a", known=True)).admitted
    clock.now += 1
    assert (await limits.admit("alice", "a", known=True)).admitted  # 2nd failure: next wait 2 s
    clock.now += 19.9
    assert (await limits.admit("alice", "a", known=True)).admitted
    assert (await limits.admit("alice", "a", known=True)).wait_s == pytest.approx(4.0)  # still counted: 3 failures
    clock.now += 20.1
    assert (await limits.admit("alice", "a", known=True)).admitted
    assert (await limits.admit("alice", "a", known=True)).wait_s == pytest.approx(1.0)  # forgotten: one failure again


async def test_an_address_past_its_limit_holds_back_unknown_names_and_failing_pairs_never_clean_ones():
    clock = Clock()
    limits = limits_on(clock, free_failures=5, address_free_failures=10, address_max_delay_s=60)
    nat = "203.0.113.1"
    for number in range(40):  # one student's junk: new unknown names from the school's one address
        await limits.admit(f"junk{number}", nat, known=False)
    junk = await limits.admit("junk-more", nat, known=False)
    assert not junk.admitted and junk.held_by == "address"
    # The refused junk was not counted: the address waits 1 s (its 10th failure), not 2**30 s.
    assert junk.wait_s == 1.0
    for classmate in range(30):  # known names that have not failed from here: every one admitted
        verdict = await limits.admit(f"student{classmate}", nat, known=True)
        assert verdict.admitted and verdict.priority == CLEAN
        await limits.succeeded(f"student{classmate}", nat)
    # A typo is no suspicion; a second failure of the same pair is: it waits with the address.
    assert (await limits.admit("student0", nat, known=True)).admitted
    assert (await limits.admit("student0", nat, known=True)).admitted
    held = await limits.admit("student0", nat, known=True)
    assert not held.admitted and held.held_by == "address"
    clock.now += held.wait_s
    again = await limits.admit("student0", nat, known=True)
    assert again.admitted and again.priority == SUSPECT
    # Another address is untouched by this one's delay.
    assert (await limits.admit("junk-more", "203.0.113.2", known=False)).admitted


async def test_a_browser_with_a_device_cookie_counts_apart_from_its_address():
    clock = Clock()
    limits = limits_on(clock, free_failures=3)
    nat = "203.0.113.1"
    device = limits.devices.device(limits.devices.issue("alice"), "alice")
    for _ in range(10):  # a classmate behind the same address guesses alice's password
        await limits.admit("alice", nat, known=True)
    assert not (await limits.admit("alice", nat, known=True)).admitted  # without her browser: slowed
    with_cookie = await limits.admit("alice", nat, known=True, device=device)
    assert with_cookie.admitted and with_cookie.priority == DEVICE


async def test_attempts_sent_together_cannot_all_pass_before_the_first_fails():
    limits = limits_on(Clock(), free_failures=4)
    verdicts = await asyncio.gather(*(limits.admit("alice", "a", known=True) for _ in range(30)))
    assert sum(verdict.admitted for verdict in verdicts) == 4


class CountingTable(LocalAttempts):
    """The table in a process, counting how often it is asked."""

    def __init__(self, clock: Clock) -> None:
        super().__init__(clock=clock)
        self.asked = 0

    async def apply(self, pair_key, address_key, rule):
        self.asked += 1
        return await super().apply(pair_key, address_key, rule)


async def test_a_refusal_is_remembered_until_it_ends_and_only_for_what_it_refused():
    clock = Clock()
    table = CountingTable(clock)
    limits = LoginLimits(LimitSettings(free_failures=2, address_free_failures=3), secret=SECRET, table=table,
                         clock=clock)
    for _ in range(3):
        await limits.admit("alice", "x", known=True)
    asked = table.asked
    repeats = [await limits.admit("alice", "x", known=True) for _ in range(50)]  # a flood, refused
    assert table.asked == asked and not any(v.admitted for v in repeats)
    assert repeats[-1].wait_s == pytest.approx(1.0) and repeats[-1].held_by == "name"
    assert (await limits.admit("alice", "y", known=True)).admitted  # another pair: asked, admitted
    clock.now += 1.0
    assert (await limits.admit("alice", "x", known=True)).admitted  # its time is up: asked again
    # An address held for unknown names: they are refused from memory, a known name is still asked.
    for number in range(3):
        await limits.admit(f"junk{number}", "nat", known=False)
    assert (await limits.admit("junk-a", "nat", known=False)).held_by == "address"
    asked = table.asked
    assert (await limits.admit("junk-b", "nat", known=False)).held_by == "address" and table.asked == asked
    assert (await limits.admit("student", "nat", known=True)).admitted and table.asked == asked + 1


def test_device_cookies_are_bound_to_a_name_and_to_the_secret():
    cookies = DeviceCookies(SECRET)
    cookie = cookies.issue("alice")
    device = cookies.device(cookie, "alice")
    assert device and cookie.startswith(device + ".")
    assert cookies.device(cookie, "bob") is None  # no other name
    assert DeviceCookies("another secret").device(cookie, "alice") is None
    nonce, signature = cookie.split(".")
    assert cookies.device(f"{nonce}.{signature[:-1]}0" if signature[-1] != "0" else f"{nonce}.{signature[:-1]}1",
                          "alice") is None
    assert cookies.device(f"other{nonce}.{signature}", "alice") is None
    assert cookies.device(None, "alice") is None and cookies.device("garbage", "alice") is None
    assert cookies.issue("alice", device) == cookie  # the same browser keeps its id


def test_addresses_are_counted_by_ipv4_and_by_the_ipv6_slash_64():
    assert address_key("192.0.2.7") == "192.0.2.7"
    assert address_key("2001:db8:1:2:aaaa::1") == address_key("2001:db8:1:2:bbbb::9") == "2001:db8:1:2::/64"
    assert address_key("2001:db8:1:3::1") != address_key("2001:db8:1:2::1")
    assert address_key("::ffff:192.0.2.7") == "192.0.2.7"
    assert address_key(None) == "unknown" and address_key("testclient") == "testclient"


async def test_the_table_in_a_process_is_bounded_by_the_keys_it_remembers():
    clock = Clock()
    table = LocalAttempts(clock=clock, max_keys=100)
    limits = LoginLimits(LimitSettings(free_failures=1), secret=SECRET, table=table, clock=clock)
    for number in range(1000):
        await limits.admit(f"unknown-{number}", f"10.0.{number // 250}.{number % 250}", known=False)
    assert len(table) == 100
    assert not (await limits.admit("unknown-999", "10.0.3.249", known=False)).admitted  # the newest are kept


def test_the_limits_settings_come_from_env_and_a_mistake_names_the_variable():
    assert LimitSettings.from_env({}) == LimitSettings()
    assert LimitSettings.from_env({"LOGIN_FREE_FAILURES": "8", "LOGIN_MAX_DELAY_S": "120",
                                   "LOGIN_ADDRESS_FREE_FAILURES": " 50 ", "LOGIN_ADDRESS_MAX_DELAY_S": "7.5"}) \
        == LimitSettings(free_failures=8, max_delay_s=120, address_free_failures=50, address_max_delay_s=7.5)
    for variable, raw in [("LOGIN_FREE_FAILURES", "0"), ("LOGIN_FREE_FAILURES", "2.5"),
                          ("LOGIN_MAX_DELAY_S", "0.5"), ("LOGIN_MAX_DELAY_S", "nan"),
                          ("LOGIN_ADDRESS_MAX_DELAY_S", "soon"), ("LOGIN_ADDRESS_MAX_DELAY_S", "inf")]:
        with pytest.raises(ConfigurationError, match=f"{variable}='{raw}'"):
            LimitSettings.from_env({variable: raw})
    with pytest.raises(ConfigurationError, match="LOGIN_FAILURES_PER_USER is replaced by LOGIN_FREE_FAILURES"):
        LimitSettings.from_env({"LOGIN_FAILURES_PER_USER": "5"})


# ---------------------------------------------------------------- hashing turns


async def _take_turns(turns: HashingTurns, attempts: list[tuple[str, int]], hold_s: float = 0.02) -> list[str]:
    order: list[str] = []

    async def one(address: str, priority: int, label: str) -> None:
        async with turns.turn(address, priority):
            order.append(label)
            await asyncio.sleep(hold_s)

    tasks = []
    for number, (address, priority) in enumerate(attempts):
        tasks.append(asyncio.create_task(one(address, priority, f"{address}{number}")))
        await asyncio.sleep(0)  # arrive in this order
    await asyncio.gather(*tasks)
    return order


async def test_hashing_turns_go_address_by_address_and_hold_one_address_to_its_share():
    turns = HashingTurns(workers=2, per_address=1)
    running = {"flood": 0, "most": 0}

    async def flood() -> None:
        async with turns.turn("flood", SUSPECT):
            running["flood"] += 1
            running["most"] = max(running["most"], running["flood"])
            await asyncio.sleep(0.01)
            running["flood"] -= 1

    started = [asyncio.create_task(flood()) for _ in range(20)]
    await asyncio.sleep(0)
    # The flood waits in its own queue; another address gets the second worker at once.
    async with asyncio.timeout(0.5):
        async with turns.turn("alice", CLEAN):
            assert turns.waiting("flood") >= 18
    await asyncio.gather(*started)
    assert running["most"] == 1
    one_worker = HashingTurns(workers=1, per_address=1)
    order = await _take_turns(one_worker, [("a", CLEAN)] * 3 + [("b", CLEAN)] * 2 + [("c", CLEAN)])
    assert order == ["a0", "b3", "c5", "a1", "b4", "a2"]  # one turn each, in rotation


async def test_within_an_address_known_browsers_go_first_then_clean_pairs_then_suspects():
    turns = HashingTurns(workers=1, per_address=1)
    order = await _take_turns(turns, [("nat", SUSPECT), ("nat", SUSPECT), ("nat", CLEAN), ("nat", DEVICE),
                                      ("nat", SUSPECT), ("nat", CLEAN)])
    assert order == ["nat0", "nat3", "nat2", "nat5", "nat1", "nat4"]  # the first was already running


async def test_a_full_queue_refuses_the_least_urgent_attempt_never_a_more_urgent_one():
    turns = HashingTurns(workers=1, per_address=1, queue_per_address=3)
    release = asyncio.Event()

    async def hold(priority: int) -> str:
        async with turns.turn("nat", priority):
            await release.wait()
        return "checked"

    first = asyncio.create_task(hold(SUSPECT))  # running
    await asyncio.sleep(0)
    waiting = [asyncio.create_task(hold(SUSPECT)) for _ in range(3)]
    await asyncio.sleep(0)
    with pytest.raises(Busy):  # as urgent as those waiting: refused
        async with turns.turn("nat", SUSPECT):
            pass
    classmate = asyncio.create_task(hold(CLEAN))  # more urgent: the newest suspect leaves the queue
    await asyncio.sleep(0)
    release.set()
    results = await asyncio.gather(first, *waiting, classmate, return_exceptions=True)
    assert [type(result).__name__ for result in results] == ["str", "str", "str", "Busy", "str"]
    assert turns.waiting() == 0 and turns._running_total == 0


async def test_a_cancelled_attempt_gives_its_turn_back():
    turns = HashingTurns(workers=1, per_address=1)
    release = asyncio.Event()

    async def hold() -> None:
        async with turns.turn("a", CLEAN):
            await release.wait()

    running = asyncio.create_task(hold())
    await asyncio.sleep(0)
    gone = asyncio.create_task(hold())  # a browser that gives up while it waits
    await asyncio.sleep(0)
    gone.cancel()
    await asyncio.sleep(0)
    release.set()
    await running
    async with asyncio.timeout(1):
        async with turns.turn("a", CLEAN):
            pass
    assert turns._running_total == 0 and turns.waiting() == 0


async def test_the_password_check_runs_off_the_event_loop():
    """A check held until the event loop has moved on: run on the loop it would hold the loop and
    wait in vain (up to its 30 s safety timeout, then answer False); run off it, the loop releases it."""
    limits = LoginLimits(secret=SECRET, turns=HashingTurns(workers=2, per_address=2))
    loop_moved = threading.Event()
    check_threads: list[int] = []

    def held_check() -> bool:
        check_threads.append(threading.get_ident())
        return loop_moved.wait(timeout=30)

    async def move_the_loop() -> None:
        while not check_threads:
            await asyncio.sleep(0.001)
        loop_moved.set()

    mover = asyncio.create_task(move_the_loop())
    assert await limits.check("a", CLEAN, held_check) is True
    await mover
    assert check_threads and check_threads[0] != threading.get_ident()
    # Real checks, side by side, each with its own answer.
    auth = AuthConfig({"alice": hash_password("right", iterations=400_000)})
    results = await asyncio.gather(limits.check("a", CLEAN, lambda: auth.check("alice", "right")),
                                   limits.check("a", CLEAN, lambda: auth.check("alice", "wrong")),
                                   limits.check("b", CLEAN, lambda: auth.check("nobody", "x")))
    assert results == [True, False, False] and limits.typical_check_s > 0


# ---------------------------------------------------------------- shared by replicas (PostgreSQL)


async def _migrated(postgres_url: str) -> str:
    url = normalise_url(await new_postgres_database(postgres_url))
    async with await Store.open(url, flush_outbox=False) as store:
        await store.migrate()
    return url


def _replica(url: str, clock: Clock | None, settings: LimitSettings) -> LoginLimits:
    """What one app process holds: its own engine (pool) on the shared database."""
    table = SharedAttempts(create_engine(url), forget_after_s=settings.pair_forget_s, clock=clock)
    return LoginLimits(settings, secret=SECRET, table=table, **({"clock": clock} if clock else {}))


async def test_two_replicas_on_one_postgresql_share_every_count(postgres_url):
    url = await _migrated(postgres_url)
    clock = Clock()
    settings = LimitSettings(free_failures=4, address_free_failures=6)
    first, second = _replica(url, clock, settings), _replica(url, clock, settings)
    try:
        # A guesser alternating between replicas gets the free failures once, not once per replica.
        verdicts = [await (first if n % 2 else second).admit("alice", "198.51.100.66", known=True) for n in range(10)]
        assert [v.admitted for v in verdicts] == [True] * 4 + [False] * 6
        assert {v.held_by for v in verdicts[4:]} == {"name"}
        # Sent at once to both: the rows are locked, so exactly the free ones pass.
        together = await asyncio.gather(*(replica.admit("bob", "198.51.100.67", known=True)
                                          for replica in (first, second) for _ in range(10)))
        assert sum(v.admitted for v in together) == 4
        # Alice, from her own address, through either replica.
        assert (await first.admit("alice", "10.0.0.7", known=True)).admitted
        await first.succeeded("alice", "10.0.0.7")
        # Junk from one address through both replicas: the address's limit is the deployment's.
        junk = [await (first if n % 2 else second).admit(f"junk{n}", "203.0.113.1", known=False) for n in range(8)]
        assert [v.admitted for v in junk] == [True] * 6 + [False] * 2 and junk[-1].held_by == "address"
        assert (await second.admit("student", "203.0.113.1", known=True)).admitted
        # A success on one replica forgets the pair on the other.
        clock.now += 1000
        await second.succeeded("alice", "198.51.100.66")
        assert (await first.admit("alice", "198.51.100.66", known=True)).admitted
        # Nothing in the table names a person or an address (keys are keyed digests).
        async with await Store.open(url, flush_outbox=False) as store:
            async with store._transaction() as connection:
                keys = (await connection.exec_driver_sql("SELECT key FROM login_attempts")).scalars().all()
        assert keys and not any(word in key for key in keys for word in ("alice", "bob", "198.51", "junk"))
    finally:
        await first.aclose()
        await second.aclose()


async def test_the_database_clock_drives_the_shared_delays(postgres_url):
    url = await _migrated(postgres_url)
    limits = _replica(url, None, LimitSettings(free_failures=1, max_delay_s=5))
    try:
        assert (await limits.admit("alice", "a", known=True)).admitted
        refused = await limits.admit("alice", "a", known=True)
        assert not refused.admitted and 0 < refused.wait_s <= 1.0  # the 1 s delay, less the time since
        await asyncio.sleep(refused.wait_s + 0.05)
        assert (await limits.admit("alice", "a", known=True)).admitted
    finally:
        await limits.aclose()


def _signal_server(cluster, sig: int) -> None:
    """Stop (SIGSTOP) or resume (SIGCONT) the whole server: the postmaster first (it forks no new
    backend while stopped), then every backend (each runs in a session of its own)."""
    postmaster = cluster.server.process.pid
    for pid in [int(pid) for pid in open(f"/proc/{postmaster}/task/{postmaster}/children").read().split()]:
        if open(f"/proc/{pid}/comm").read().strip() == "postgres":  # runuser's child, as root
            postmaster = pid
    os.kill(postmaster, sig)
    for pid in open(f"/proc/{postmaster}/task/{postmaster}/children").read().split():
        os.kill(int(pid), sig)
    if sig == signal.SIGCONT:  # runuser stops itself when its child stops: it must go on too
        os.kill(cluster.server.process.pid, sig)


async def test_a_database_that_does_not_answer_leaves_the_limits_to_this_process(own_cluster):
    cluster = own_cluster
    url = normalise_url(cluster.url)
    async with await Store.open(url, flush_outbox=False) as store:
        await store.migrate()
    settings = LimitSettings(free_failures=2)
    table = FallbackAttempts(SharedAttempts(create_engine(url), forget_after_s=10), timeout_s=1.0, retry_s=3.0)
    limits = LoginLimits(settings, secret=SECRET, table=table)
    stopped = False
    try:
        assert (await limits.admit("alice", "a", known=True)).admitted and table.problem is None
        _signal_server(cluster, signal.SIGSTOP)  # a hung server: nothing answers
        stopped = True
        started = time.monotonic()
        first = await limits.admit("alice", "a", known=True)
        gave_up_s = time.monotonic() - started
        # At least the 1 s timeout (measured: up to ~2 s while the driver gives the hung connection
        # up); the upper bound is only a safety bound.
        assert 1.0 <= gave_up_s < 20.0 and table.problem is not None
        started = time.monotonic()
        later = [await limits.admit("alice", "a", known=True) for _ in range(2)]
        # No wait on the database for every login meanwhile: one such wait alone takes the 1 s timeout.
        assert time.monotonic() - started < 1.0
        # This process's own table counts now (from zero: it never saw the shared count).
        assert [v.admitted for v in [first, *later]] == [True, True, False]
        _signal_server(cluster, signal.SIGCONT)
        stopped = False
        await asyncio.sleep(3.0)
        assert (await limits.admit("carol", "b", known=True)).admitted
        assert table.problem is None  # back on the shared table
        # The shared count goes on from where it was: alice's one failure before the outage, now two.
        assert (await limits.admit("alice", "a", known=True)).admitted
        assert not (await limits.admit("alice", "a", known=True)).admitted
    finally:
        if stopped:
            _signal_server(cluster, signal.SIGCONT)
        await limits.aclose()
