"""Login tokens the app no longer accepts, though their signature and time are still good.

Chainlit's login token (an HS256 JWT with `identifier`, `iat` and `exp`) is good until it
expires (`user_session_timeout`, .chainlit/config.toml). Two things end it sooner:

- **Logging out** revokes that token: its digest is kept until the token's own `exp`.
- **A teacher signs a person out** (`/sign_out NAME`): every token of theirs issued before that
  moment is refused. A login after it gets a new token that works.

`Revocations.revoked(token)` answers from memory: no database round trip, and at most one HMAC
check (only while someone is signed out; a logged-out token is found by its digest alone). A
token is known by its signing input and its decoded signature, not by its text: the same token
with a padding `=` added still verifies, and is still revoked.

The database keeps them (store/revocations.py) for every replica and across a restart. The
first request waits until they are read (`ready`). On PostgreSQL every process reads them again
every `REFRESH_S` seconds: a logout or sign-out on another replica holds here within that window.
A write the database did not take (it is down) holds in this process and is tried again every
round. A token whose signature is not good is none of this module's business: Chainlit refuses
it anyway.
"""

from __future__ import annotations

import asyncio
import binascii
import hashlib
import logging
import time
from dataclasses import dataclass
from typing import Awaitable, Callable, Protocol, Sequence

import jwt

from store.errors import DatabaseUnavailable

log = logging.getLogger(__name__)

# Seconds between two readings of the shared table on PostgreSQL: the window in which another
# replica's logout or sign-out is not yet known here (docs/teachers/security.md).
REFRESH_S = 5.0
# The longest one reading or writing may take before it is left for the next round.
STORE_TIMEOUT_S = 2.0
# Tokens past their exp are deleted from the table at most this often.
FORGET_EXPIRED_EVERY_S = 600.0


@dataclass(frozen=True)
class Claims:
    """What a good token says: whose it is, and when it was issued and expires (epoch seconds)."""

    identifier: str
    issued_at_s: float
    expires_at_s: float


def token_digest(token: str) -> str:
    """SHA-256 of the token's signing input and decoded signature: every spelling that verifies the same."""
    signing_input, _, signature = token.rpartition(".")
    try:
        raw_signature = jwt.utils.base64url_decode(signature)
    except (binascii.Error, ValueError):
        raw_signature = signature.encode("utf-8", "replace")
    return hashlib.sha256(signing_input.encode("utf-8", "replace") + b"." + raw_signature).hexdigest()


def read_claims(token: str, secret: str) -> Claims | None:
    """The claims of a token signed with `secret` and not expired, else None."""
    try:
        claims = jwt.decode(token, secret, algorithms=["HS256"])
    except jwt.InvalidTokenError:
        return None
    identifier = claims.get("identifier")
    if not isinstance(identifier, str):
        return None
    return Claims(identifier, float(claims.get("iat") or 0.0), float(claims.get("exp") or 0.0))


class RevocationStore(Protocol):
    """Where revocations outlive the process (store.revocations.RevocationTable)."""

    shared: bool

    async def revoke_token(self, digest: str, expires_s: float) -> None: ...

    async def sign_out(self, identifiers: Sequence[str], before_s: float) -> None: ...

    async def read(self) -> tuple[dict[str, float], dict[str, float]]: ...

    async def forget_expired(self, now_s: float) -> None: ...


