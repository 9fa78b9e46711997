"""Optional password login: users and their hashed passwords from `.env`.

Off by default (one local user, no login). For a classroom, set
`AUTH_USERS=alice:<hash>,bob:<hash>` (hashes from
`python -m core.auth hash-password`) and `CHAINLIT_AUTH_SECRET` (from
`chainlit create-secret`); then everyone logs in, the chat history sidebar
lists each person's own chats only, and `TEACHERS=alice` names who may start
load simulations. Passwords are never stored: PBKDF2-SHA256 with a random
salt, compared in constant time.

Logging in never stalls the room: a check (0.13 s of PBKDF2 here) runs in a
worker thread, at most `HASH_WORKERS` at once (hashlib releases the GIL, so
the event loop keeps serving every page and stream meanwhile), and
`LoginLimits` refuses a user name or a client address with too many recent
failures before any hashing, saying how long to wait.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import getpass
import hashlib
import hmac
import os
import secrets
import sys
import time
from collections import OrderedDict, deque
from dataclasses import dataclass, field
from typing import Callable, Mapping

from config import ConfigurationError

SCHEME = "pbkdf2_sha256"
ITERATIONS = 600_000  # OWASP's 2023 figure for PBKDF2-SHA256
SALT_BYTES = 16
# Password checks at once, each on a worker thread: one core stays free for the event loop.
HASH_WORKERS = max(1, (os.cpu_count() or 2) - 1)
_hashing = asyncio.Semaphore(HASH_WORKERS)


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def hash_password(password: str, *, salt: bytes | None = None, iterations: int = ITERATIONS) -> str:
    """`pbkdf2_sha256$<iterations>$<salt>$<hash>` (base64), safe to keep in .env."""
    if not password:
        raise ValueError("an empty password cannot be hashed")
    salt = salt or secrets.token_bytes(SALT_BYTES)
    digest = hashlib.pbkdf2_hmac("sha256", password.encode("utf-8"), salt, iterations)
    return f"{SCHEME}${iterations}${_b64(salt)}${_b64(digest)}"


def verify_password(password: str, hashed: str) -> bool:
    """True when `password` matches `hashed` (constant-time); False for anything malformed."""
    try:
        scheme, iterations, salt, expected = hashed.split("$")
        if scheme != SCHEME:
            return False
        digest = hashlib.pbkdf2_hmac("sha256", password.encode("utf-8"), base64.b64decode(salt), int(iterations))
        return hmac.compare_digest(digest, base64.b64decode(expected))
    except (ValueError, TypeError):
        return False


@dataclass(frozen=True)
class AuthConfig:
    """Who may log in, and who is a teacher. Empty users = login off."""

    users: Mapping[str, str] = field(default_factory=dict)  # identifier -> password hash
    teachers: frozenset[str] = frozenset()
    votes_per_day: int | None = None  # VOTES_PER_DAY: each person's votes in any 24 hours; None = no cap

    @property
    def vote_cap(self) -> int | None:
        """The daily cap on a person's votes: only with login on (without it there is no "person")."""
        return self.votes_per_day if self.enabled else None

    @property
    def enabled(self) -> bool:
        return bool(self.users)

    def check(self, identifier: str, password: str) -> bool:
        hashed = self.users.get(identifier)
        if hashed is None:
            # Spend the same time as for a known user, so a wrong name is not faster than a wrong password.
            verify_password(password, _DUMMY_HASH)
            return False
        return verify_password(password, hashed)

    async def check_async(self, identifier: str, password: str) -> bool:
        """`check`, on a worker thread and at most HASH_WORKERS at once: the event loop never hashes."""
        async with _hashing:
            return await asyncio.to_thread(self.check, identifier, password)

    def is_teacher(self, identifier: str | None) -> bool:
        """Without login the one local user is the teacher."""
        return not self.enabled or identifier in self.teachers


_DUMMY_HASH = hash_password("not a real password", salt=b"\0" * SALT_BYTES)


