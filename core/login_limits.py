"""Login limits that slow a guesser down without ever locking a person out.

They follow OWASP's authentication guidance (throttle per name and address with growing delays,
device cookies; no hard lock of an account that anyone could trigger). An attempt for name N
from client address A meets, in this order:

1. **Its source.** A browser that logged in as N before carries a device cookie for N (signed
   with CHAINLIT_AUTH_SECRET; `DeviceCookies`): its source is that browser, else the address A.
2. **The pair (N, source)** has a growing delay of its own: `free_failures` failed attempts,
   then each further one waits 1 s, 2 s, 4 s, ... (up to `max_delay_s`) after the one before.
   Only this pair's own failures count: someone guessing N's password from another address (or
   another browser behind the same address, once N has a device cookie) never delays N.
3. **The address A** has a growing delay too, more lenient (`address_free_failures` failures,
   up to `address_max_delay_s`), and it holds back only *suspect* attempts: an unknown name,
   or a pair that has already failed `SUSPECT_AFTER_FAILURES` times (a typo is no suspicion).
   A person whose name has not failed from A is never held by A: a class of 30 behind one NAT
   logs in while one of them sends junk from the same address.
4. **Hashing is taken in turns.** A password check costs ~0.13 s of CPU (PBKDF2): checks run on
   worker threads, at most `HASH_WORKERS` at once in the process and at most half of them for
   one address, served address by address in turn and, within one address, known browsers
   first, then clean pairs, then suspects; each address waits in a bounded queue. A flood from
   one address waits for its own turns; it never takes another address's. An unknown name is
   hashed too (against a hash of no one's password, core.auth), in the same turns, and fails like
   a wrong password.

An admitted attempt counts as a failure at once (so attempts sent together cannot all pass
before the first fails); a success forgets the pair's failures and takes itself off the
address's count. A count is forgotten after twice its longest delay without a new failure.
A refused attempt is answered at once (HTTP 429 with Retry-After), is not counted and costs no
hashing. Every wait has an end: nothing here is a lock.

What this does not do: tell a guesser with many addresses (a botnet, an IPv6 range wider than
a /64) from many people; hide which names exist from a script that has pushed its own address
past its limit (unknown names are then refused while known names are still checked); or slow
a flood of plain HTTP requests (that is the proxy's job). See docs/deploying/classroom.md.

The rules are pure functions of the records and the time (`judge`, `forgive`), applied
atomically by a table from `store.login_attempts` (in this process, or shared by every replica
on PostgreSQL), so tests drive them with a clock of their own.
"""

from __future__ import annotations

import asyncio
import hashlib
import heapq
import hmac
import ipaddress
import itertools
import json
import math
import secrets
import time
from collections import Counter, OrderedDict
from contextlib import asynccontextmanager
from dataclasses import dataclass
from functools import partial
from typing import AsyncIterator, Callable, Mapping

from config import ConfigurationError
from core.auth import HASH_WORKERS, TYPICAL_CHECK_S
from store.login_attempts import AttemptTable, Failures, LocalAttempts

FIRST_DELAY_S = 1.0  # the first growing delay; each further failure doubles it
SUSPECT_AFTER_FAILURES = 2  # a pair with this many failures is held by its address's delay too
# Refusals remembered in a process (the least recently refused forgotten first: then the table decides).
REMEMBERED_REFUSALS = 10_000
# Attempts waiting for a hashing turn, per address; beyond it the least urgent is refused (HTTP 429).
QUEUE_PER_ADDRESS = 100

# Where an admitted attempt stands in its address's queue for a hashing turn (lower goes first).
DEVICE, CLEAN, SUSPECT = 0, 1, 2

DEVICE_COOKIE = "lab_login_device"
DEVICE_COOKIE_MAX_AGE_S = 180 * 24 * 3600

