"""Shared fixtures. Real servers live in their own fixture modules."""

import atexit
import os
import shutil
import tempfile

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
