#!/usr/bin/env bash
# A classroom on the app: N simulated students (Locust users speaking Chainlit's real
# socket.io protocol) chat for M minutes; prints a summary whose last line is
#   users=U messages=M replied=R errors=E p50_reply_s=X p99_reply_s=Y max_rss_mb=Z
#
#   bash scripts/classroom_load.sh --users 30 --minutes 3 [--backend NAME] [--host URL]
#                                  [--paced-server] [--spawn-rate R] [--results DIR]
#
# --users 1..60, --minutes up to 15 (decimals allowed, at least 10 s); everything on loopback.
# Without --host it starts the app (`chainlit run app.py`, the app venv in $APP_VENV, default
# .venv) on a free 127.0.0.1 port, with the backends of .env / the environment, and stops it
# at the end. --backend NAME makes NAME the default backend of that app (DEFAULT_BACKEND).
# --host URL uses an app already running there (loopback only); then --backend NAME makes each
# simulated student pick NAME in the settings panel, as a person would; the app's memory is
# read from the process listening on that port.
# --paced-server starts the paced OpenAI-protocol stand-in (servers/paced_openai.py,
# PACED_RATE tokens/s, PACED_TOKENS per reply; default 50 and 60) and gives the app one
# backend, `paced`, pointed at it: the harness without any model.
# Students think LOAD_THINK_MIN_S..LOAD_THINK_MAX_S (default 5..15 s) between messages; a reply
# may take LOAD_REPLY_TIMEOUT_S (180); at the end, replies in flight get LOAD_STOP_TIMEOUT_S (60)
# to finish. Locust runs from its own venv, .venv-load (created here from
# requirements-load.txt), never from the app's. Results (Locust CSV, JSON lines per message,
# memory samples, logs) stay in --results DIR (default: a new folder under /tmp).
# Exit status 0 when the run completed, whatever it measured; non-zero when it could not run.
set -euo pipefail
cd "$(dirname "$0")/.."

MAX_USERS=60
MAX_MINUTES=15
users="" minutes="" backend="" host="" paced=0 spawn_rate=2 results=""

usage() { sed -n '2,8p' "$0" | sed 's/^# \{0,1\}//'; exit 2; }
fail() { echo "classroom_load: $*" >&2; exit 2; }
step() { echo "==> [$(date +%H:%M:%S)] $*"; }

while [ $# -gt 0 ]; do
  case "$1" in
    --users) users=${2:-}; shift 2 ;;
    --minutes) minutes=${2:-}; shift 2 ;;
    --backend) backend=${2:-}; shift 2 ;;
    --host) host=${2:-}; shift 2 ;;
    --paced-server) paced=1; shift ;;
    --spawn-rate) spawn_rate=${2:-}; shift 2 ;;
    --results) results=${2:-}; shift 2 ;;
    -h|--help) usage ;;
    *) fail "unknown option $1 (see --help)" ;;
  esac
done

[[ "$users" =~ ^[0-9]+$ ]] && [ "$users" -ge 1 ] && [ "$users" -le "$MAX_USERS" ] \
  || fail "--users must be 1..$MAX_USERS (got '${users}')"
[[ "$minutes" =~ ^[0-9]+([.][0-9]+)?$ ]] || fail "--minutes must be a number (got '${minutes}')"
run_s=$(awk -v m="$minutes" 'BEGIN { printf "%d", m * 60 + 0.5 }')
[ "$run_s" -ge 10 ] && [ "$run_s" -le $((MAX_MINUTES * 60)) ] \
  || fail "--minutes must give 10 s .. $MAX_MINUTES min (got $minutes)"
[[ "$spawn_rate" =~ ^[0-9]+([.][0-9]+)?$ ]] || fail "--spawn-rate must be users per second (got '$spawn_rate')"
loopback='^https?://(127\.[0-9]+\.[0-9]+\.[0-9]+|localhost|\[::1\])(:[0-9]+)?/?$'
if [ -n "$host" ]; then
  [[ "$host" =~ $loopback ]] || fail "--host must be a loopback URL such as http://127.0.0.1:8000 (got '$host')"
  [ "$paced" = 0 ] || fail "--paced-server configures an app this script starts; it does not go with --host"