# .env variable -> (LimitSettings field, smallest value)
LIMIT_VARIABLES = {
    "LOGIN_FREE_FAILURES": ("free_failures", 1),
    "LOGIN_MAX_DELAY_S": ("max_delay_s", FIRST_DELAY_S),
    "LOGIN_ADDRESS_FREE_FAILURES": ("address_free_failures", 1),
    "LOGIN_ADDRESS_MAX_DELAY_S": ("address_max_delay_s", FIRST_DELAY_S),
}
# Variables of the earlier limits (a hard refusal per name, which let anyone lock anyone out).
RETIRED_VARIABLES = {
    "LOGIN_FAILURES_PER_USER": "LOGIN_FREE_FAILURES (per name and address or browser)",
    "LOGIN_FAILURES_PER_ADDRESS": "LOGIN_ADDRESS_FREE_FAILURES",
    "LOGIN_WINDOW_S": "LOGIN_MAX_DELAY_S (failures are forgotten after twice the longest delay)",
}


@dataclass(frozen=True)
class LimitSettings:
    """How many failures are free and how long the growing delays may get (see the module docstring)."""

    free_failures: int = 5  # per (name, address or browser)
    max_delay_s: float = 900.0
    address_free_failures: int = 30  # per address, every name together
    address_max_delay_s: float = 60.0

    @property
    def pair_forget_s(self) -> float:
        """A pair's failures are forgotten after this long without one (longer than any of its delays)."""
        return 2 * self.max_delay_s

    @property
    def address_forget_s(self) -> float:
        return 2 * self.address_max_delay_s

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> "LimitSettings":
        """The LOGIN_* variables where set; a mistake names the variable and what it takes."""
        retired = [name for name in RETIRED_VARIABLES if (env.get(name) or "").strip()]
        if retired:
            raise ConfigurationError(
                "The login limits changed (a growing delay per name and address, never a lock): "
                + "; ".join(f"{name} is replaced by {RETIRED_VARIABLES[name]}" for name in retired)
                + ". Remove the old variable from .env (see .env.example).")
        values: dict[str, float] = {}
        for variable, (field_name, smallest) in LIMIT_VARIABLES.items():
            raw = (env.get(variable) or "").strip()
            if not raw:
                continue
            whole = isinstance(smallest, int)
            try:
                number = int(raw) if whole else float(raw)
            except ValueError:
                number = None
            if number is None or not math.isfinite(number) or number < smallest:
                kind = "a whole number" if whole else "a number of seconds"
                raise ConfigurationError(f"{variable}={raw!r}: give {kind} of at least {smallest:g}, "
                                         "or leave it empty for the default.")
            values[field_name] = number
        return cls(**values)


@dataclass(frozen=True)
class Verdict:
    """What the limits say about one attempt: admitted (with its place in the hashing queue), or
    refused for `wait_s` more seconds because of its pair ("name") or its address ("address")."""

    admitted: bool
    priority: int = CLEAN
    wait_s: float | None = None
    held_by: str | None = None


# ---------------------------------------------------------------- the rules (pure)


def growing_delay_s(count: int, free: int, cap_s: float) -> float:
    """The wait after the `count`-th failure: none for the first `free - 1`, then 1 s, 2 s, 4 s, ... up to `cap_s`."""
    if count < free:
        return 0.0
    return min(cap_s, FIRST_DELAY_S * 2.0 ** min(count - free, 64))


def _live(record: Failures | None, now: float, forget_s: float) -> Failures | None:
    if record is None or now - record.last_s > forget_s or record.count <= 0 and record.not_before_s <= now:
        return None
    return record


def _counted(record: Failures | None, now: float, free: int, cap_s: float) -> Failures:
    count = (record.count if record else 0) + 1
    delay = growing_delay_s(count, free, cap_s)
    not_before = max(record.not_before_s if record else 0.0, now + delay if delay else 0.0)
    return Failures(count, now, not_before)


