#!/usr/bin/env bash
# A lecture hall on one machine: N app replicas behind Debian's nginx, one PostgreSQL.
#
#   bash scripts/lecture_hall.sh [--replicas 2] [--port 8090] [--paced-server] [--logs DIR]
#
# Starts, all on 127.0.0.1: a throwaway PostgreSQL cluster (servers/postgres.py) unless
# DATABASE_URL is set; N replicas of the app (`chainlit run app.py`, LAB_REPLICA_ID=app-1..N,
# one shared CHAINLIT_AUTH_SECRET: a login works on every replica; generated for this run when
# unset); nginx with deploy/nginx/serving-lab.conf (servers/proxy.py) on --port, sticky per
# browser. --paced-server gives every replica one backend, `paced`, on the paced OpenAI-protocol
# stand-in (servers/paced_openai.py). Prints the address to open and serves until Ctrl-C (or
# SIGTERM); then stops everything it started, by PID. Logs in --logs DIR (default: a new /tmp folder).
set -euo pipefail
cd "$(dirname "$0")/.."

replicas=2 port=8090 paced=0 logs=""
usage() { sed -n '2,4p' "$0" | sed 's/^# \{0,1\}//'; exit 2; }
fail() { echo "lecture_hall: $*" >&2; exit 2; }
step() { echo "==> [$(date +%H:%M:%S)] $*"; }

while [ $# -gt 0 ]; do
  case "$1" in
    --replicas) replicas=${2:-}; shift 2 ;;
    --port) port=${2:-}; shift 2 ;;
    --paced-server) paced=1; shift ;;
    --logs) logs=${2:-}; shift 2 ;;
    -h|--help) usage ;;
    *) fail "unknown option $1 (see --help)" ;;
  esac
done
[[ "$replicas" =~ ^[0-9]+$ ]] && [ "$replicas" -ge 1 ] && [ "$replicas" -le 8 ] || fail "--replicas must be 1..8 (got '$replicas')"
[[ "$port" =~ ^[0-9]+$ ]] || fail "--port must be a number (got '$port')"
APP_VENV=${APP_VENV:-.venv}
PY="$APP_VENV/bin/python"
[ -x "$APP_VENV/bin/chainlit" ] || fail "no chainlit in $APP_VENV: run 'bash scripts/setup.sh' first (or set APP_VENV)"
[ -x "${NGINX:-/usr/sbin/nginx}" ] || fail "nginx is not installed: apt-get install -y nginx (Debian's package)"
logs=${logs:-$(mktemp -d /tmp/lecture-hall.XXXXXX)}
mkdir -p "$logs"

# ---------------------------------------------------------------- processes we start, stopped by PID
pids=()
stop_all() {
  local index pid
  for (( index=${#pids[@]}-1; index>=0; index-- )); do
    pid=${pids[$index]}
    kill -TERM "$pid" 2>/dev/null || continue
    for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
    kill -KILL "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
  done
  pids=()
}
trap stop_all EXIT
trap 'echo; step "Stopping what this script started"; exit 0' INT TERM

free_port() { "$PY" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
wait_http() {  # URL PID SECONDS LOG: until URL answers 200, while PID lives
  for _ in $(seq $(( $3 * 2 ))); do
    kill -0 "$2" 2>/dev/null || { tail -n 20 "$4" >&2; fail "the process for $1 exited (log: $4)"; }
    "$PY" -c "import sys, urllib.request; urllib.request.urlopen(sys.argv[1], timeout=2)" "$1" 2>/dev/null && return 0
    sleep 0.5
  done
  tail -n 20 "$4" >&2; fail "$1 did not answer within $3 s (log: $4)"
}
wait_line() {  # PREFIX LOG PID SECONDS: print the value of the first line PREFIX=value in LOG
  for _ in $(seq $(( $4 * 5 ))); do
    value=$(sed -n "s/^$1=//p" "$2" | head -n 1)
    [ -n "$value" ] && { echo "$value"; return 0; }
    kill -0 "$3" 2>/dev/null || { tail -n 20 "$2" >&2; fail "$1 never came (log: $2)"; }
    sleep 0.2
  done
  tail -n 20 "$2" >&2; fail "$1 did not come within $4 s (log: $2)"
}

# ---------------------------------------------------------------- the database
if [ -z "${DATABASE_URL:-}" ]; then
  step "Starting a throwaway PostgreSQL on 127.0.0.1 (DATABASE_URL is not set; it is removed at the end)"
  "$PY" -m servers.postgres > "$logs/postgres.log" 2>&1 &
  pids+=($!)
  DATABASE_URL=$(wait_line DATABASE_URL "$logs/postgres.log" "$!" 60)
fi
export DATABASE_URL
# Migrate once before the replicas start (they migrate again at start-up, safely, under a lock).
"$PY" -m store init | sed 's/^/    /'

# ---------------------------------------------------------------- backends
app_env=(CHAINLIT_APP_ROOT="$PWD" CHAINLIT_AUTH_SECRET="${CHAINLIT_AUTH_SECRET:-$("$PY" -c 'import secrets; print(secrets.token_urlsafe(48))')}")
if [ "$paced" = 1 ]; then
  paced_port=$(free_port)
  step "Starting the paced test server on 127.0.0.1:$paced_port (${PACED_RATE:-50} tokens/s, ${PACED_TOKENS:-60} per reply)"
  "$PY" -m servers.paced_openai --port "$paced_port" --rate "${PACED_RATE:-50}" --tokens "${PACED_TOKENS:-60}" \
    > "$logs/paced-server.log" 2>&1 &
  pids+=($!)
  wait_http "http://127.0.0.1:$paced_port/health" "$!" 30 "$logs/paced-server.log"
  app_env+=(BACKENDS=paced PACED_KIND=openai PACED_LABEL="Paced test server"
            PACED_BASE_URL="http://127.0.0.1:$paced_port/v1" DEFAULT_BACKEND=paced)
fi

# ---------------------------------------------------------------- replicas
upstreams=()
for index in $(seq "$replicas"); do
  app_port=$(free_port)
  step "Starting replica app-$index on 127.0.0.1:$app_port (log: $logs/app-$index.log)"
  env "${app_env[@]}" LAB_REPLICA_ID="app-$index" \
    "$APP_VENV/bin/chainlit" run app.py --headless --host 127.0.0.1 --port "$app_port" > "$logs/app-$index.log" 2>&1 &
  pids+=($!)
  upstreams+=("127.0.0.1:$app_port")
  echo "app-$index $! 127.0.0.1:$app_port" >> "$logs/replicas.txt"
done
for index in $(seq "$replicas"); do
  read -r _ pid address < <(sed -n "${index}p" "$logs/replicas.txt")
  wait_http "http://$address/health" "$pid" 120 "$logs/app-$index.log"
done

# ---------------------------------------------------------------- the proxy
step "Starting nginx on 127.0.0.1:$port in front of ${upstreams[*]}"
"$PY" -m servers.proxy "${upstreams[@]}" --port "$port" > "$logs/nginx.log" 2>&1 &
pids+=($!)
proxy_url=$(wait_line PROXY_URL "$logs/nginx.log" "$!" 30)
step "Ready: open $proxy_url (replicas: $logs/replicas.txt; Ctrl-C stops everything)"
echo "PROXY_URL=$proxy_url"
declare -A reported=()
while :; do
  for pid in "${pids[@]}"; do
    if ! kill -0 "$pid" 2>/dev/null && [ -z "${reported[$pid]:-}" ]; then
      reported[$pid]=1
      step "process $pid has exited (see $logs)"
    fi
  done
  sleep 5 &
  wait $! || true
done
