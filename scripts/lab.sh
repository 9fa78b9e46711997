#!/usr/bin/env bash
# The whole lab in one command: every engine this machine can run, and the app with all of them.
#
#   bash scripts/lab.sh [--port 8000] [--without vllm,llama_server] [--logs DIR]
#   bash scripts/lab.sh --class N [--host ADDR] [--port 8000] [--new-class] [--class-dir DIR] [--join-url URL]
#
# Starts, on 127.0.0.1 (the engines on free ports; with --class the app on every interface), and
# stops by PID on Ctrl-C or SIGTERM:
#   - the embedded model: llama.cpp inside the app's process (backend llama_cpp), always;
#   - llama.cpp's server (scripts/llama_server.sh, backend llama_server) when its binary is built
#     (bash scripts/llama_server.sh --setup-only; bash scripts/setup.sh --test builds it too);
#   - vLLM (scripts/vllm_server.sh, backend vllm) when .venv-vllm is set up (bash scripts/vllm_server.sh
#     --setup): the CPU build and the bundled model here; where nvidia-smi works, the GPU build
#     serving VLLM_SERVE_MODEL (a model folder or name; it must be set there);
#   - a TGI (backend tgi) is not started (it runs as a container): it joins when TGI_BASE_URL
#     (the environment, else .env) answers /health;
#   - the app (chainlit run app.py) on --port, with BACKENDS = every engine that came up, all of
#     them the default compare set. The rest of .env (login, database, defaults) applies as usual.
# Prints the address and which engines are up, and why one is not. LAB_VLLM_START_S (default 300)
# and LAB_LLAMA_SERVER_START_S (60) bound the wait for each engine. Logs in --logs DIR (default: a
# new /tmp folder). --without leaves engines out (llama_server, vllm, tgi).
#
# --class N makes the room: the app listens on every interface (--host ADDR: one of them) and
# prints the addresses students open; N student logins (student01...) and a teacher, with random
# passwords, login on with a generated secret; the class sheet (a CSV user,password, printed as
# LAB_CLASS_SHEET=PATH, and a page of slips to print, LAB_CLASS_SLIPS=PATH, each with the address,
# its QR code, the user and the password) in --class-dir (default lab-class/). Running it again
# keeps the class and its passwords (more students are added when N grows) unless --new-class.
# The capacity sweep's objective (CAPACITY_SLO) is set for this machine unless set already.
# No password is ever printed: they are in the sheet, readable by its owner only.
set -euo pipefail
cd "$(dirname "$0")/.."

port=8000 logs="" without="," class="" host="" new_class=0 class_dir=lab-class join_url=""
usage() { sed -n '2,5p' "$0" | sed 's/^# \{0,1\}//'; exit 2; }
fail() { echo "lab: $*" >&2; exit 2; }
step() { echo "==> [$(date +%H:%M:%S)] $*"; }

while [ $# -gt 0 ]; do
  case "$1" in
    --port) port=${2:-}; shift 2 ;;
    --logs) logs=${2:-}; shift 2 ;;
    --without) without=",${2:-},"; shift 2 ;;
    --class) class=${2:-}; shift 2 ;;
    --host) host=${2:-}; shift 2 ;;
    --new-class) new_class=1; shift ;;
    --class-dir) class_dir=${2:-}; shift 2 ;;
    --join-url) join_url=${2:-}; shift 2 ;;
    -h|--help) usage ;;
    *) fail "unknown option $1 (see --help)" ;;
  esac
done
[[ "$port" =~ ^[0-9]+$ ]] || fail "--port must be a number (got '$port')"
if [ -n "$class" ]; then
  [[ "$class" =~ ^[0-9]+$ ]] && [ "$class" -ge 1 ] && [ "$class" -le 200 ] || fail "--class takes 1 to 200 students (got '$class')"
  host=${host:-0.0.0.0}
else
  [ "$new_class" = 0 ] && [ -z "$join_url" ] || fail "--new-class and --join-url go with --class N"
  host=${host:-127.0.0.1}
fi
[[ "$host" =~ ^[0-9a-fA-F.:]+$ ]] || fail "--host must be an IP address such as 0.0.0.0 or 192.168.1.20 (got '$host')"
APP_VENV=${APP_VENV:-.venv}
PY="$APP_VENV/bin/python"
[ -x "$APP_VENV/bin/chainlit" ] || fail "no chainlit in $APP_VENV: run 'bash scripts/setup.sh' first (or set APP_VENV)"
logs=${logs:-$(mktemp -d /tmp/serving-lab.XXXXXX)}
mkdir -p "$logs"
started_at=$SECONDS

