"""Typed errors of the storage layer.

Handlers catch `StoreError` (or one of its subclasses), and `ConfigurationError`
(config.py's, the app's one) for a `DATABASE_URL` this app cannot use; anything
else coming out of the store is a bug and is allowed to surface.
"""

from __future__ import annotations

from config import ConfigurationError  # noqa: F401  (raised for an unusable DATABASE_URL)


class StoreError(Exception):
    """A storage problem a person can act on."""


class DatabaseUnavailable(StoreError):
    """The database cannot be reached or opened (its message never holds SQL or row values)."""


class SavedLater(StoreError):
    """The database is unavailable: the row waits in the outbox (store/outbox.py) and is written,
    in order, once the database answers again. `waiting` rows wait, this one included."""

    def __init__(self, problem: str, waiting: int) -> None:
        self.problem = problem
        self.waiting = waiting
        super().__init__(f"not saved yet: the database is unavailable ({problem}); kept, {waiting} row(s) wait "
                         "to be written when it is back")


class NotSaved(StoreError):
    """The database is unavailable and the outbox is full: this row is not kept."""


class RowRefused(StoreError):
    """The database refused this row for what it holds (a value it cannot store, a broken
    constraint): waiting would not help, so it is set aside in the dead-letter file (store/outbox.py)
    with its reason, and nothing behind it waits for it. The message holds no value of the row."""

    def __init__(self, reason: str, dead_letter_file: str | None) -> None:
        self.reason = reason
        self.dead_letter_file = dead_letter_file
        where = f"set aside in {dead_letter_file}" if dead_letter_file else "logged (no outbox folder to keep it in)"
        super().__init__(f"not saved: the database refused this row ({reason}); {where}")


class SchemaTooNew(StoreError):
    """The database was migrated by a newer version of the app."""


class RoundNotFound(StoreError):
    """A compare round (or one of its columns) does not exist."""


class VoteRejected(StoreError):
    """A vote that cannot be accepted: unknown round, second vote, or forged content."""


class VoteLimitReached(VoteRejected):
    """A logged-in person has cast as many votes in the last 24 hours as VOTES_PER_DAY allows."""
