#!/usr/bin/env bash
# Locust's own venv, .venv-load, from requirements-load.txt (Locust, python-socketio,
# websocket-client): the load client and the classroom load test run from it, never from the
# app's venv, so nothing of theirs can hide a package the app forgot to declare.
#   bash scripts/load_venv.sh        # creates or updates it (about a minute the first time)
set -euo pipefail
cd "$(dirname "$0")/.."
LOAD_VENV=.venv-load
stamp="$LOAD_VENV/.requirements-load.sha256"
wanted=$(sha256sum requirements-load.txt | cut -d' ' -f1)
if [ ! -x "$LOAD_VENV/bin/locust" ] || [ "$(cat "$stamp" 2>/dev/null)" != "$wanted" ]; then
  echo "==> [$(date +%H:%M:%S)] Setting up $LOAD_VENV (Locust, python-socketio, websocket-client; about a minute)"
  [ -x "$LOAD_VENV/bin/python" ] || "${PYTHON:-python3}" -m venv "$LOAD_VENV"
  set +o pipefail
  "$LOAD_VENV/bin/pip" install --progress-bar off -r requirements-load.txt 2>&1 \
    | grep --line-buffered -E '^(Collecting|Successfully|ERROR)' | sed -u 's/^/    /'
  status=${PIPESTATUS[0]}
  set -o pipefail
  [ "$status" = 0 ] || { echo "could not install requirements-load.txt into $LOAD_VENV" >&2; exit 2; }
  echo "$wanted" > "$stamp"
fi