class Revocations:
    """The revoked tokens in memory, kept in `table` (None: this process only).

    `on_change` (async, optional) is called after a reading of the table found something new, so
    open chat sockets of a token revoked on another replica can be closed here.
    """

    def __init__(self, secret: str, table: RevocationStore | None = None, *, refresh_s: float = REFRESH_S,
                 clock: Callable[[], float] = time.time) -> None:
        self.secret = secret
        self.table = table
        self.refresh_s = refresh_s
        self.clock = clock
        self.on_change: Callable[[], Awaitable[None]] | None = None
        self.problem: str | None = None  # why the table is not read or written now, else None
        self._tokens: dict[str, float] = {}  # digest -> exp
        self._before: dict[str, float] = {}  # identifier -> tokens issued before are refused
        self._unsaved: list[Callable[[RevocationStore], Awaitable[None]]] = []
        self._loaded: asyncio.Event | None = None
        self._task: asyncio.Task | None = None
        self._forgotten_at = 0.0

    # ------------------------------------------------------------ the check (no I/O)

    def revoked(self, token: str) -> bool:
        """Whether the app refuses `token` (it logged out, or its person was signed out after it was issued)."""
        if token_digest(token) in self._tokens:
            return True
        if not self._before:
            return False
        claims = read_claims(token, self.secret)
        return claims is not None and self.signed_out(claims)

    def signed_out(self, claims: Claims) -> bool:
        before = self._before.get(claims.identifier)
        return before is not None and claims.issued_at_s < before

    # ------------------------------------------------------------ revoking

    async def log_out(self, token: str) -> Claims | None:
        """Revoke `token` (a good one; anything else is ignored): its claims, or None."""
        claims = read_claims(token, self.secret)
        if claims is None:
            return None
        digest = token_digest(token)
        self._tokens[digest] = claims.expires_at_s
        await self._save(lambda table: table.revoke_token(digest, claims.expires_at_s))
        return claims

    async def sign_out(self, identifiers: Sequence[str]) -> bool:
        """Refuse every token of these people issued until now. True when the table has it (every
        replica will), False when it holds in this process only for now (`problem` says why)."""
        before = self.clock()
        for identifier in identifiers:
            self._before[identifier] = max(before, self._before.get(identifier, 0.0))
        identifiers = list(identifiers)
        return await self._save(lambda table: table.sign_out(identifiers, before))

    async def _save(self, write: Callable[[RevocationStore], Awaitable[None]]) -> bool:
        if self.table is None:
            return False
        if not await self._try(write(self.table)):
            self._unsaved.append(write)
            return False
        return True

    # ------------------------------------------------------------ reading the table

    async def ready(self) -> None:
        """Return once the table was read the first time (or could not be); start the refreshes."""
        if self._loaded is None:
            self._loaded = asyncio.Event()
            self._task = asyncio.create_task(self._keep_up(), name="revocations-refresh")
            self._task.add_done_callback(_log_crash)
        if not self._loaded.is_set():
            await self._loaded.wait()

    async def _keep_up(self) -> None:
        try:
            await self.refresh()
        finally:
            self._loaded.set()  # a failed first reading must not hold every request
        if self.table is None:
            return
        while True:
            await asyncio.sleep(self.refresh_s)
            await self._retry_unsaved()
            if self.table.shared:
                await self.refresh()
            if self.clock() - self._forgotten_at > FORGET_EXPIRED_EVERY_S:
                self._forgotten_at = self.clock()
                await self._try(self.table.forget_expired(self._forgotten_at))

    async def refresh(self) -> bool:
        """Read the table and add what is new; True when something was (`on_change` was called)."""
        if self.table is None:
            return False
        read = await self._try(self.table.read())
        if read is None:
            return False
        tokens, before = read
        new_tokens = tokens.keys() - self._tokens.keys()
        self._tokens.update(tokens)
        changed = [name for name, at in before.items() if at > self._before.get(name, 0.0)]
        for name in changed:
            self._before[name] = before[name]
        self._forget_expired_tokens()
        if (new_tokens or changed) and self.on_change is not None:
            await self.on_change()
        return bool(new_tokens or changed)

    def _forget_expired_tokens(self) -> None:
        now = self.clock()
        for digest in [digest for digest, expires in self._tokens.items() if expires < now]:
            del self._tokens[digest]

    async def _retry_unsaved(self) -> None:
        while self._unsaved:
            if not await self._try(self._unsaved[0](self.table)):
                return
            self._unsaved.pop(0)

    async def _try(self, work: Awaitable):
        """`work`'s result, or None (logged once per outage) when the database does not take it in time."""
        try:
            async with asyncio.timeout(STORE_TIMEOUT_S):
                result = await work
        except (DatabaseUnavailable, OSError, TimeoutError) as error:
            if self.problem is None:
                log.warning("revoked login tokens held in this process only for now: %s",
                            str(error) or f"no answer within {STORE_TIMEOUT_S:g} s")
            self.problem = str(error) or f"no answer within {STORE_TIMEOUT_S:g} s"
            return None
        if self.problem is not None:
            log.warning("revoked login tokens shared through the database again")
            self.problem = None
        return True if result is None else result

    async def aclose(self) -> None:
        if self._task is not None:
            self._task.cancel()


def _log_crash(task: asyncio.Task) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.error("revoked login tokens are no longer read again", exc_info=task.exception())
