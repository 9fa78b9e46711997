"""Typed errors of the storage layer.

Handlers catch `StoreError` (or one of its subclasses); anything else coming
out of the store is a bug and is allowed to surface.
"""

from __future__ import annotations


class StoreError(Exception):
    """A storage problem a person can act on."""


class ConfigurationError(StoreError):
    """`DATABASE_URL` is not a database this app can use."""


class DatabaseUnavailable(StoreError):
    """The database cannot be reached or opened."""


class SchemaTooNew(StoreError):
    """The database was migrated by a newer version of the app."""


class RoundNotFound(StoreError):
    """A compare round (or one of its columns) does not exist."""


class VoteRejected(StoreError):
    """A vote that cannot be accepted: unknown round, second vote, or forged content."""


class VoteLimitReached(VoteRejected):
    """A logged-in person has cast as many votes in the last 24 hours as VOTES_PER_DAY allows."""
