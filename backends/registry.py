"""Name -> backend instance, built from configuration.

Adding a backend kind = one module + one line in `_FACTORIES` + its tests.
Backends are created once per process and shared by all chat sessions, so
connection pools and the in-process model are shared too.
"""

from __future__ import annotations

import asyncio
import importlib
from dataclasses import dataclass
from typing import Mapping

from backends.base import Backend, BackendInfo
from backends.errors import BackendError, UnknownBackend
from config import BackendConfig, backend_configs

# kind -> "module:Class"; imported lazily so a missing optional dependency only
# affects the backends that need it.
_FACTORIES = {
    "llamacpp": "backends.llamacpp:LlamaCppBackend",
    "vllm": "backends.openai_compat:OpenAICompatBackend",
    "openai": "backends.openai_compat:OpenAICompatBackend",
    "tgi": "backends.tgi:TGIBackend",
}


def create_backend(config: BackendConfig) -> Backend:
    module_name, class_name = _FACTORIES[config.kind].split(":")
    return getattr(importlib.import_module(module_name), class_name)(config)


@dataclass(frozen=True)
class BackendStatus:
    """Whether a backend can serve right now, and what it is."""

    name: str
    label: str
    url: str
    available: bool
    info: BackendInfo | None = None
    reason: str | None = None


class Registry:
    """The configured backends, in configuration order."""

    def __init__(self, backends: Mapping[str, Backend]) -> None:
        self._backends = dict(backends)

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> "Registry":
        return cls({c.name: create_backend(c) for c in backend_configs(env)})

    @property
    def names(self) -> list[str]:
        return list(self._backends)

    def get(self, name: str) -> Backend:
        try:
            return self._backends[name]
        except KeyError:
            raise UnknownBackend(name, self.names) from None

    def __iter__(self):
        return iter(self._backends.values())

    async def status(self, name: str, timeout_s: float = 5.0) -> BackendStatus:
        """Probe one backend: health then info, each bounded by timeout_s."""
        backend = self.get(name)
        try:
            await asyncio.wait_for(backend.health(), timeout_s)
            info = await asyncio.wait_for(backend.info(), timeout_s)
        except BackendError as error:
            return BackendStatus(name, backend.label, backend.url, False, reason=error.describe())
        except asyncio.TimeoutError:
            return BackendStatus(name, backend.label, backend.url, False,
                                 reason=f"{backend.label} at {backend.url} did not answer within {timeout_s:.0f} s.")
        return BackendStatus(name, backend.label, backend.url, True, info=info)

    async def aclose(self) -> None:
        for backend in self:
            await backend.aclose()