fi
if [ "$paced" = 1 ] && [ -n "$backend" ] && [ "$backend" != paced ]; then
  fail "--paced-server gives the app one backend, 'paced'; --backend $backend does not exist there"
fi

stop_timeout_s=${LOAD_STOP_TIMEOUT_S:-60}
APP_VENV=${APP_VENV:-.venv}
LOAD_VENV=.venv-load
results=${results:-$(mktemp -d /tmp/classroom-load.XXXXXX)}
mkdir -p "$results"
step "Classroom load: $users users for $run_s s (at most $(( (run_s + stop_timeout_s + 59) / 60 + 1 )) min with set-up), results in $results"

# ---------------------------------------------------------------- Locust's own venv
bash scripts/load_venv.sh || fail "could not set up $LOAD_VENV"
LOAD_PY="$LOAD_VENV/bin/python"

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
trap 'echo "classroom_load: interrupted, stopping what it started" >&2; exit 130' INT TERM

free_port() { "$LOAD_PY" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
wait_http() {  # URL PID SECONDS LOG: until URL answers 200, while PID lives
  for _ in $(seq $(( $3 * 2 ))); do
    kill -0 "$2" 2>/dev/null || { tail -n 20 "$4" >&2; fail "the process for $1 exited (log: $4)"; }
    "$LOAD_PY" -c "import sys, urllib.request; urllib.request.urlopen(sys.argv[1], timeout=2)" "$1" 2>/dev/null && return 0
    sleep 0.5
  done
  tail -n 20 "$4" >&2; fail "$1 did not answer within $3 s (log: $4)"
}

if [ -z "$host" ]; then
  [ -x "$APP_VENV/bin/chainlit" ] || fail "no chainlit in $APP_VENV: run 'bash scripts/setup.sh' first (or set APP_VENV)"
  app_env=(CHAINLIT_APP_ROOT="$PWD")
  # The students' chats go to a database of the run's own, not the lab's history (unless DATABASE_URL says where).
  [ -n "${DATABASE_URL:-}" ] || app_env+=(DATABASE_URL="sqlite+aiosqlite:///$results/load-run.db")
  if [ "$paced" = 1 ]; then
    paced_port=$(free_port)
    step "Starting the paced test server on 127.0.0.1:$paced_port (${PACED_RATE:-50} tokens/s, ${PACED_TOKENS:-60} per reply)"
    "$APP_VENV/bin/python" -m servers.paced_openai --port "$paced_port" \
      --rate "${PACED_RATE:-50}" --tokens "${PACED_TOKENS:-60}" > "$results/paced-server.log" 2>&1 &
    pids+=($!)
    wait_http "http://127.0.0.1:$paced_port/health" "$!" 30 "$results/paced-server.log"
    app_env+=(BACKENDS=paced PACED_KIND=openai PACED_LABEL="Paced test server"
              PACED_BASE_URL="http://127.0.0.1:$paced_port/v1" DEFAULT_BACKEND=paced)
  elif [ -n "$backend" ]; then
    app_env+=(DEFAULT_BACKEND="$backend")
  fi
  app_port=$(free_port)
  host="http://127.0.0.1:$app_port"
  step "Starting the app on $host${backend:+ (default backend: $backend)}"
  env "${app_env[@]}" "$APP_VENV/bin/chainlit" run app.py --headless --host 127.0.0.1 --port "$app_port" \
    > "$results/app.log" 2>&1 &
  app_pid=$!
  pids+=("$app_pid")
  wait_http "$host/health" "$app_pid" 120 "$results/app.log"
  sampler_target=(--pid "$app_pid")
  load_backend=""
else
  step "Using the app already running at $host${backend:+ (each student selects backend $backend)}"
  port=$(sed -E 's#^https?://[^/]*:([0-9]+).*#\1#' <<< "$host")
  [[ "$port" =~ ^[0-9]+$ ]] || port=$([[ "$host" == https* ]] && echo 443 || echo 80)
  sampler_target=(--port "$port")
  load_backend=$backend
fi

# ---------------------------------------------------------------- the run
# One chat first, so the counts "before" include what the app starts once for its first chat (the
# socket server's service task, the model loaded), and the leak check sees only what students leave.
step "Warm-up: one chat with one message (the counts before the run include what a first chat starts)"
"$LOAD_PY" -m load.chainlit_client "$host" -m "Say hello." --timeout-s 180 > "$results/warm-up.log" 2>&1 \
  || { cat "$results/warm-up.log" >&2; fail "the warm-up chat failed (log: $results/warm-up.log)"; }
curl -sf "$host/lab/state" > "$results/state-before.json" || rm -f "$results/state-before.json"
"$LOAD_PY" -m load.rss_sampler "${sampler_target[@]}" --out "$results/rss.csv" > "$results/rss-sampler.log" 2>&1 &
pids+=($!)
step "Running Locust: $users users, $spawn_rate new per second, $run_s s (log: $results/locust.log)"
LOAD_RESULTS_DIR="$results" LOAD_BACKEND="$load_backend" \
  "$LOAD_VENV/bin/locust" -f load/locustfile.py --headless --only-summary --loglevel WARNING \
  -u "$users" -r "$spawn_rate" -t "${run_s}s" --stop-timeout "$stop_timeout_s" --exit-code-on-error 0 \
  --host "$host" --csv "$results/locust" > "$results/locust.log" 2>&1 &
locust_pid=$!
pids+=("$locust_pid")
count() { grep -c "$1" <<< "$records" || true; }
started=$SECONDS
while kill -0 "$locust_pid" 2>/dev/null; do
  sleep 1
  elapsed=$((SECONDS - started))
  if [ $((elapsed % 15)) = 0 ]; then
    records=$(cat "$results"/chat-records-*.jsonl 2>/dev/null || true)
    rss=$(tail -n 1 "$results/rss.csv" 2>/dev/null | cut -d, -f2)
    echo "    [$(printf '%02d:%02d' $((elapsed / 60)) $((elapsed % 60)))] chats $(count '"kind": "open", [^}]*"ok": true')," \
         "messages $(count '"kind": "message"'), replied $(count '"outcome": "replied"'), app RSS ${rss:-?} MB"
  fi
done
locust_status=0
wait "$locust_pid" || locust_status=$?
[ "$locust_status" = 0 ] || { tail -n 30 "$results/locust.log" >&2; fail "Locust exited with $locust_status (log: $results/locust.log)"; }
# Replies of students who left mid-reply (or whose message was still queued) are still generated:
# wait for them, bounded, before counting what the app holds after the run.
drain_s=${LOAD_DRAIN_S:-180}
drain_started=$SECONDS
while :; do
  replies=$(curl -sf "$host/lab/state" | "$LOAD_PY" -c 'import json,sys; print(json.load(sys.stdin)["tasks_by_kind"]["replies"])' 2>/dev/null || echo "?")
  case "$replies" in 0|"?") break ;; esac  # "?": the app does not answer /lab/state
  if [ $((SECONDS - drain_started)) -ge "$drain_s" ]; then
    step "Still generating $replies replies after ${drain_s} s; counting anyway"; break
  fi
  [ $(((SECONDS - drain_started) % 15)) = 0 ] && step "Waiting for $replies replies still being generated (students who left)"
  sleep 1
done
sleep "${LOAD_SETTLE_S:-10}"  # sockets closed; pooled backend connections expire after 5 s idle
curl -sf "$host/lab/state" > "$results/state-after.json" || rm -f "$results/state-after.json"
stop_all

echo
sed -n '/^Type  *Name/,/Aggregated/{p;/Aggregated/q}' "$results/locust.log"
echo
"$LOAD_PY" -m load.summary "$results" --users "$users"
