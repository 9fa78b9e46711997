#!/usr/bin/env bash
# Set up everything the tests need, then run the whole suite. CI runs exactly this.
#   bash scripts/test.sh [extra pytest args]
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh --test
echo "==> [$(date +%H:%M:%S)] Running the tests"
exec .venv/bin/pytest -ra "$@"