def judge(pair: Failures | None, address: Failures | None, now: float, *, settings: LimitSettings,
          known: bool, device: bool) -> tuple[Verdict, Failures | None, Failures | None]:
    """Admit an attempt (counting it as a failure on its pair and its address) or refuse it (counting nothing).

    `known`: the name is a user's; `device`: the attempt's source is a browser with a device cookie
    for this name (the pair is then (name, browser)). Returns the verdict and the records to keep.
    """
    pair = _live(pair, now, settings.pair_forget_s)
    address = _live(address, now, settings.address_forget_s)
    suspect = not known or (pair is not None and pair.count >= SUSPECT_AFTER_FAILURES)
    waits = {}
    if pair is not None and pair.not_before_s > now:
        waits["name"] = pair.not_before_s - now
    if suspect and address is not None and address.not_before_s > now:
        waits["address"] = address.not_before_s - now
    if waits:
        held_by = max(waits, key=waits.__getitem__)
        return Verdict(False, wait_s=waits[held_by], held_by=held_by), pair, address
    priority = SUSPECT if suspect else DEVICE if device else CLEAN
    return (Verdict(True, priority=priority),
            _counted(pair, now, settings.free_failures, settings.max_delay_s),
            _counted(address, now, settings.address_free_failures, settings.address_max_delay_s))


def forgive(pair: Failures | None, address: Failures | None, now: float, *,
            settings: LimitSettings) -> tuple[None, None, Failures | None]:
    """The password was right: the pair's failures are forgotten, and this attempt leaves the address's count
    (the address's delay, if one runs, runs out as it was)."""
    address = _live(address, now, settings.address_forget_s)
    if address is not None:
        address = _live(Failures(max(0, address.count - 1), address.last_s, address.not_before_s), now,
                        settings.address_forget_s)
    return None, None, address


# ---------------------------------------------------------------- who is asking


def address_key(host: str | None) -> str:
    """The client address an attempt is counted under: IPv4 as it is, IPv6 by its /64 (one
    subscriber's usual allocation, which a script could otherwise walk through), an IPv4-mapped
    IPv6 address as its IPv4."""
    if not host:
        return "unknown"
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return host[:100]
    if ip.version == 6:
        if ip.ipv4_mapped is not None:
            return str(ip.ipv4_mapped)
        return str(ipaddress.ip_network(f"{ip}/64", strict=False))
    return str(ip)


def _subkey(secret: str, purpose: bytes) -> bytes:
    return hmac.new(secret.encode("utf-8"), purpose, hashlib.sha256).digest()


class DeviceCookies:
    """A browser that logged in as a name carries `<nonce>.<signature of name and nonce>`.

    The signature (HMAC-SHA256 under a key derived from CHAINLIT_AUTH_SECRET, which every replica
    shares) binds the cookie to the name, which the cookie does not carry: only a browser where
    that person logged in can show it, and it counts for no other name.
    """

    def __init__(self, secret: str) -> None:
        self._key = _subkey(secret, b"serving-lab login device cookie v1")

    def _sign(self, name: str, nonce: str) -> str:
        return hmac.new(self._key, json.dumps([name, nonce]).encode("utf-8"), hashlib.sha256).hexdigest()[:32]

    def device(self, cookie: str | None, name: str) -> str | None:
        """The browser's id when `cookie` is a valid device cookie for `name`, else None."""
        if not cookie or len(cookie) > 200:
            return None
        nonce, _, signature = cookie.partition(".")
        if not nonce or not hmac.compare_digest(signature.encode(), self._sign(name, nonce).encode()):
            return None
        return nonce

    def issue(self, name: str, device: str | None = None) -> str:
        """The cookie for `name` (the same browser id when it had one for this name)."""
        nonce = device or secrets.token_urlsafe(12)
        return f"{nonce}.{self._sign(name, nonce)}"


# ---------------------------------------------------------------- hashing in turns


class Busy(Exception):
    """Too many attempts from one address wait for a hashing turn; this one was not checked."""

    def __init__(self, retry_after_s: float) -> None:
        self.retry_after_s = retry_after_s
        super().__init__(f"too many sign-in attempts from this address wait; try again in {retry_after_s:.0f} s")


