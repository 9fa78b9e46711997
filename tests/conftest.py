"""Shared fixtures. Real servers live in their own fixture modules."""

import atexit
import os
import shutil
import tempfile

import pytest

from config import REPO

# Chainlit writes .chainlit/ and .files/ next to the app: keep that in the repo.
os.environ.setdefault("CHAINLIT_APP_ROOT", str(REPO))
os.chdir(REPO)
# Rows that wait for an unavailable database (store/outbox.py) are kept in a folder of the test
# run's own, inherited by the apps the tests start, never in the repository's .data/.
if "LAB_OUTBOX_DIR" not in os.environ:
    os.environ["LAB_OUTBOX_DIR"] = tempfile.mkdtemp(prefix="serving-lab-outbox-")
    atexit.register(shutil.rmtree, os.environ["LAB_OUTBOX_DIR"], True)

# Real servers, started and stopped by session fixtures.
pytest_plugins = ["tests.fixtures_vllm", "tests.fixtures_tgi", "tests.fixtures_app", "tests.fixtures_postgres", "tests.fixtures_hall",
                  "tests.fixtures_llama_server"]


# What each test uses, from the fixtures it requests (directly or through other fixtures): the
# markers below are set here and nowhere else, so they cannot drift from what a test really uses
# (a marker written by hand on a test or module is replaced by what its fixtures say).
USES_MARKERS = {
    "browser": {"chromium"},
    "vllm": {"vllm_server", "vllm_installed"},
    "llama_server": {"llama_server", "llama_server_installed"},
    "postgres": {"postgres_url", "own_cluster", "own_postgres", "hall"},
}


def uses_markers(fixture_names) -> list[str]:
    """The USES_MARKERS names for a test requesting `fixture_names` (its whole fixture closure)."""
    return [name for name, fixtures in USES_MARKERS.items() if fixtures & set(fixture_names)]


@pytest.hookimpl(tryfirst=True)  # before `-m` selects by them
def pytest_collection_modifyitems(items):
    for item in items:
        for node in item.listchain():
            node.own_markers[:] = [mark for mark in node.own_markers if mark.name not in USES_MARKERS]
        for name in uses_markers(item.fixturenames):
            item.add_marker(name)


@pytest.fixture(autouse=True)
def stored_replies_keep_their_figures_relations(monkeypatch):
    """Every reply stored in this process is checked as it is saved (core.timing.figure_problems):
    prefill speed, cached tokens, tokens/s, TPOT agree with each other, or the save fails where the
    reply was made. The apps the tests start are checked as they stop (tests/fixtures_app.py)."""
    from core.timing import figure_problems
    from store.db import Store

    save = Store.save_reply

    async def checked(self, reply):
        problems = figure_problems(reply.record)
        assert not problems, f"{reply.backend} reply {reply.id}: {problems}"
        return await save(self, reply)

    monkeypatch.setattr(Store, "save_reply", checked)