class LoginLimits:
    """Failed logins allowed per user name and per client address within a sliding window.

    An attempt counts as a failure from the moment it starts (so 30 attempts at once for one name
    cannot all reach the hashing before the first fails); a success forgets that name's failures.
    Past a limit, `wait_s` says how long until the oldest failure in the window expires. Memory is
    bounded: at most `max_keys` names and addresses are remembered (the oldest forgotten first).
    """

    def __init__(self, *, per_user: int = 5, per_address: int = 30, window_s: float = 60.0,
                 max_keys: int = 10_000, clock: Callable[[], float] = time.monotonic) -> None:
        self.per_user = per_user
        self.per_address = per_address
        self.window_s = window_s
        self.max_keys = max_keys
        self.clock = clock
        self._users: OrderedDict[str, deque[float]] = OrderedDict()
        self._addresses: OrderedDict[str, deque[float]] = OrderedDict()

    def wait_s(self, user: str, address: str) -> float | None:
        """Seconds until `user` from `address` may try again, or None when they may now."""
        now = self.clock()
        waits = [self._wait(self._users, user, self.per_user, now),
                 self._wait(self._addresses, address, self.per_address, now)]
        waits = [wait for wait in waits if wait is not None]
        return max(waits) if waits else None

    def begin(self, user: str, address: str) -> None:
        """An attempt starts: it counts as a failure until `succeeded`."""
        now = self.clock()
        for table, key in ((self._users, user), (self._addresses, address)):
            table.setdefault(key, deque()).append(now)
            table.move_to_end(key)
            while len(table) > self.max_keys:
                table.popitem(last=False)

    def succeeded(self, user: str, address: str) -> None:
        """The password was right: the name's failures are forgotten, and this attempt's count
        for the address too."""
        self._users.pop(user, None)
        failures = self._addresses.get(address)
        if failures:
            failures.pop()

    def _wait(self, table: OrderedDict[str, deque[float]], key: str, limit: int, now: float) -> float | None:
        failures = table.get(key)
        if not failures:
            return None
        while failures and failures[0] <= now - self.window_s:
            failures.popleft()
        if not failures:
            del table[key]
            return None
        return failures[0] + self.window_s - now if len(failures) >= limit else None


def auth_from_env(env: Mapping[str, str]) -> AuthConfig:
    """Parse AUTH_USERS (`name:hash,...`) and TEACHERS (`name,...`); a mistake names the variable."""
    users: dict[str, str] = {}
    for entry in (env.get("AUTH_USERS") or "").split(","):
        entry = entry.strip()
        if not entry:
            continue
        name, _, hashed = entry.partition(":")
        name, hashed = name.strip(), hashed.strip()
        if not name or not hashed.startswith(f"{SCHEME}$") or hashed.count("$") != 3:
            raise ConfigurationError(
                f"AUTH_USERS entry {name or entry[:20]!r} is not name:hash; make the hash with "
                f"`python -m core.auth hash-password`."
            )
        if name in users:
            raise ConfigurationError(f"AUTH_USERS lists {name!r} twice.")
        users[name] = hashed
    teachers = frozenset(name.strip() for name in (env.get("TEACHERS") or "").split(",") if name.strip())
    unknown = sorted(teachers - set(users)) if users else []
    if unknown:
        raise ConfigurationError(f"TEACHERS names {', '.join(unknown)}, who are not in AUTH_USERS.")
    votes_per_day = _votes_per_day(env.get("VOTES_PER_DAY") or "")
    if users and not env.get("CHAINLIT_AUTH_SECRET"):
        raise ConfigurationError(
            "AUTH_USERS is set, so login is on, but CHAINLIT_AUTH_SECRET is not: run `chainlit create-secret` "
            "and put its output in .env."
        )
    return AuthConfig(users, teachers, votes_per_day)


def _votes_per_day(raw: str) -> int | None:
    raw = raw.strip()
    if not raw:
        return None
    if not raw.isdigit() or int(raw) < 1:
        raise ConfigurationError(
            f"VOTES_PER_DAY={raw!r}: give a whole number of votes of at least 1 per person in any 24 hours, "
            "or leave it empty for no cap.")
    return int(raw)


def current_config() -> AuthConfig:
    """The auth configuration from the environment (after .env is loaded)."""
    return auth_from_env(os.environ)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Hash a password for AUTH_USERS in .env.")
    parser.add_argument("command", choices=["hash-password"])
    parser.add_argument("--stdin", action="store_true", help="read the password from standard input")
    args = parser.parse_args(argv)
    password = sys.stdin.readline().rstrip("\n") if args.stdin else getpass.getpass("Password: ")
    try:
        print(hash_password(password))
    except ValueError as error:
        print(error, file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
