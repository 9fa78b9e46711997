"""Start the TGI-protocol stand-in in a process of its own, and talk to its test-only routes.

`start_tgi_server(model_path)` serves a GGUF model (starts in seconds to a
minute), `start_paced_tgi_server(rate, tokens)` the paced engine (about a
second); both return a `TGIServer` once /health answers, stopped by PID with
`.stop()`. Nothing here loads a model or imports llama.cpp.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import httpx

from servers.process import PYTHON, ServerProcess, free_port

START_TIMEOUT_S = 90.0
PACED_MODEL_ID = "paced-test-model"  # what the paced engine reports as its model (engines.PacedEngine)


@dataclass
class TGIServer:
    """A running TGI-protocol stand-in, where to reach it, and its test-only routes."""

    url: str
    process: ServerProcess
    model_id: str

    def stop(self) -> None:
        self.process.stop()

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
        or its client leaves). See servers/tgi_protocol/faults.py."""
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


def _command(port: int, *options: str) -> list[str]:
    return [PYTHON, "-m", "servers.tgi_protocol", "--host", "127.0.0.1", "--port", str(port), *options]


def model_command(port: int, model_path: Path, *, max_concurrent: int = 128, max_input_tokens: int = 1024,
                  max_total_tokens: int = 2048) -> list[str]:
    """The command that serves `model_path` (a GGUF file) on `port`."""
    return _command(port, "--model", str(model_path), "--max-concurrent", str(max_concurrent),
                    "--max-input-tokens", str(max_input_tokens), "--max-total-tokens", str(max_total_tokens))


def paced_command(port: int, rate_tokens_per_s: float, tokens: int, first_token_s: float = 0.0, *,
                  max_input_tokens: int = 1024, max_total_tokens: int = 2048) -> list[str]:
    """The command that serves the paced engine on `port`: `tokens` per reply at the given rate."""
    return _command(port, "--paced-rate", str(rate_tokens_per_s), "--paced-tokens", str(tokens),
                    "--paced-first-token-s", str(first_token_s),
                    "--max-input-tokens", str(max_input_tokens), "--max-total-tokens", str(max_total_tokens))


def start_tgi_server(model_path: Path, *, name: str = "tgi-protocol-server", timeout_s: float = START_TIMEOUT_S,
                     **limits: int) -> TGIServer:
    """The stand-in serving a GGUF model on a free loopback port, once /health answers.
    `limits`: max_concurrent, max_input_tokens, max_total_tokens (TGI's flags of those names)."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    process = ServerProcess(name, model_command(port, model_path, **limits)).start_serving(f"{url}/health", timeout_s)
    return TGIServer(url, process, model_id=model_path.name)


def start_paced_tgi_server(rate_tokens_per_s: float, tokens: int, first_token_s: float = 0.0, *,
                           name: str = "tgi-paced-server", timeout_s: float = START_TIMEOUT_S,
                           **limits: int) -> TGIServer:
    """The stand-in with its paced engine (no model): known send times, starts in ~1 s.
    `limits`: max_input_tokens, max_total_tokens."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    command = paced_command(port, rate_tokens_per_s, tokens, first_token_s, **limits)
    process = ServerProcess(name, command).start_serving(f"{url}/health", timeout_s)
    return TGIServer(url, process, model_id=PACED_MODEL_ID)
