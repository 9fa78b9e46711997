"""`python -m store init` creates or migrates the tables; `python -m store info` shows the database.

Both read `DATABASE_URL` from the environment or `.env` (default: the SQLite
file `.data/serving_lab.db`). Exit status 1 with a message on a store error.
"""

from __future__ import annotations

import argparse
import asyncio
import sys

from store.db import Store
from store.errors import ConfigurationError, StoreError
from store.schema import SCHEMA_VERSION
from store.urls import REPO


async def _init() -> None:
    async with await Store.open() as store:
        version = await store.migrate()
        print(f"Database ready: {store.masked_url} (schema version {version})")


async def _info() -> None:
    async with await Store.open() as store:
        version = await store.schema_version()
        print(f"Database:       {store.masked_url}")
        if version is None:
            print("Schema version: none (not initialised: run `python -m store init`)")
        else:
            behind = "" if version == SCHEMA_VERSION else f" (this app: {SCHEMA_VERSION}; run `python -m store init`)"
            print(f"Schema version: {version}{behind}")
        for table, count in sorted((await store.row_counts()).items()):
            print(f"  {table:<16}{count:>8} rows")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m store", description=__doc__.splitlines()[0])
    parser.add_argument("command", choices=("init", "info"))
    args = parser.parse_args(argv)
    from dotenv import load_dotenv

    load_dotenv(REPO / ".env", override=False)
    try:
        asyncio.run(_init() if args.command == "init" else _info())
    except (StoreError, ConfigurationError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
