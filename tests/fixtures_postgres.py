"""A throwaway PostgreSQL cluster for the storage tests (servers/postgres.py).

`postgres_url` (session): a fresh cluster on 127.0.0.1 on a free port, stopped by
PID at teardown and its dir removed. The URL points at the `postgres` database;
`new_postgres_database` makes more.

Register with `pytest_plugins = ["tests.fixtures_postgres"]`.
"""

from __future__ import annotations

import pytest

from servers.postgres import (POSTGRES_PASSWORD, PostgresCluster, PostgresMissing,  # noqa: F401 (re-exported)
                              new_postgres_database)


def new_cluster() -> PostgresCluster:
    """A cluster made (not started); the test run fails with the install command when PostgreSQL is missing."""
    try:
        return PostgresCluster()
    except PostgresMissing as missing:
        pytest.fail(str(missing), pytrace=False)


@pytest.fixture
def own_cluster():
    """A started cluster of one test's own (a test that stops or pauses it must not touch the others');
    removed after the test."""
    cluster = new_cluster().start()
    yield cluster
    cluster.remove()


@pytest.fixture(scope="session")
def postgres_url():
    """postgresql://postgres:PASSWORD@127.0.0.1:PORT/postgres on a cluster that lives for the test session."""
    cluster = new_cluster()
    try:
        yield cluster.start().url
    finally:
        cluster.remove()
