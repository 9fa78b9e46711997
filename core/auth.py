"""Optional password login: users and their hashed passwords from `.env`.

Off by default (one local user, no login). For a classroom, set
`AUTH_USERS=alice:<hash>,bob:<hash>` (hashes from
`python -m core.auth hash-password`) and `CHAINLIT_AUTH_SECRET` (from
`chainlit create-secret`); then everyone logs in, the chat history sidebar
lists each person's own chats only, and `TEACHERS=alice` names who may start
load simulations. Passwords are never stored: PBKDF2-SHA256 with a random
salt, compared in constant time.

A name that is not a user's is checked too, against a hash of no one's
password with the users' iteration count (`dummy_hash`, made once per count):
it costs the same CPU and takes the same hashing turn, so the time of an answer
does not tell which names exist.

Logging in never stalls the room: a check (0.13 s of PBKDF2 here) runs in a
worker thread (hashlib releases the GIL, so the event loop keeps serving every
page and stream meanwhile), at most `HASH_WORKERS` at once, in turns per client
address, behind limits that slow a guesser without locking anyone out
(core/login_limits.py).
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
from collections import Counter
from dataclasses import dataclass, field
from functools import cache, cached_property
from typing import Mapping

from config import ConfigurationError

SCHEME = "pbkdf2_sha256"
ITERATIONS = 600_000  # OWASP's 2023 figure for PBKDF2-SHA256
SALT_BYTES = 16
# Password checks at once, each on a worker thread: one core stays free for the event loop
# (core/login_limits.py's HashingTurns holds them to it).
HASH_WORKERS = max(1, (os.cpu_count() or 2) - 1)


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def hash_password(password: str, *, salt: bytes | None = None, iterations: int = ITERATIONS) -> str:
    """`pbkdf2_sha256$<iterations>$<salt>$<hash>` (base64), safe to keep in .env."""
    if not password:
        raise ValueError("an empty password cannot be hashed")
    salt = salt or secrets.token_bytes(SALT_BYTES)
    digest = hashlib.pbkdf2_hmac("sha256", password.encode("utf-8"), salt, iterations)
    return f"{SCHEME}${iterations}${_b64(salt)}${_b64(digest)}"


def iterations_of(hashed: str) -> int:
    """The iteration count a hash was made with (`ITERATIONS` for one that does not say)."""
    parts = hashed.split("$")
    return int(parts[1]) if len(parts) == 4 and parts[1].isdigit() else ITERATIONS


@cache
def dummy_hash(iterations: int) -> str:
    """A hash of no one's password: checking a name that is not a user's against it costs what a user's check does."""
    return hash_password("not a real password", salt=b"\0" * SALT_BYTES, iterations=iterations)


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

    def knows(self, identifier: str) -> bool:
        """Whether `identifier` is a user's name."""
        return identifier in self.users

    @cached_property
    def _unknown_name_hash(self) -> str:
        """The dummy hash with the iteration count most users' hashes have."""
        counts = Counter(iterations_of(hashed) for hashed in self.users.values())
        return dummy_hash(counts.most_common(1)[0][0] if counts else ITERATIONS)

    def check(self, identifier: str, password: str) -> bool:
        """Whether `password` is `identifier`'s; a name that is not a user's is hashed all the same, then refused."""
        hashed = self.users.get(identifier)
        if hashed is None:
            verify_password(password, self._unknown_name_hash)
            return False
        return verify_password(password, hashed)

    async def check_async(self, identifier: str, password: str) -> bool:
        """`check`, on a worker thread: the event loop never hashes (the login route also takes a
        turn first, core.login_limits.HashingTurns, which bounds how many run at once)."""
        return await asyncio.to_thread(self.check, identifier, password)

    def is_teacher(self, identifier: str | None) -> bool:
        """Without login the one local user is the teacher."""
        return not self.enabled or identifier in self.teachers


_started = time.perf_counter()
dummy_hash(ITERATIONS)  # made once, and timed: what one check costs here
# How long one check takes on this machine (the login limits keep it up to date from real checks).
TYPICAL_CHECK_S = time.perf_counter() - _started


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
