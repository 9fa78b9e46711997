"""Several app processes (replicas) on one PostgreSQL database: the one-load-run rule holds across
them, is released when the replica holding it dies, and two replicas starting at once migrate the
schema safely. Real PostgreSQL (the throwaway cluster), real processes; no browser.
"""

from __future__ import annotations

import asyncio
import gc
import os
import re
import signal
import subprocess
import sys
import textwrap
import time

from sqlalchemy import func, select

from core.app_state import AppState
from core.notices import Notice
from core.replica import replica_id
from store import Store, normalise_url, schema
from store.locks import LOAD_RUN, PROCESS_ALIVE_SPACE, LockKey
from core.replica import process_key
from servers.process import PYTHON
from config import REPO
from tests.fakes import FakeBackend, fake_state
from tests.fixtures_postgres import new_postgres_database


async def _database(postgres_url: str) -> str:
    return normalise_url(await new_postgres_database(postgres_url))


def _replica(url: str, name: str) -> AppState:
    state = fake_state(FakeBackend("a"))
    state.database_url, state.storage_problem, state._storage_tried = url, None, False
    state.replica = name
    return state


def test_a_replica_is_named_by_lab_replica_id_else_by_a_random_name_kept_for_the_process():
    assert replica_id({"LAB_REPLICA_ID": "app-2"}) == "app-2"
    drawn = replica_id({})
    assert drawn == replica_id({"LAB_REPLICA_ID": "  "}) and drawn.startswith("replica-")
    assert re.fullmatch(r"replica-[0-9a-f]{8}", drawn)
    # Derived from nothing: two processes that see the same process id and host name still draw
    # different names (a name made from either would repeat here).
    same_machine = textwrap.dedent(
        """
        import os, socket
        os.getpid = lambda: 4242
        socket.gethostname = lambda: "lab-host"
        from core.replica import replica_id
        print(replica_id({}))
        """
    )
    names = {
        subprocess.run(
            [PYTHON, "-c", same_machine], cwd=REPO, capture_output=True, text=True, check=True
        ).stdout.strip()
        for _ in range(3)
    }
    assert len(names) == 3 and all(re.fullmatch(r"replica-[0-9a-f]{8}", n) for n in names)
    assert not any("4242" == n.removeprefix("replica-") or "lab-host" in n for n in names)


async def test_one_load_run_at_a_time_across_replicas_of_one_database(postgres_url):
    url = await _database(postgres_url)
    first, second = _replica(url, "app-1"), _replica(url, "app-2")
    busy = Notice("simulate_busy", {"users": 4, "backend": "a"})
    release = asyncio.Event()
    try:
        assert await second.running_load() is None
        assert await first.start_load(busy, release.wait()) is None
        run = first.load_task
        elsewhere = Notice("load_elsewhere", {"replica": "app-1"})
        assert await second.running_load() == elsewhere
        assert await first.running_load() == busy  # the replica running it names what runs
        # Past the check (say both checked at once): the lock refuses the second, whose run never starts.
        started = []

        async def second_run() -> None:
            started.append(True)

        assert await second.start_load(Notice("bench_busy", {"backends": "a"}), second_run()) == elsewhere
        assert second.load_task is None
        await asyncio.sleep(0.05)
        assert started == []
        release.set()
        await run
        await first.end_load(run)
        assert await second.running_load() is None and await first.running_load() is None
        assert await second.start_load(Notice("bench_busy", {"backends": "a"}), second_run()) is None
        await second.load_task
        await second.end_load(second.load_task)
        assert started == [True]
        assert await first.running_load() is None
    finally:
        for state in (first, second):
            if state._store is not None:
                await state._store.aclose()


HOLD_LOCK = textwrap.dedent("""
    import asyncio, sys
    from store.locks import LOAD_RUN, try_lock

    async def main():
        held = await try_lock(sys.argv[1], LOAD_RUN, "serving-lab load app-dies")
        print("held" if held else "refused", flush=True)
        await asyncio.sleep(600)

    asyncio.run(main())
""")