# ---------------------------------------------------------------- the class, with --class N
class_env=()
if [ -n "$class" ]; then
  step "Preparing the class of $class in $class_dir (the logins are hashed: a few seconds)"
  made=$("$PY" -m core.classroom --students "$class" --dir "$class_dir" --host "$host" --port "$port" \
         ${join_url:+--join-url "$join_url"} $([ "$new_class" = 1 ] && echo --new)) || exit 2
  field() { printf '%s\n' "$made" | sed -n "s/^$1=//p"; }
  class_said=$(field CLASS_SAID) join_urls=$(field LAB_JOIN_URLS)
  class_sheet=$(field LAB_CLASS_SHEET) class_slips=$(field LAB_CLASS_SLIPS)
  while IFS= read -r line; do [ -n "$line" ] && class_env+=("$line"); done < "$(field LAB_CLASS_ENV)"
  # The objective: the environment's or .env's CAPACITY_SLO, else one this machine's engines can meet.
  slo=${CAPACITY_SLO:-$("$PY" -c 'import os; from config import load_env; load_env(); print(os.environ.get("CAPACITY_SLO", ""))')}
  if [ -n "$slo" ]; then
    slo_said="$slo (CAPACITY_SLO, as set)"
  elif nvidia-smi -L >/dev/null 2>&1; then
    slo=$("$PY" -c 'from core.classroom import GPU_SLO; print(GPU_SLO)'); slo_said="$slo (a GPU's, the article's kind; CAPACITY_SLO changes it)"
  else
    slo=$("$PY" -c 'from core.classroom import CPU_SLO; print(CPU_SLO)'); slo_said="$slo (a CPU's: vLLM's CPU build meets it for a few people; CAPACITY_SLO changes it)"
  fi
  class_env+=("CAPACITY_SLO=$slo")
fi

