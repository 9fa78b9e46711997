"""Fixtures for the TGI backend: a TGI-protocol server on the real bundled model.

`tgi_server` is started once per test session (tests.tgi_protocol_server on
a free port, the bundled SmolLM2 GGUF) and stopped by PID at teardown.
`tgi_backend_factory` builds `TGIBackend`s pointed at it, on either route,
and closes them after the test.

Register with `pytest_plugins = ["tests.fixtures_tgi"]` (or `-p tests.fixtures_tgi`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from dataclasses import dataclass
from typing import Any, Callable

import httpx
import pytest

from backends.llamacpp import bundled_model_path
from backends.tgi import TGIBackend
from config import BackendConfig
from tests.servers import PYTHON, ServerProcess, free_port

# The limits the test server runs with, so tests can go just past them.
TGI_MAX_CONCURRENT = 2
TGI_MAX_INPUT_TOKENS = 1024
TGI_MAX_TOTAL_TOKENS = 2048
TGI_START_TIMEOUT_S = 90.0
TGI_LABEL = "TGI (test server)"


@dataclass
class TGITestServer:
    """The running server and its test-only routes."""

    url: str
    process: ServerProcess
    model_id: str

    async def _get(self, path: str) -> Any:
        async with httpx.AsyncClient(base_url=self.url, timeout=10) as client:
            response = await client.get(path)
            response.raise_for_status()
            return response.json()

    async def violations(self) -> list[dict[str, Any]]:
        """Responses and events the server sent that broke the spec."""
        return await self._get("/__contract__/violations")

    async def requests(self) -> list[dict[str, Any]]:
        """Every request so far: path, JSON body, has_authorization, request_schema_problems."""
        return await self._get("/__test__/requests")

    async def clear_requests(self) -> None:
        async with httpx.AsyncClient(base_url=self.url, timeout=10) as client:
            (await client.delete("/__test__/requests")).raise_for_status()

    async def generations(self) -> list[dict[str, Any]]:
        """Each generation: id, path, status, generated_tokens, max_new_tokens, adapter_id."""
        return await self._get("/__test__/generations")

    async def in_flight(self) -> int:
        return (await self._get("/__test__/state"))["in_flight"]

    async def set_faults(self, **faults: Any) -> None:
        """Arm test faults: fail_after_tokens=N (+ error_type=...), http_status=429 (+ retry_after="7"),
        corrupt_next_event={"drop": ...} or {"set": {...}}, unhealthy=True/False,
        hold_after_tokens=N (the next generation pauses after N tokens until `release_holds()`
        or its client leaves)."""
        async with httpx.AsyncClient(base_url=self.url, timeout=10) as client:
            (await client.post("/__test__/faults", json=faults)).raise_for_status()

    async def release_holds(self) -> None:
        """Let every generation paused by hold_after_tokens go on."""
        await self.set_faults(release_holds=True)

    async def wait_until_held(self, timeout_s: float = 60.0) -> dict[str, Any]:
        """The latest generation, once it is paused by hold_after_tokens (so it is still running,
        whatever the machine's speed)."""
        async def held():
            generations = await self.generations()
            return generations[-1] if generations and generations[-1]["held"] else None

        return await self.wait_until(held, timeout_s=timeout_s, what="the generation to reach its hold")

    async def wait_until(self, predicate: Callable[[], Any], timeout_s: float = 10.0, what: str = "") -> Any:
        """Poll an async predicate until it returns something truthy."""
        deadline = time.monotonic() + timeout_s
        while True:
            result = await predicate()
            if result:
                return result
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out after {timeout_s:g} s waiting for {what or predicate}")
            await asyncio.sleep(0.05)


@pytest.fixture(scope="session")
def tgi_server() -> TGITestServer:
    """The TGI-protocol test server serving the bundled model, for the whole session."""
    model_path = bundled_model_path()
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    process = ServerProcess("tgi-protocol-server", [
        PYTHON, "-m", "tests.tgi_protocol_server",
        "--host", "127.0.0.1", "--port", str(port),
        "--model", str(model_path),
        "--max-concurrent", str(TGI_MAX_CONCURRENT),
        "--max-input-tokens", str(TGI_MAX_INPUT_TOKENS),
        "--max-total-tokens", str(TGI_MAX_TOTAL_TOKENS),
    ])
    process.start()
    try:
        process.wait_http(f"{url}/health", TGI_START_TIMEOUT_S)
        yield TGITestServer(url, process, model_id=model_path.name)
    finally:
        process.stop()


def start_paced_tgi_server(rate_tokens_per_s: float, tokens: int, first_token_s: float = 0.0,
                           *, name: str = "tgi-paced-server") -> TGITestServer:
    """The TGI-protocol server with its paced engine (no model): known send times, starts in ~1 s."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    process = ServerProcess(name, [
        PYTHON, "-m", "tests.tgi_protocol_server", "--host", "127.0.0.1", "--port", str(port),
        "--paced-rate", str(rate_tokens_per_s), "--paced-tokens", str(tokens),
        "--paced-first-token-s", str(first_token_s),
        "--max-input-tokens", str(TGI_MAX_INPUT_TOKENS), "--max-total-tokens", str(TGI_MAX_TOTAL_TOKENS),
    ])
    process.start_serving(f"{url}/health", TGI_START_TIMEOUT_S)
    return TGITestServer(url, process, model_id="paced-test-model")


@pytest.fixture
async def tgi_backend_factory(tgi_server: TGITestServer):
    """Build TGIBackends on the test server: `make(route="messages"|"generate", **overrides)`, each
    override a BackendConfig field (base_url, api_key, timeout_s...) or a TGI option (adapter_id,
    chat_template)."""
    created: list[TGIBackend] = []
    fields = {f.name for f in dataclasses.fields(BackendConfig)}

    def make(route: str = "messages", **overrides: Any) -> TGIBackend:
        values = dict(name="tgi", kind="tgi", label=TGI_LABEL, base_url=tgi_server.url,
                      timeout_s=60.0, connect_timeout_s=3.0)
        values.update({key: value for key, value in overrides.items() if key in fields})
        options = {"route": route, **{key: value for key, value in overrides.items() if key not in fields}}
        backend = TGIBackend(BackendConfig(**values, options=options))
        created.append(backend)
        return backend

    yield make
    for backend in created:
        await backend.aclose()
