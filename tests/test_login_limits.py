"""Logging in never stalls the room: the limits (core/auth.py LoginLimits) on a hand-driven clock,
and the password check on a worker thread while the event loop keeps ticking."""

from __future__ import annotations

import asyncio
import time

from core.auth import AuthConfig, LoginLimits, hash_password


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_name_is_refused_after_its_failures_and_says_how_long_to_wait():
    clock = Clock()
    limits = LoginLimits(per_user=3, per_address=100, window_s=60, clock=clock)
    for second in range(3):
        assert limits.wait_s("alice", "10.0.0.1") is None
        limits.begin("alice", "10.0.0.1")
        clock.now += 1
    assert limits.wait_s("alice", "10.0.0.2") == 57.0  # the oldest failure leaves the window in 57 s
    assert limits.wait_s("bob", "10.0.0.1") is None  # another name from the same address may try
    clock.now += 57
    assert limits.wait_s("alice", "10.0.0.1") is None


def test_an_address_is_refused_after_its_failures_whatever_the_names():
    clock = Clock()
    limits = LoginLimits(per_user=100, per_address=4, window_s=30, clock=clock)
    for name in ("a", "b", "c", "d"):
        limits.begin(name, "192.0.2.7")
    assert limits.wait_s("e", "192.0.2.7") == 30.0
    assert limits.wait_s("e", "192.0.2.8") is None


def test_attempts_count_while_they_run_and_a_success_forgets_the_names_failures():
    clock = Clock()
    limits = LoginLimits(per_user=2, per_address=10, window_s=60, clock=clock)
    limits.begin("alice", "a")
    limits.begin("alice", "a")  # two at once: the third waits, before either was checked
    assert limits.wait_s("alice", "a") is not None
    limits.succeeded("alice", "a")
    assert limits.wait_s("alice", "a") is None


def test_memory_is_bounded_by_the_names_and_addresses_it_remembers():
    limits = LoginLimits(per_user=1, per_address=1000, window_s=60, max_keys=100, clock=Clock())
    for number in range(1000):
        limits.begin(f"unknown-{number}", "a")
    assert len(limits._users) == 100 and limits.wait_s("unknown-0", "b") is None  # forgotten
    assert limits.wait_s("unknown-999", "b") is not None


async def test_the_password_check_runs_off_the_event_loop():
    auth = AuthConfig({"alice": hash_password("right", iterations=400_000)})
    gaps: list[float] = []

    async def ticker() -> None:
        while True:
            started = time.perf_counter()
            await asyncio.sleep(0.01)
            gaps.append(time.perf_counter() - started)

    ticking = asyncio.create_task(ticker())
    await asyncio.sleep(0.05)
    started = time.perf_counter()
    results = await asyncio.gather(auth.check_async("alice", "right"), auth.check_async("alice", "wrong"),
                                   auth.check_async("nobody", "x"))
    hashing_s = time.perf_counter() - started
    ticking.cancel()
    assert results == [True, False, False]
    # On the loop, each check would stop it for a whole check (a third of the time the three took,
    # or more); off it, the loop keeps ticking. Half a check leaves room for a busy machine.
    assert max(gaps) < 0.5 * hashing_s / 3, (max(gaps), hashing_s)
