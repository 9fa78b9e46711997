"""Shared fixtures. Real servers live in their own fixture modules."""

import os
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
# Chainlit writes .chainlit/ and .files/ next to the app: keep that in the repo.
os.environ.setdefault("CHAINLIT_APP_ROOT", str(REPO))
os.chdir(REPO)

# Real servers, started and stopped by session fixtures.
pytest_plugins = ["tests.fixtures_vllm", "tests.fixtures_tgi", "tests.fixtures_app", "tests.fixtures_postgres",
                  "tests.fixtures_llama_server"]
