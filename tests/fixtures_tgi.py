"""Fixtures for the TGI backend: the TGI-protocol stand-in (servers.tgi_protocol) on the real bundled model.

`tgi_server` is started once per test session (on a free port, the bundled
SmolLM2 GGUF) and stopped by PID at teardown. `tgi_backend_factory` builds
`TGIBackend`s pointed at it, on either route, and closes them after the test.

Register with `pytest_plugins = ["tests.fixtures_tgi"]` (or `-p tests.fixtures_tgi`).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Iterator

import pytest

from backends.llamacpp import bundled_model_path
from backends.tgi import TGIBackend
from config import BackendConfig
from servers.tgi_protocol import TGIServer, start_tgi_server

# The limits the test server runs with, so tests can go just past them.
TGI_MAX_CONCURRENT = 2
TGI_MAX_INPUT_TOKENS = 1024
TGI_MAX_TOTAL_TOKENS = 2048
TGI_LABEL = "TGI (test server)"


@pytest.fixture(scope="session")
def tgi_server() -> Iterator[TGIServer]:
    """The TGI-protocol stand-in serving the bundled model, for the whole session."""
    server = start_tgi_server(bundled_model_path(), max_concurrent=TGI_MAX_CONCURRENT,
                              max_input_tokens=TGI_MAX_INPUT_TOKENS, max_total_tokens=TGI_MAX_TOTAL_TOKENS)
    yield server
    server.stop()


@pytest.fixture
async def tgi_backend_factory(tgi_server: TGIServer):
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
