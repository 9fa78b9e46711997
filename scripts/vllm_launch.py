"""Build and run the command that starts a local vLLM server.

One launcher for people and tests: `scripts/vllm_server.sh` calls `main()`,
and the test fixture calls `server_command()` / `server_env()` so both start
vLLM the same way. Standard library only, so any Python can import it.

- CPU (no working `nvidia-smi`): serves the bundled SmolLM2-135M-Instruct,
  converted to Hugging Face format by `scripts/convert_gguf_to_hf.py`, with
  the recipe measured on 2-core AVX2 machines: float32 (bf16 is 4-5x slower
  there), `--enforce-eager` (otherwise ~5 min of compilation at every start),
  a 2048-token context, 2 GiB of KV cache and 32-token cache blocks (so the prefix
  cache can keep a short conversation's earlier turns), with each reply's cached
  prompt tokens reported (`--enable-prompt-tokens-details`).
- GPU: serves the model given by `--model` or VLLM_SERVE_MODEL (a local
  folder, or a model name if that machine may download it) with vLLM's
  default dtype and compilation.

The server binds 127.0.0.1 only.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Sequence

REPO = Path(__file__).resolve().parent.parent
# VLLM_VENV moves the environment elsewhere (default: .venv-vllm in the repository).
VLLM_VENV = Path(os.environ.get("VLLM_VENV") or REPO / ".venv-vllm")
CONVERTER = REPO / "scripts" / "convert_gguf_to_hf.py"
BUNDLED_MODEL_DIR = REPO / ".models" / "smollm2-135m-instruct-hf"
BUNDLED_MODEL_NAME = "smollm2-135m-instruct"
DEFAULT_PORT = 8001  # 8000 is Chainlit's default; VLLM_BASE_URL defaults here
CPU_MAX_MODEL_LEN = 2048
CPU_KV_CACHE_GIB = 2
# The prefix cache keeps whole blocks only. vLLM's CPU default is 128 tokens a block, so a class's
# conversation of a few hundred tokens would find at most one or two; 32 (the smallest size its CPU
# kernels are tuned for) lets a second turn reuse nearly all of the first.
CPU_BLOCK_SIZE = 32
SETUP_COMMAND = "bash scripts/vllm_server.sh --setup"

# Environment for every start: no telemetry, no model hub.
COMMON_ENV = {"VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1"}
CPU_ENV = {**COMMON_ENV, "HF_HUB_OFFLINE": "1", "VLLM_CPU_KVCACHE_SPACE": str(CPU_KV_CACHE_GIB)}


def vllm_python(venv: Path = VLLM_VENV) -> Path:
    """The Python of the vLLM virtual environment (it may not exist yet)."""
    return venv / "bin" / "python"


def missing_venv_message(venv: Path = VLLM_VENV) -> str | None:
    """None when the vLLM environment is usable, else what to run to create it."""
    if vllm_python(venv).is_file():
        return None
    return (
        f"The vLLM environment {venv} does not exist. Create it (a few minutes, ~3.5 GB) with "
        f"`{SETUP_COMMAND}` (or `--setup-only` to set up without starting the server)."
    )


def has_gpu() -> bool:
    """True when `nvidia-smi` runs and lists a GPU."""
    if shutil.which("nvidia-smi") is None:
        return False
    try:
        result = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return result.returncode == 0 and "GPU" in result.stdout


def supports_server_option(option: str, python: str | os.PathLike | None = None) -> bool:
    """Whether the installed vLLM's API server knows `option` (its name with underscores). Read from
    its source, without importing vLLM (slow)."""
    python = Path(python or vllm_python())
    for cli_args in python.parent.parent.glob("lib/python3*/site-packages/vllm/entrypoints/launchers/cli_args.py"):
        return option in cli_args.read_text(errors="replace")
    return False


def supports_per_request_metrics(python: str | os.PathLike | None = None) -> bool:
    """Whether the installed vLLM knows `--enable-per-request-metrics` (its own timing of each
    request on the closing usage chunk)."""
    return supports_server_option("enable_per_request_metrics", python)


def server_command(
    *,
    model: str | os.PathLike,
    served_model_name: str,
    port: int,
    cpu: bool,
    python: str | os.PathLike | None = None,
    host: str = "127.0.0.1",
    max_model_len: int | None = None,
    extra_args: Sequence[str] = (),
) -> list[str]:
    """The argv that starts vLLM's OpenAI-compatible server.

    `python -m vllm.entrypoints.openai.api_server` is used instead of the
    `vllm` console script, which crashes in the vllm-cpu distribution
    (its metadata is named vllm-cpu, not vllm).
    """
    command = [
        str(python or vllm_python()),
        "-m", "vllm.entrypoints.openai.api_server",
        "--model", str(model),
        "--served-model-name", served_model_name,
        "--host", host,
        "--port", str(port),
    ]
    if cpu:
        command += ["--dtype", "float32", "--enforce-eager", "--block-size", str(CPU_BLOCK_SIZE)]
        max_model_len = max_model_len or CPU_MAX_MODEL_LEN
    if max_model_len:
        command += ["--max-model-len", str(max_model_len)]
    if supports_per_request_metrics(python):
        # The server's own TTFT, queue and decode time per reply, shown beside the app's.
        command += ["--enable-per-request-metrics"]
    if supports_server_option("enable_prompt_tokens_details", python):
        # Each reply's usage says how many prompt tokens came from the prefix cache.
        command += ["--enable-prompt-tokens-details"]
    return command + list(extra_args)


def server_env(*, cpu: bool, base: dict[str, str] | None = None) -> dict[str, str]:
    """Environment for the server: our defaults, overridden by what is already set."""
    defaults = CPU_ENV if cpu else COMMON_ENV
    base = dict(os.environ if base is None else base)
    return {**defaults, **base}


def convert_bundled_model(python: str | os.PathLike | None = None, output_dir: Path = BUNDLED_MODEL_DIR) -> None:
    """Run the GGUF -> Hugging Face converter with the vLLM environment's Python (no-op if done)."""
    subprocess.run(
        [str(python or vllm_python()), str(CONVERTER), "--out", str(output_dir)],
        check=True, env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="Start a local vLLM server (the bundled model on CPU, your model on a GPU).",
        epilog="Arguments after `--` go to vLLM unchanged.",
    )
    parser.add_argument("--port", type=int, default=int(os.environ.get("PORT", DEFAULT_PORT)))
    parser.add_argument("--model", default=os.environ.get("VLLM_SERVE_MODEL", ""),
                        help="model folder or name (default on CPU: the converted bundled SmolLM2)")
    parser.add_argument("--served-model-name", default=os.environ.get("VLLM_SERVED_MODEL_NAME", ""))
    parser.add_argument("--max-model-len", type=int, default=None)
    parser.add_argument("--device", choices=("auto", "cpu", "gpu"), default=os.environ.get("VLLM_DEVICE", "auto"))
    parser.add_argument("--print-command", action="store_true", help="print the command and exit")
    own_args, extra_args = _split_extra(sys.argv[1:] if argv is None else argv)
    args = parser.parse_args(own_args)

    problem = missing_venv_message()
    if problem:
        print(problem, file=sys.stderr)
        return 2
    cpu = args.device == "cpu" or (args.device == "auto" and not has_gpu())
    model = args.model
    if not model:
        if not cpu:
            print("On a GPU, say which model to serve: --model DIR_OR_NAME or VLLM_SERVE_MODEL.", file=sys.stderr)
            return 2
        model = str(BUNDLED_MODEL_DIR)
    served_model_name = args.served_model_name or (
        BUNDLED_MODEL_NAME if model == str(BUNDLED_MODEL_DIR) else Path(model).name or model
    )
    command = server_command(
        model=model, served_model_name=served_model_name, port=args.port, cpu=cpu,
        max_model_len=args.max_model_len, extra_args=extra_args,
    )
    env = server_env(cpu=cpu)
    if args.print_command:
        print(" ".join(command))
        return 0
    if model == str(BUNDLED_MODEL_DIR):
        convert_bundled_model()
    device = "CPU (float32, eager; /health answers after about a minute)" if cpu else "GPU"
    print(f"Starting vLLM on {device}: model {served_model_name} at http://127.0.0.1:{args.port}/v1", flush=True)
    print("  " + " ".join(command), flush=True)
    # Replace this process so Ctrl-C and SIGTERM reach vLLM directly.
    os.execve(command[0], command, env)


def _split_extra(argv: list[str]) -> tuple[list[str], list[str]]:
    if "--" in argv:
        index = argv.index("--")
        return argv[:index], argv[index + 1:]
    return argv, []


if __name__ == "__main__":
    sys.exit(main())
