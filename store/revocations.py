"""Where revoked login tokens are kept: the `revoked_tokens` and `signed_out` tables (store/schema.py).

    table = RevocationTable(create_engine(url))
    await table.revoke_token(digest, expires_s)         # a token that logged out, until its exp
    await table.sign_out(["student07"], before_s)       # every token of theirs issued before then
    tokens, signed_out_before = await table.read()      # what is in force, for the cache

The same statements on SQLite and PostgreSQL (an upsert each). Times are epoch seconds, the
clock the tokens' own `iat` and `exp` are written on. Every failure is `DatabaseUnavailable`,
whose message holds no SQL and no value. The rule that reads them is core/revocations.py.
"""

from __future__ import annotations

from typing import Sequence

from sqlalchemy import delete, select
from sqlalchemy.dialects.postgresql import insert as postgres_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.ext.asyncio import AsyncEngine

from store import schema
from store.errors import DatabaseUnavailable
from store.faults import first_line


class RevocationTable:
    """The two tables on one engine (SQLite or PostgreSQL)."""

    def __init__(self, engine: AsyncEngine) -> None:
        self._engine = engine
        self._insert = postgres_insert if engine.dialect.name == "postgresql" else sqlite_insert

    @property
    def shared(self) -> bool:
        """Whether other processes (replicas) may write it too: then the cache reads it again now and then."""
        return self._engine.dialect.name == "postgresql"

    async def revoke_token(self, digest: str, expires_s: float) -> None:
        statement = self._insert(schema.revoked_tokens).values(digest=digest, expires_s=expires_s)
        await self._run(statement.on_conflict_do_nothing(index_elements=["digest"]))

    async def sign_out(self, identifiers: Sequence[str], before_s: float) -> None:
        if not identifiers:
            return
        statement = self._insert(schema.signed_out).values(
            [{"identifier": identifier, "before_s": before_s} for identifier in identifiers])
        await self._run(statement.on_conflict_do_update(index_elements=["identifier"],
                                                        set_={"before_s": statement.excluded.before_s}))

    async def read(self) -> tuple[dict[str, float], dict[str, float]]:
        """(logged-out token digest -> its exp, signed-out identifier -> tokens issued before this are refused)."""
        try:
            async with self._engine.connect() as connection:
                tokens = (await connection.execute(select(schema.revoked_tokens))).all()
                people = (await connection.execute(select(schema.signed_out))).all()
        except (SQLAlchemyError, OSError) as error:
            raise DatabaseUnavailable(f"(revoked tokens: {type(error).__name__}: {first_line(error)})") from error
        return {row.digest: row.expires_s for row in tokens}, {row.identifier: row.before_s for row in people}

    async def forget_expired(self, now_s: float) -> None:
        """Delete the tokens past their own exp (Chainlit refuses them anyway)."""
        await self._run(delete(schema.revoked_tokens).where(schema.revoked_tokens.c.expires_s < now_s))

    async def aclose(self) -> None:
        await self._engine.dispose()

    async def _run(self, statement) -> None:
        try:
            async with self._engine.begin() as connection:
                await connection.execute(statement)
        except (SQLAlchemyError, OSError) as error:
            raise DatabaseUnavailable(f"(revoked tokens: {type(error).__name__}: {first_line(error)})") from error
