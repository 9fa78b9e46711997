"""What a browser may receive while a blind round waits for its vote: one rule, for every view of a
person, in every tab, session and replica.

A blind round hides which backend answered in which column until its person has voted. Hiding
it in the round's own element is not enough: a table of replies, a replay, the leaderboard's
medians, the engine panel (an engine running one request while column A streams *is* column A),
a backend's health in /status or in the settings panel, the engine's state "at start" and a queue
position shown with another reply, an error text that names a server, and above all a reply from
one of the round's backends (at temperature 0 its text is the column's text) could each tie a
column to a backend - from the same chat, another tab or another replica. So every view asks
this one Chainlit-free rule, kept per person:

- `refusal(command)`: the commands that would show per-backend figures, health or load wait, and
  say why (they work again after the vote); `load_refusal()` the same for simulations and sweeps;
- `reply_wait(backends)`: a chat or compare reply, or a new round, from a backend of a waiting
  round waits; the person may insist (`give_up`), and the rounds it concerns are then marked not
  blind (a vote on them is kept, not rated: store.records.UNRATED_SHOWN_BEFORE_VOTE);
- `health_shown()`: whether a backend's availability may be shown (the settings panel's marks);
- `engine_state_shown()`: whether an engine's state at a reply's start and a queue position may
  be shown with any reply;
- `panel_allowed(mode)`: the engine panel stays open only outside blind mode and while nothing waits;
- `screen(text)`: every text the app itself writes (notices, errors, store faults) has any name,
  label, model id or address of a hidden round's backends replaced, as a last guard.

Model replies and the person's own text are never screened: they are the content being judged.

**Whose rule.** A person is `person_key(...)`: the logged-in user ("user:alice"); without login the
browser ("browser:" and a digest of its id cookie, ui/browser_id.py); a client without that cookie
is its own session. Each process keeps one `Disclosure` per person (`DisclosureBook`), shared by
all of that person's sessions here, so a round started in one tab holds every other tab of this
process at once, before its first request leaves. The database knows every replica's rounds
(compare_rounds.person, votes, not_blind_reason): a person's answer is read once and then kept
until something changes - a round of theirs kept, voted on or given up on any replica, which
PostgreSQL announces to every replica (store/changes.py); without that feed (it broke, or while it
connects) answers are read again after `STALE_AFTER_S`. Never a query per chunk or per view.

**The deployment.** Live per-engine load (the engine panel, simulations, sweeps, /bench) would let
a classmate's second browser, or one without login, watch any round: while any blind round in the
deployment is open (unvoted, not given up, started within BLIND_OPEN_S) only a teacher sees it
(`DisclosureBook.deployment_open`).

The rule is one object per person that is deliberately not JSON (Chainlit writes a session's
JSON-able values into the thread's metadata, which the browser receives with the thread).
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import math
import re
import time
import weakref
from dataclasses import dataclass, field
from typing import Awaitable, Callable, Iterable, Mapping
from urllib.parse import urlparse

log = logging.getLogger(__name__)

# Commands that show per-backend figures, health or load: they wait while a blind round is unvoted.
WAITING_COMMANDS = ("stats", "replay", "leaderboard", "export_votes", "status", "engines", "bench", "trace")
HIDDEN = "[hidden until the vote]"
SHORTEST_WORD = 3  # shorter words would match inside ordinary text
# Without a change feed (SQLite needs none; PostgreSQL's broke or is connecting) a person's answer is
# read again after this long.
STALE_AFTER_S = 2.0
# A database read that failed is tried again after this long (not at every view of an outage).
RETRY_AFTER_S = 5.0
# A view waits at most this long for a person's answer being read, then uses what it has (a reply
# never waits longer on the database; a person never read is held as unsure meanwhile).
LOAD_WAIT_S = 1.0
# The deployment's "a blind round is open" is read again at least this often (rounds age out of it).
OPEN_RECHECK_S = 30.0


@dataclass(frozen=True)
class Wait:
    """Why a command or a reply waits: a notice key (core.texts) and its values."""

    key: str
    values: dict = field(default_factory=dict)


@dataclass(frozen=True)
class HeldRound:
    """A blind round waiting for its vote: the words that would name its backends, and the backends."""

    words: frozenset[str]
    backends: frozenset[str]


def identifying_words(*, name: str, label: str, url: str = "", model: str = "",
                      display_label: str = "") -> set[str]:
    """Everything that names one backend: its configured name, its labels, its model id, its URL and
    the URL's host:port (an embedded model's "url" is its file)."""
    words = {name, label, display_label, model, url}
    parsed = urlparse(url) if "://" in url else None
    if parsed is not None and parsed.netloc:
        words.add(parsed.netloc)
        words.add(url.rstrip("/"))
    if url.startswith("in-process: "):
        words.add(url.removeprefix("in-process: "))
    return {word.strip() for word in words if word and len(word.strip()) >= SHORTEST_WORD}


def person_key(*, user: str | None, browser_id: str | None, session_id: str) -> str:
    """Whose rule a session follows: the logged-in user; else the browser (a digest of its id
    cookie: the database never holds the cookie itself); else the session alone."""
    if user:
        return f"user:{user}"
    if browser_id:
        return "browser:" + hashlib.sha256(browser_id.encode()).hexdigest()[:32]
    return f"session:{session_id}"


class Disclosure:
    """One person's rule: which of their blind rounds wait for a vote, and what that hides."""

    def __init__(self, person: str = "", on_change: Callable[[], None] | None = None) -> None:
        self.person = person
        self._held: dict[str, HeldRound] = {}  # round id -> what it hides
        self._local: set[str] = set()  # hidden here, not yet confirmed by the database
        self._released: set[str] = set()  # voted on or given up here: an older read cannot bring them back
        self._pattern: re.Pattern | None = None
        self._on_change = on_change
        # Never read from the database while it could not answer: a round of this person may wait
        # elsewhere (another replica, an earlier life of this process), so every view waits.
        self.unsure = False
        # The book's bookkeeping: read once, until when the answer holds, changes seen, the read in flight.
        self.read_once = False
        self.fresh_until = 0.0
        self.changes = 0
        self.loading: asyncio.Task | None = None

    def __repr__(self) -> str:  # never the words, never the person
        return f"Disclosure({len(self._held)} blind round(s) waiting for a vote)"

    # ------------------------------------------------------------ rounds

    def hide(self, round_id: str, words: Iterable[str], backends: Iterable[str] = ()) -> None:
        """A blind round started here (or learned more of its backends): its words stay hidden until
        `reveal(round_id)`, in every session of this person in this process at once."""
        if round_id in self._released:
            return
        found = {word.strip() for word in words if word and len(word.strip()) >= SHORTEST_WORD}
        held = self._held.get(round_id)
        if held is None:  # new here (a round the database gave is held already, not local)
            held = HeldRound(frozenset(), frozenset())
            self._local.add(round_id)
        self._held[round_id] = HeldRound(held.words | found, held.backends | frozenset(backends))
        self._pattern = None
        self._changed()

    def stored(self, round_id: str) -> None:
        """The database has the round: a later read that lacks it means it was voted on elsewhere."""
        self._local.discard(round_id)

    def reveal(self, round_id: str) -> None:
        """The round was voted on (or given up): what it hid may be shown."""
        self._released.add(round_id)
        self._local.discard(round_id)
        if self._held.pop(round_id, None) is not None:
            self._pattern = None
            self._changed()

    def load(self, rounds: Mapping[str, HeldRound]) -> None:
        """What the database says waits now. Rounds hidden here and not yet written stay; rounds
        released here stay released; every other round is as the database says."""
        for round_id in list(self._held):
            if round_id not in rounds and round_id not in self._local:
                del self._held[round_id]
        for round_id, held in rounds.items():
            if round_id in self._released:
                continue
            known = self._held.get(round_id)
            self._held[round_id] = held if known is None else HeldRound(known.words | held.words,
                                                                         known.backends | held.backends)
            self._local.discard(round_id)
        self._pattern = None
        self.unsure = False

    def give_up(self, backends: Iterable[str] | None = None) -> list[str]:
        """The person insists on seeing what would name the waiting rounds (those sharing one of
        `backends`; all with None): they are released here and returned, to be marked not blind."""
        chosen = None if backends is None else set(backends)
        ids = [round_id for round_id, held in self._held.items()
               if chosen is None or held.backends & chosen or not held.backends]
        for round_id in ids:
            self.reveal(round_id)
        return ids

    def _changed(self) -> None:
        if self._on_change is not None:
            self._on_change()

    @property
    def waiting_rounds(self) -> int:
        """Blind rounds of this person that wait for their vote."""
        return len(self._held)

    @property
    def local_rounds(self) -> int:
        """Waiting rounds hidden here that the database does not have yet."""
        return len(self._local)

    def backends_of_waiting(self) -> set[str]:
        return {name for held in self._held.values() for name in held.backends}

    # ------------------------------------------------------------ the rule

    def refusal(self, command: str) -> Wait | None:
        """Why `command` must wait now, or None when it may run."""
        if command not in WAITING_COMMANDS:
            return None
        if self.unsure:
            return Wait("blind_wait_unsure", {"command": command})
        if self._held:
            return Wait("blind_wait", {"command": command, "rounds": len(self._held)})
        return None

    def load_refusal(self) -> Wait | None:
        """Why a simulation or a capacity sweep must wait now (the engines' load would name a column)."""
        if self.unsure or self._held:
            return Wait("blind_wait_load", {"rounds": len(self._held)})
        return None

    def reply_wait(self, backends: Iterable[str]) -> Wait | None:
        """Why a reply from `backends` (a chat reply, or a round's columns) must wait: a waiting
        round has one of them, and its text would tell which column that backend is. A reply from
        other backends goes (an unsure rule does not hold replies: the chat keeps working while the
        database is unavailable, docs/deploying/classroom.md)."""
        chosen = set(backends)
        sharing = [round_id for round_id, held in self._held.items() if held.backends & chosen or not held.backends]
        if not sharing:
            return None
        return Wait("blind_wait_reply", {"rounds": len(sharing)})

    def health_shown(self) -> bool:
        """Whether backends' availability may be shown (it could name a blind column's failure)."""
        return not self._held and not self.unsure

    def engine_state_shown(self) -> bool:
        """Whether an engine's state at a reply's start and a reply's queue position may be shown
        (with a round running, they would say which engine is busy when)."""
        return not self._held and not self.unsure

    def panel_allowed(self, mode: str) -> bool:
        """Whether the engine panel may stay open (each engine's load would show which column is which)."""
        return mode != "blind" and not self._held and not self.unsure

    def screen(self, text: str) -> str:
        """`text` (written by the app, not a model's reply) with every hidden word replaced."""
        if not self._held or not text:
            return text
        if self._pattern is None:
            words = sorted({word for held in self._held.values() for word in held.words}, key=len, reverse=True)
            if not words:
                return text
            self._pattern = re.compile("|".join(re.escape(word) for word in words), re.IGNORECASE)
        return self._pattern.sub(HIDDEN, text)