# ---------------------------------------------------------------- processes we start, stopped by PID
# Each runs in a session of its own (setsid): its PID is its process group, so stopping it also
# stops what it started (vLLM's engine process), and a Ctrl-C in the terminal reaches this script
# alone, which then stops them in order.
pids=()
stop_all() {
  local index pid
  for (( index=${#pids[@]}-1; index>=0; index-- )); do
    pid=${pids[$index]}
    kill -TERM -- "-$pid" 2>/dev/null || continue
    for _ in $(seq 100); do kill -0 -- "-$pid" 2>/dev/null || break; sleep 0.2; done
    kill -KILL -- "-$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
  done
  pids=()
}
trap stop_all EXIT
trap 'echo; step "Stopping what this script started"; exit 0' INT TERM

start() {  # NAME LOG COMMAND...: start in a session of its own, remember its PID
  local name=$1 log=$2; shift 2
  env "$@" > "$log" 2>&1 < /dev/null &
  pids+=($!)
  echo "$name $!" >> "$logs/pids.txt"
}
free_port() { "$PY" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
answers() { "$PY" -c "import sys, urllib.request; urllib.request.urlopen(sys.argv[1], timeout=3)" "$1" 2>/dev/null; }
wanted() { [[ "$without" != *",$1,"* ]]; }

declare -A url=() why=() pid_of=() is_up=([llama_cpp]=1)
why[llama_cpp]="in the app's process (${LLAMA_CPP_MODEL_PATH:-the bundled SmolLM2-135M-Instruct})"

# ---------------------------------------------------------------- llama-server
if ! wanted llama_server; then
  why[llama_server]="left out (--without)"
elif problem=$("$PY" -c "import sys; sys.path.insert(0, 'scripts'); import llama_server_launch as l; print(l.missing_binary_message() or '')") \
     && [ -n "$problem" ]; then
  why[llama_server]=$problem
else
  llama_port=$(free_port)
  step "Starting llama-server on 127.0.0.1:$llama_port (log: $logs/llama-server.log)"
  start llama_server "$logs/llama-server.log" PORT="$llama_port" setsid bash scripts/llama_server.sh
  pid_of[llama_server]=$!
  url[llama_server]="http://127.0.0.1:$llama_port/v1"
fi

# ---------------------------------------------------------------- vLLM
gpu=0; nvidia-smi -L >/dev/null 2>&1 && gpu=1
if ! wanted vllm; then
  why[vllm]="left out (--without)"
elif problem=$("$PY" -c "import sys; sys.path.insert(0, 'scripts'); import vllm_launch as l; print(l.missing_venv_message() or '')") \
     && [ -n "$problem" ]; then
  why[vllm]=$problem
elif [ "$gpu" = 1 ] && [ -z "${VLLM_SERVE_MODEL:-}" ]; then
  why[vllm]="a GPU is here: say which model vLLM serves with VLLM_SERVE_MODEL=<folder or name>"
else
  vllm_port=$(free_port)
  build=$([ "$gpu" = 1 ] && echo "GPU build, ${VLLM_SERVE_MODEL}" || echo "CPU build, about a minute to start")
  step "Starting vLLM ($build) on 127.0.0.1:$vllm_port (log: $logs/vllm.log)"
  start vllm "$logs/vllm.log" PORT="$vllm_port" setsid bash scripts/vllm_server.sh
  pid_of[vllm]=$!
  url[vllm]="http://127.0.0.1:$vllm_port/v1"
fi

# ---------------------------------------------------------------- TGI, when one answers
tgi_url=${TGI_BASE_URL:-$("$PY" -c 'import os; from config import load_env; load_env(); print(os.environ.get("TGI_BASE_URL", ""))')}
if ! wanted tgi; then
  why[tgi]="left out (--without)"
elif [ -z "$tgi_url" ]; then
  why[tgi]="TGI_BASE_URL is not set (TGI runs as a container; point TGI_BASE_URL at one)"
elif answers "${tgi_url%/}/health"; then
  is_up[tgi]=1; url[tgi]=$tgi_url; why[tgi]="$tgi_url"
else
  why[tgi]="nothing answers at TGI_BASE_URL=$tgi_url"
fi

# ---------------------------------------------------------------- wait for the engines we started
for name in llama_server vllm; do
  [ -n "${pid_of[$name]:-}" ] || continue
  var="LAB_$(echo "$name" | tr a-z A-Z)_START_S"; limit=${!var:-$([ "$name" = vllm ] && echo 300 || echo 60)}
  health="${url[$name]%/v1}/health"
  log="$logs/$([ "$name" = vllm ] && echo vllm || echo llama-server).log"
  while :; do
    if answers "$health"; then
      is_up[$name]=1; why[$name]="${url[$name]}"; break
    elif ! kill -0 "${pid_of[$name]}" 2>/dev/null; then
      why[$name]="it exited while starting: $(tail -n 1 "$log" 2>/dev/null | cut -c1-160) (log: $log)"; break
    elif [ $(( SECONDS - started_at )) -ge "$limit" ]; then
      why[$name]="no answer at $health within $limit s ($var; log: $log)"
      kill -TERM -- "-${pid_of[$name]}" 2>/dev/null || true
      break
    fi
    sleep 1
  done
done

# ---------------------------------------------------------------- the app, with every engine that is up
up=()
for name in llama_cpp llama_server vllm tgi; do if [ -n "${is_up[$name]:-}" ]; then up+=("$name"); fi; done
backends=$(IFS=,; echo "${up[*]}")
compare=$(IFS=,; echo "${up[*]:0:4}")
app_env=(CHAINLIT_APP_ROOT="$PWD" BACKENDS="$backends" DEFAULT_BACKEND=llama_cpp)
[ "${#up[@]}" -ge 2 ] && app_env+=(DEFAULT_COMPARE_BACKENDS="${DEFAULT_COMPARE_BACKENDS:-$compare}")
[ -n "${url[llama_server]:-}" ] && app_env+=(LLAMA_SERVER_BASE_URL="${url[llama_server]}")
[ -n "${url[vllm]:-}" ] && app_env+=(VLLM_BASE_URL="${url[vllm]}")
[ -n "${url[tgi]:-}" ] && app_env+=(TGI_BASE_URL="${url[tgi]}")
case "$host" in 0.0.0.0|::) local_host=127.0.0.1 ;; *:*) local_host="[$host]" ;; *) local_host=$host ;; esac
local_url="http://$local_host:$port"
app_env+=("${class_env[@]}")
step "Starting the app on $host:$port with BACKENDS=$backends (log: $logs/app.log)"
start app "$logs/app.log" "${app_env[@]}" setsid "$APP_VENV/bin/chainlit" run app.py --headless --host "$host" --port "$port"
app_pid=$!
for _ in $(seq 240); do
  answers "$local_url/" && break
  kill -0 "$app_pid" 2>/dev/null || { tail -n 20 "$logs/app.log" >&2; fail "the app exited (log: $logs/app.log)"; }
  sleep 0.5
done
answers "$local_url/" || { tail -n 20 "$logs/app.log" >&2; fail "the app did not answer within 120 s"; }

step "Ready after $(( SECONDS - started_at )) s: open $local_url (Ctrl-C stops everything)"
for name in llama_cpp llama_server vllm tgi; do
  state="not up"; [ -n "${is_up[$name]:-}" ] && state="up"
  printf '    %-7s %-13s %s\n' "$state" "$name" "${why[$name]}"
done
if [ -n "$class" ]; then
  echo "    The class: ${class_said}; login is on."
  if [ -n "$join_urls" ]; then
    echo "    Students open: ${join_urls// /  or  }"
  else
    echo "    Students cannot reach this machine: it has no network address but loopback. Join it to the room's network, then run this again."
  fi
  echo "    Their logins: print $class_slips (one slip each); the teacher's is on its last page."
  echo "    Objective of the capacity sweep: $slo_said"
fi
echo "LAB_URL=$local_url"
if [ -n "$class" ]; then
  echo "LAB_JOIN_URLS=$join_urls"
  echo "LAB_CLASS_SHEET=$class_sheet"
  echo "LAB_CLASS_SLIPS=$class_slips"
  echo "LAB_CAPACITY_SLO=$slo"
fi
echo "LAB_BACKENDS=$backends"  # the last line: the lab is ready

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
