#!/usr/bin/env bash
# Build (once) and start a local llama.cpp server (`llama-server`).
#
#   bash scripts/llama_server.sh --setup-only   # build or reuse the cached binary (used by setup.sh --test)
#   bash scripts/llama_server.sh                # start it: bundled GGUF on 127.0.0.1:8081
#   bash scripts/llama_server.sh --setup        # build if needed, then start
#   PORT=8082 MODEL=/path/model.gguf bash scripts/llama_server.sh -- --parallel 4   # after --: llama-server's own flags
#
# The binary is built from the llama.cpp source vendored in llama-cpp-python's sdist
# (the same commit as the app's embedded engine), portable like the wheel
# (LLAMA_CPP_CMAKE_ARGS overrides the flags for both), and cached in
# ${XDG_CACHE_HOME:-~/.cache}/serving-lab/llama-server/<hash of version and flags>/.
# The first build takes minutes (progress is printed as compiled N/M); later runs reuse it.
# The server runs in the foreground: Ctrl-C stops it.
set -euo pipefail
cd "$(dirname "$0")/.."

setup=0
serve=1
launcher_args=()
for arg in "$@"; do
  case "$arg" in
    --setup) setup=1 ;;
    --setup-only) setup=1; serve=0 ;;
    *) launcher_args+=("$arg") ;;
  esac
done

# Any Python runs the launcher (standard library only); the app's .venv also finds the bundled model.
PY=python3
[ -x .venv/bin/python ] && PY=.venv/bin/python
LAUNCHER=scripts/llama_server_launch.py
launcher_const() { "$PY" -c "import sys; sys.path.insert(0, 'scripts'); import llama_server_launch as l; print(l.$1)"; }

build_server() {
  local bin_dir version sha commit cmake_args jobs work cmake_bin
  bin_dir=$("$PY" "$LAUNCHER" --print-build-dir)
  if [ -x "$bin_dir/llama-server" ] && "$bin_dir/llama-server" --version >/dev/null 2>&1; then
    echo "[llama-server] using the binary built earlier with the same flags: $bin_dir/llama-server"
    return 0
  fi
  version=$(launcher_const LLAMA_CPP_PYTHON_VERSION)
  sha=$(launcher_const SDIST_SHA256)
  commit=$(launcher_const LLAMA_CPP_COMMIT)
  cmake_args=$("$PY" "$LAUNCHER" --print-cmake-args)
  jobs=${LLAMA_SERVER_BUILD_JOBS:-$(nproc)}

  mkdir -p "$(dirname "$bin_dir")"
  work=$(mktemp -d "$(dirname "$bin_dir")/build.XXXXXX")
  BUILD_WORK=$work
  trap 'rm -rf "$BUILD_WORK"' EXIT
  local started=$SECONDS

  # Build tools: the system's cmake and ninja, else what is missing from PyPI, in the cache.
  cmake_bin=$(command -v cmake || true)
  if [ -z "$cmake_bin" ] || ! command -v ninja >/dev/null 2>&1; then
    local tools
    tools="$(dirname "$bin_dir")/build-tools"
    if [ ! -x "$tools/bin/ninja" ] || { [ -z "$cmake_bin" ] && [ ! -x "$tools/bin/cmake" ]; }; then
      local wanted=(ninja)
      [ -n "$cmake_bin" ] || wanted+=("cmake>=3.18,<5")
      echo "[llama-server] installing ${wanted[*]} from PyPI into $tools"
      python3 -m venv "$tools"
      "$tools/bin/pip" install --quiet "${wanted[@]}"
    fi
    [ -n "$cmake_bin" ] || cmake_bin="$tools/bin/cmake"
    PATH="$tools/bin:$PATH"
  fi

  echo "[llama-server] downloading the llama-cpp-python $version sdist (its vendored llama.cpp is the source)"
  local pip=("$PY" -m pip)
  "${pip[@]}" download --quiet --no-deps --no-binary :all: --require-hashes -d "$work/sdist" \
      -r <(printf 'llama-cpp-python==%s --hash=sha256:%s\n' "$version" "$sha")
  tar -xzf "$work/sdist/llama_cpp_python-$version.tar.gz" -C "$work"
  local src="$work/llama_cpp_python-$version/vendor/llama.cpp"
  local head
  head=$(cat "$work/llama_cpp_python-$version/.git/modules/vendor/llama.cpp/HEAD" 2>/dev/null || echo unknown)
  if [ "$head" != "$commit" ]; then
    echo "[llama-server] the sdist vendors llama.cpp $head, expected $commit" >&2
    exit 1
  fi

  echo "[llama-server] building llama-server (llama.cpp ${commit:0:9}; $cmake_args): minutes, progress below"
  # shellcheck disable=SC2086  # the flags are a word list, as in CMAKE_ARGS
  "$cmake_bin" -S "$src" -B "$work/build" -G Ninja $cmake_args >"$work/configure.log" 2>&1 \
    || { cat "$work/configure.log" >&2; echo "[llama-server] cmake configure failed" >&2; exit 1; }
  set +o pipefail
  # Ninja prints [N/M] per step: keep every 10th, the last and the errors.
  "$cmake_bin" --build "$work/build" --target llama-server -j "$jobs" 2>&1 \
    | grep --line-buffered -oE '^\[[0-9]+/[0-9]+\]|error:.*|FAILED:.*' \
    | sed -u -n -E 's#^\[([0-9]+)/\1\]$#    compiled \1/\1#p; t; s#^\[([0-9]*0)/([0-9]+)\]$#    compiled \1/\2#p; /^(error|FAILED)/s#^#    #p'
  local status=${PIPESTATUS[0]}
  set -o pipefail
  [ "$status" = 0 ] || { echo "llama-server failed to build (see the errors above)" >&2; exit "$status"; }

  mkdir -p "$work/out"
  cp "$work/build/bin/llama-server" "$work/out/llama-server"
  cp "$src/LICENSE" "$work/out/LICENSE-llama.cpp"
  {
    echo "llama-server built from llama-cpp-python $version's sdist (sha256 $sha), vendor/llama.cpp at $commit"
    echo "cmake flags: $cmake_args"
    echo "built $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(uname -m) in $((SECONDS - started)) s with $jobs jobs"
    "$work/out/llama-server" --version 2>&1
  } > "$work/out/BUILD_INFO.txt"
  # Move into place in one step, so an interrupted build never leaves a half binary behind.
  rm -rf "$bin_dir"
  mv "$work/out" "$bin_dir"
  rm -rf "$work"
  trap - EXIT
  echo "[llama-server] built in $((SECONDS - started)) s: $bin_dir/llama-server"
}

if [ "$setup" = 1 ]; then
  build_server
fi
if [ "$serve" = 1 ]; then
  exec "$PY" "$LAUNCHER" "${launcher_args[@]}"
fi