@dataclass
class _Ticket:
    priority: int
    number: int
    address: str
    future: asyncio.Future

    def __lt__(self, other: "_Ticket") -> bool:
        return (self.priority, self.number) < (other.priority, other.number)


class HashingTurns:
    """Password checks in turns: at most `workers` at once, at most `per_address` for one address,
    the address served longest ago first (round-robin), each address's queue by priority then
    arrival, bounded.

    With a full queue an attempt more urgent than the least urgent one waiting takes its place
    (that one gets `Busy`); otherwise it gets `Busy` itself.
    """

    def __init__(self, workers: int = HASH_WORKERS, per_address: int | None = None,
                 queue_per_address: int = QUEUE_PER_ADDRESS) -> None:
        self.workers = workers
        self.per_address = per_address or max(1, workers // 2)
        self.queue_per_address = queue_per_address
        self._numbers = itertools.count()
        self._waiting: dict[str, list[_Ticket]] = {}
        self._running: Counter[str] = Counter()
        self._running_total = 0
        # The turn each address waiting or running was last given: the one served longest ago goes next.
        self._turns_given = itertools.count()
        self._last_turn: dict[str, int] = {}

    def waiting(self, address: str | None = None) -> int:
        if address is not None:
            return len(self._waiting.get(address, ()))
        return sum(len(queue) for queue in self._waiting.values())

    @asynccontextmanager
    async def turn(self, address: str, priority: int, *, check_s: float = 0.13) -> AsyncIterator[None]:
        """Wait for a turn for `address`, hold it in the block. Raises `Busy` when its queue is full."""
        ticket = self._enqueue(address, priority, check_s)
        self._dispatch()
        try:
            await ticket.future
        except BaseException:
            if ticket.future.done() and not ticket.future.cancelled() and ticket.future.exception() is None:
                self._release(address)  # it got its turn as it was cancelled: give the turn back
            else:
                self._withdraw(ticket)
            raise
        try:
            yield
        finally:
            self._release(address)

    def _enqueue(self, address: str, priority: int, check_s: float) -> _Ticket:
        ticket = _Ticket(priority, next(self._numbers), address, asyncio.get_running_loop().create_future())
        queue = self._waiting.setdefault(address, [])
        if len(queue) >= self.queue_per_address:
            least_urgent = max(queue)
            retry_after_s = max(1.0, len(queue) * check_s / self.per_address)
            if not ticket < least_urgent:
                raise Busy(retry_after_s)
            queue.remove(least_urgent)
            heapq.heapify(queue)
            if not least_urgent.future.done():  # (done: cancelled while waiting, and leaving anyway)
                least_urgent.future.set_exception(Busy(retry_after_s))
        heapq.heappush(queue, ticket)
        return ticket

    def _dispatch(self) -> None:
        while self._running_total < self.workers:
            ready = [address for address in self._waiting if self._running[address] < self.per_address]
            if not ready:
                return  # nobody waits, or every address that waits already has its share running
            address = min(ready, key=lambda name: self._last_turn.get(name, -1))
            queue = self._waiting[address]
            ticket = heapq.heappop(queue)
            if not queue:
                del self._waiting[address]
            if ticket.future.done():
                self._forget_if_idle(address)
                continue  # cancelled while it waited (its task has not run to withdraw it yet)
            self._running[address] += 1
            self._running_total += 1
            self._last_turn[address] = next(self._turns_given)
            ticket.future.set_result(None)

    def _withdraw(self, ticket: _Ticket) -> None:
        queue = self._waiting.get(ticket.address)
        if queue and ticket in queue:
            queue.remove(ticket)
            heapq.heapify(queue)
            if not queue:
                del self._waiting[ticket.address]
        self._forget_if_idle(ticket.address)

    def _forget_if_idle(self, address: str) -> None:
        if address not in self._waiting and not self._running[address]:
            self._running.pop(address, None)
            self._last_turn.pop(address, None)

    def _release(self, address: str) -> None:
        self._running[address] -= 1
        self._running_total -= 1
        self._forget_if_idle(address)
        self._dispatch()


# ---------------------------------------------------------------- the limits


class LoginLimits:
    """The rules above over one attempt table, with the hashing turns and the device cookies.

        verdict = await limits.admit(name, address, known=..., device=...)   # refused: HTTP 429
        right = await limits.check(address, verdict.priority, lambda: auth.check(name, password))
        await limits.succeeded(name, address, device)                          # when right

    `secret` keys the table's keys and the device cookies (CHAINLIT_AUTH_SECRET: the same on every
    replica). `table`: `store.login_attempts` (default: this process's own).

    A refusal is remembered here until it ends, and a repeat is refused without asking the table
    (a flood of refused attempts costs no database work). That can never refuse what the table
    would admit: a refusal only ends when its time is up (a pair's or an address's wait never
    shortens, and their failures are forgotten only long after it), for the pair it was given to,
    and for an address's unknown names (the only attempts sure to be suspect without the table).
    `clock` must run at the rate of the table's (tests hand both the same one).
    """

    def __init__(self, settings: LimitSettings | None = None, *, secret: str,
                 table: AttemptTable | None = None, turns: HashingTurns | None = None,
                 check_s: float = TYPICAL_CHECK_S, clock: Callable[[], float] = time.monotonic) -> None:
        self.settings = settings or LimitSettings()
        self.table = table if table is not None else LocalAttempts(clock=clock)
        self.turns = turns or HashingTurns()
        self.devices = DeviceCookies(secret)
        self.typical_check_s = check_s  # how long a password check takes here, kept up to date
        self.clock = clock
        self._keys = _subkey(secret, b"serving-lab login attempt keys v1")
        self._refused: OrderedDict[str, tuple[float, str]] = OrderedDict()  # key -> (until, held_by)

    def _key(self, *parts: str) -> str:
        return hmac.new(self._keys, json.dumps(parts).encode("utf-8"), hashlib.sha256).hexdigest()

    def _keys_of(self, name: str, address: str, device: str | None) -> tuple[str, str]:
        source = ("device", device) if device else ("address", address)
        return self._key("pair", name, *source), self._key("address", address)

    async def admit(self, name: str, address: str, *, known: bool, device: str | None = None) -> Verdict:
        """Admit the attempt (it counts as a failure until `succeeded`) or refuse it for a while."""
        pair_key, address_key = self._keys_of(name, address, device)
        now = self.clock()
        remembered = [self._refused.get(pair_key)] + ([] if known else [self._refused.get(address_key)])
        remembered = [(until, held_by) for until, held_by in filter(None, remembered) if until > now]
        if remembered:
            until, held_by = max(remembered)
            return Verdict(False, wait_s=until - now, held_by=held_by)
        rule = partial(judge, settings=self.settings, known=known, device=device is not None)
        verdict = await self.table.apply(pair_key, address_key, rule)
        if not verdict.admitted:
            until = self.clock() + verdict.wait_s
            self._remember(pair_key, until, verdict.held_by)
            if verdict.held_by == "address":
                self._remember(address_key, until, "address")
        return verdict

    def _remember(self, key: str, until: float, held_by: str) -> None:
        self._refused[key] = (until, held_by)
        self._refused.move_to_end(key)
        while len(self._refused) > REMEMBERED_REFUSALS:
            self._refused.popitem(last=False)

    async def succeeded(self, name: str, address: str, device: str | None = None) -> None:
        """The password was right: the pair starts over, the address counts this attempt no more."""
        await self.table.apply(*self._keys_of(name, address, device), partial(forgive, settings=self.settings))

    async def check(self, address: str, priority: int, check: Callable[[], bool]) -> bool:
        """Run `check` (a password check) on a worker thread in its address's turn; raises `Busy`."""
        async with self.turns.turn(address, priority, check_s=self.typical_check_s):
            started = time.perf_counter()
            right = await asyncio.to_thread(check)
            self.typical_check_s = 0.8 * self.typical_check_s + 0.2 * (time.perf_counter() - started)
        return right

    async def aclose(self) -> None:
        await self.table.aclose()