# How the book reads a person's waiting rounds and the deployment's open ones (AppState gives the
# store's queries); both raise store.StoreError when the database cannot say.
PersonReader = Callable[[str], Awaitable[Mapping[str, HeldRound]]]
OpenCounter = Callable[[], Awaitable[int]]


class DisclosureBook:
    """Every person's rule in this process, read from the database once and kept until it changes.

    `person(key)` is the rule object itself (no I/O: sessions keep it); `await current(key)` is it
    brought up to date first when a change was announced or its answer aged (at most `LOAD_WAIT_S`
    of waiting; the read goes on behind). `changed(key)` is a change announced for one person (None:
    anyone), `feed_lost()` says announcements may have been missed."""

    def __init__(self, read_person: PersonReader | None = None, count_open: OpenCounter | None = None, *,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._people: weakref.WeakValueDictionary[str, Disclosure] = weakref.WeakValueDictionary()
        self.read_person, self.count_open = read_person, count_open
        self.clock = clock
        # A change feed tells this process every change made elsewhere (PostgreSQL's LISTEN, live), or
        # there is nowhere else (one process: SQLite, or no database): answers hold until told.
        self.feed_live = False
        self.one_process = False
        self._open_count: int | None = None  # None: never read, or the read failed
        self._open_until = 0.0
        self._open_changes = 0
        self._open_loading: asyncio.Task | None = None

    # ------------------------------------------------------------ people

    def person(self, key: str) -> Disclosure:
        """The rule of `key` in this process (made on first use; kept while a session holds it)."""
        rule = self._people.get(key)
        if rule is None:
            rule = Disclosure(key, on_change=self._local_change)
            self._people[key] = rule
        return rule

    async def current(self, key: str, *, wait_s: float = LOAD_WAIT_S) -> Disclosure:
        """`person(key)`, read again from the database first when its answer is stale."""
        rule = self.person(key)
        if self.read_person is None or self.clock() < rule.fresh_until:
            return rule
        if rule.loading is None or rule.loading.done():
            rule.loading = asyncio.get_running_loop().create_task(self._read(rule), name="blind rule read")
        if wait_s > 0:
            await asyncio.wait([rule.loading], timeout=wait_s)
        if not rule.loading.done() and not rule.read_once:
            rule.unsure = True  # not read yet: hold what could name a round until it is
        return rule

    async def _read(self, rule: Disclosure) -> None:
        from store import StoreError  # core.disclosure stays importable without the store's engines

        while True:
            changes = rule.changes
            try:
                rounds = await self.read_person(rule.person)
            except StoreError as error:
                log.warning("blind rule: could not read a person's rounds (%s); views wait for it", error)
                if not rule.read_once:
                    rule.unsure = True
                rule.fresh_until = self.clock() + RETRY_AFTER_S
                return
            rule.load(rounds)
            rule.read_once = True
            if rule.changes == changes:  # nothing announced meanwhile: the answer holds
                rule.fresh_until = math.inf if self._told_of_changes else self.clock() + STALE_AFTER_S
                return
            # A change was announced while reading: what was read may be older than it; again.

    @property
    def _told_of_changes(self) -> bool:
        return self.feed_live or self.one_process

    def changed(self, key: str | None) -> None:
        """A change of `key`'s blind rounds was announced (None: of anyone's): read them again."""
        rules = list(self._people.values()) if key is None else [self._people.get(key)]
        for rule in rules:
            if rule is not None:
                rule.changes += 1
                rule.fresh_until = 0.0
                self._read_soon(rule)
        self._open_changes += 1
        self._open_until = 0.0

    def _read_soon(self, rule: Disclosure) -> None:
        """Read a person's rounds now, in the background, so that what every view of theirs checks
        without asking (a text screened, a queue position) is up to date within moments too."""
        if self.read_person is None or (rule.loading is not None and not rule.loading.done()):
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # told outside a loop (a test): the next view reads
            return
        rule.loading = loop.create_task(self._read(rule), name="blind rule read")

    def closed(self, rounds_by_person: Mapping[str, Iterable[str]]) -> None:
        """A teacher closed these rounds (core.round_flow.close_class_rounds): released in this
        process at once, and every person concerned read again."""
        for person, round_ids in rounds_by_person.items():
            rule = self._people.get(person)
            if rule is not None:
                for round_id in round_ids:
                    rule.reveal(round_id)
            self.changed(person)
        self._open_changes += 1
        self._open_until = 0.0

    def feed_lost(self) -> None:
        """Announcements may have been missed (the feed broke, or has just connected): read again."""
        self.changed(None)

    def _local_change(self) -> None:
        # A round started or released here: the deployment's answer changes with it.
        self._open_changes += 1
        self._open_until = 0.0

    # ------------------------------------------------------------ the deployment

    async def deployment_open(self, *, wait_s: float = LOAD_WAIT_S) -> bool:
        """Whether any blind round in the deployment waits for its vote (started within BLIND_OPEN_S);
        True also while the database cannot say."""
        local = any(rule.local_rounds for rule in list(self._people.values()))
        if local:
            return True
        if self.count_open is None:
            return any(rule.waiting_rounds for rule in list(self._people.values()))
        if self.clock() >= self._open_until:
            if self._open_loading is None or self._open_loading.done():
                self._open_loading = asyncio.get_running_loop().create_task(self._read_open(), name="blind open read")
            if wait_s > 0:
                await asyncio.wait([self._open_loading], timeout=wait_s)
        return self._open_count is None or self._open_count > 0

    async def _read_open(self) -> None:
        from store import StoreError

        changes = self._open_changes
        try:
            count = await self.count_open()
        except StoreError as error:
            log.warning("blind rule: could not read the deployment's open rounds (%s)", error)
            self._open_count, self._open_until = None, self.clock() + RETRY_AFTER_S
            return
        self._open_count = count
        if self._open_changes != changes:
            self._open_until = 0.0
        elif count > 0:  # rounds age out of "open": asked again a while later
            self._open_until = self.clock() + OPEN_RECHECK_S
        else:
            self._open_until = math.inf if self._told_of_changes else self.clock() + STALE_AFTER_S
