"""Which database to use: `DATABASE_URL`, normalised to the async drivers.

Accepted forms (anything else is a `ConfigurationError` that lists them):

    sqlite:///path/to/file.db            -> sqlite+aiosqlite:///...
    sqlite+aiosqlite:///path/to/file.db
    postgresql://user:password@host:5432/db   -> postgresql+asyncpg://...
    postgres://...                        (the short scheme some hosts hand out)
    postgresql+asyncpg://...

A relative SQLite path is taken relative to the repository root, so the app,
`python -m store` and the tests agree on the file whatever the working folder.
Unset, the database is the SQLite file `.data/serving_lab.db` in the repository.
"""

from __future__ import annotations

import os
from pathlib import Path

from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import ArgumentError

from config import REPO, ConfigurationError

DEFAULT_SQLITE_PATH = REPO / ".data" / "serving_lab.db"
ENV_VARIABLE = "DATABASE_URL"

_SQLITE_SCHEMES = ("sqlite", "sqlite+aiosqlite")
_POSTGRES_SCHEMES = ("postgresql", "postgres", "postgresql+asyncpg")
ACCEPTED_FORMS = (
    "sqlite:///path/to/file.db, sqlite+aiosqlite:///path/to/file.db, "
    "postgresql://user:password@host:port/database (also postgres:// and postgresql+asyncpg://)"
)


def database_url(environ: os._Environ | dict[str, str] | None = None) -> str:
    """The normalised URL from `DATABASE_URL`, or the default SQLite file."""
    environ = os.environ if environ is None else environ
    configured = (environ.get(ENV_VARIABLE) or "").strip()
    if not configured:
        return f"sqlite+aiosqlite:///{DEFAULT_SQLITE_PATH}"
    return normalise_url(configured)


def normalise_url(url: str) -> str:
    """Rewrite `url` to its async driver; raise `ConfigurationError` for anything unusable."""
    try:
        parsed = make_url(url)
    except ArgumentError:
        raise ConfigurationError(
            f"{ENV_VARIABLE}={mask_password(url)!r} is not a database URL. Use one of: {ACCEPTED_FORMS}."
        ) from None
    scheme = parsed.drivername
    if scheme in _SQLITE_SCHEMES:
        return _render(_sqlite_url(parsed))
    if scheme in _POSTGRES_SCHEMES:
        if not parsed.database:
            raise ConfigurationError(
                f"{ENV_VARIABLE}={mask_password(url)!r} names no database: add it after the host, "
                "e.g. postgresql://user:password@127.0.0.1:5432/serving_lab."
            )
        return _render(parsed.set(drivername="postgresql+asyncpg"))
    raise ConfigurationError(
        f"{ENV_VARIABLE} uses {scheme!r}, which this app does not support. Use one of: {ACCEPTED_FORMS}."
    )


def mask_password(url: str) -> str:
    """`url` with its password (if any) replaced by ***, safe to print or log."""
    try:
        return make_url(url).render_as_string(hide_password=True)
    except ArgumentError:
        # Not parseable: hide everything between '://' and '@' rather than guess.
        scheme, sep, rest = url.partition("://")
        return f"{scheme}{sep}***@{rest.rpartition('@')[2]}" if "@" in rest else url


def _sqlite_url(parsed: URL) -> URL:
    database = parsed.database or ""
    if database in ("", ":memory:") or database.startswith("file::memory:"):
        raise ConfigurationError(
            f"{ENV_VARIABLE} points at an in-memory SQLite database, which is lost when the app stops "
            "and is not shared with Chainlit's history. Give a file, e.g. sqlite:///.data/serving_lab.db."
        )
    path = Path(database).expanduser()
    if not path.is_absolute():
        path = REPO / path
    return parsed.set(drivername="sqlite+aiosqlite", database=str(path))


def _render(url: URL) -> str:
    return url.render_as_string(hide_password=False)