async def test_a_load_run_of_a_replica_that_dies_frees_the_deployment(postgres_url):
    url = await _database(postgres_url)
    survivor = _replica(url, "app-2")
    dying = subprocess.Popen([PYTHON, "-c", HOLD_LOCK, url], cwd=REPO, stdout=subprocess.PIPE, text=True,
                             start_new_session=True)
    try:
        assert dying.stdout.readline().strip() == "held"
        assert await survivor.running_load() == Notice("load_elsewhere", {"replica": "app-dies"})
        assert await survivor.start_load(Notice("bench_busy", {"backends": "a"})) is not None
        os.killpg(dying.pid, signal.SIGKILL)  # no unlock, no clean close
        dying.wait(timeout=10)
        deadline = time.monotonic() + 10
        while await survivor.running_load() is not None and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        assert await survivor.running_load() is None
        assert await survivor.start_load(Notice("bench_busy", {"backends": "a"})) is None
        store = await survivor.storage()
        assert await store.lock_holders([LOAD_RUN]) == {LOAD_RUN: "serving-lab load app-2"}
        await survivor.end_load(asyncio.current_task())
        assert await store.lock_holders([LOAD_RUN]) == {}
    finally:
        if dying.poll() is None:
            os.killpg(dying.pid, signal.SIGKILL)
            dying.wait(timeout=10)
        if survivor._store is not None:
            await survivor._store.aclose()


MIGRATE_AT = textwrap.dedent("""
    import asyncio, sys, time
    from store import Store

    async def main():
        async with await Store.open(sys.argv[1], flush_outbox=False) as store:
            time.sleep(max(0.0, float(sys.argv[2]) - time.time()))  # every process starts its migration together
            print(await store.migrate(), flush=True)

    asyncio.run(main())
""")


async def test_replicas_starting_at_once_migrate_a_fresh_database_once(postgres_url):
    url = await _database(postgres_url)
    at = time.time() + 4.0  # after every interpreter has started and connected
    processes = [subprocess.Popen([PYTHON, "-c", MIGRATE_AT, url, str(at)], cwd=REPO, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True) for _ in range(4)]
    outcomes = [process.communicate(timeout=120) for process in processes]
    for process, (out, err) in zip(processes, outcomes):
        assert process.returncode == 0, err[-2000:]
        assert out.strip() == str(schema.SCHEMA_VERSION)
    async with await Store.open(url, flush_outbox=False) as store:
        async with store._transaction() as connection:
            assert await connection.scalar(select(func.count()).select_from(schema.schema_version)) == 1
        assert set((await store.row_counts())) >= {table.name for table in schema.metadata.sorted_tables}


def test_the_deployment_config_passes_nginx_own_check_with_any_replicas():
    from servers.proxy import Proxy, site_config

    site = site_config(["127.0.0.1:18001", "127.0.0.1:18002", "127.0.0.1:18003"], 18080)
    assert site.count("    server 127.0.0.1:1800") == 3 and "listen 127.0.0.1:18080;" in site
    assert "hash $lab_route consistent;" in site and "listen 80;" not in site
    proxy = Proxy(["127.0.0.1:18001", "127.0.0.1:18002"])
    try:
        checked = proxy.check()
        assert checked.returncode == 0, checked.stderr
        assert "syntax is ok" in checked.stderr
    finally:
        proxy.stop()


async def test_replies_starting_together_are_all_marked_with_one_live_process(postgres_url):
    url = await _database(postgres_url)
    state = _replica(url, "app-1")
    try:
        marks = await asyncio.gather(*(state.in_flight_mark() for _ in range(20)))
        assert marks == [{"in_flight": {"replica": "app-1", "process": process_key()}}] * 20
        gc.collect()  # a lock object dropped by a racing caller would close its connection here
        key = LockKey(PROCESS_ALIVE_SPACE, process_key())
        store = await state.storage()
        assert await store.lock_holders([key]) == {key: "serving-lab process app-1"}
    finally:
        if state._alive is not None:
            await state._alive.release()
        if state._store is not None:
            await state._store.aclose()
