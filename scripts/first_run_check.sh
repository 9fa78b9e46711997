#!/usr/bin/env bash
# The newcomer's first run, checked from outside (CI's first stage, after README command 1's setup):
#   bash scripts/setup.sh && bash scripts/first_run_check.sh
# Starts the app as README command 1 does (`.venv/bin/chainlit run app.py -w`, headless, on a free
# 127.0.0.1 port, its database in a temporary folder), waits for its first page, then one browser
# tab on Chainlit's socket.io (load/first_reply.py, from Locust's venv .venv-load, never the app's)
# opens a chat, checks the embedded model is ready (also via /status) and gets one real reply with
# its final figures. Prints how long each part took; stops the app (by PID) in every case.
# Exit 0 when the first run works; 1 with the app's log (an import error shows there) when not.
set -euo pipefail
cd "$(dirname "$0")/.."
step() { echo "==> [$(date +%H:%M:%S)] $*"; }
fail() { echo "first_run_check: $*" >&2; exit 1; }

[ -x .venv/bin/chainlit ] || fail "no .venv/bin/chainlit: run 'bash scripts/setup.sh' first"
step "Importing every module of the app and its CLIs from the app's venv"
.venv/bin/python - <<'PYTHON' || fail "a module of the app does not import from .venv (a package missing from requirements.txt?)"
import importlib, pkgutil
modules = ["config", "bench.__main__", "store.__main__"]
for package in ("backends", "core", "ui", "store"):
    modules += [info.name for info in pkgutil.walk_packages([package], prefix=package + ".")]
for name in modules:
    importlib.import_module(name)
print(f"    {len(modules)} modules import")
PYTHON
bash scripts/load_venv.sh
LOAD_PY=.venv-load/bin/python
work=$(mktemp -d /tmp/first-run.XXXXXX)
port=$("$LOAD_PY" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
log="$work/app.log"

app_pid=""
stop_app() {
  if [ -n "$app_pid" ] && kill -0 "$app_pid" 2>/dev/null; then
    kill -TERM "$app_pid" 2>/dev/null || true
    for _ in $(seq 50); do kill -0 "$app_pid" 2>/dev/null || break; sleep 0.2; done
    kill -KILL "$app_pid" 2>/dev/null || true
    wait "$app_pid" 2>/dev/null || true
  fi
  rm -rf "$work"
}
trap stop_app EXIT
trap 'echo "first_run_check: interrupted" >&2; exit 130' INT TERM

step "Starting the app as README command 1 does: .venv/bin/chainlit run app.py -w (headless, 127.0.0.1:$port)"
started=$(date +%s%N)
DATABASE_URL="sqlite:///$work/first-run.db" .venv/bin/chainlit run app.py -w --headless --host 127.0.0.1 \
  --port "$port" > "$log" 2>&1 &
app_pid=$!
for _ in $(seq 240); do
  if ! kill -0 "$app_pid" 2>/dev/null; then
    echo "----- the app's log -----" >&2; cat "$log" >&2
    fail "the app exited before serving its page (see its log above)"
  fi
  if "$LOAD_PY" -c "import sys, urllib.request; urllib.request.urlopen(sys.argv[1], timeout=2)" \
       "http://127.0.0.1:$port/" 2>/dev/null; then
    break
  fi
  sleep 0.25
done
served=$(date +%s%N)
"$LOAD_PY" -c "import sys, urllib.request; urllib.request.urlopen(sys.argv[1], timeout=2)" "http://127.0.0.1:$port/" \
  2>/dev/null || { echo "----- the app's log -----" >&2; cat "$log" >&2; fail "no page within 60 s"; }
echo "    first page served $(( (served - started) / 1000000 )) ms after start"

step "One chat, as a browser tab does: backend list, /status, one real reply"
if ! "$LOAD_PY" -m load.first_reply "http://127.0.0.1:$port" --timeout-s 300; then
  echo "----- the app's log (last 80 lines) -----" >&2; tail -n 80 "$log" >&2
  fail "the first run does not work (see above)"
fi
if grep -qE "Traceback|ImportError|ModuleNotFoundError" "$log"; then
  echo "----- the app's log -----" >&2; cat "$log" >&2
  fail "the app logged an error while answering (see its log above)"
fi
step "First run OK"
