"""Name -> backend instance, built from configuration.

Adding a backend kind = one module that declares its `Kind` (backends/kinds.py)
+ one line in `KINDS` + its tests. Backends are created once per process and
shared by all chat sessions, so connection pools and the in-process model are
shared too.
"""

from __future__ import annotations

import asyncio
import importlib
from dataclasses import dataclass
from typing import Mapping

from backends.base import Backend, BackendInfo
from backends.errors import BackendError, UnknownBackend
from backends.kinds import Kind, parse_backend_config
from backends.offloop import off_loop
from config import BackendConfig, backend_names


def declared(module: str, name: str = "KIND") -> Kind:
    """The `Kind` a backend module declares (imported here, so that module stays the only place)."""
    return getattr(importlib.import_module(module), name)


# Every backend kind, one line each, in the order `.env.example` documents them.
KINDS: tuple[Kind, ...] = (
    declared("backends.llamacpp"),
    declared("backends.openai_compat", "VLLM_KIND"),
    declared("backends.openai_compat", "OPENAI_KIND"),
    declared("backends.tgi"),
    declared("backends.llama_server"),
)


def kind_named(name: str) -> Kind:
    """The kind called `name` (not an alias); LookupError names the known kinds."""
    for kind in KINDS:
        if kind.name == name:
            return kind
    raise LookupError(f"Unknown backend kind {name!r}. Known kinds: {', '.join(k.name for k in KINDS)}.")


def backend_configs(env: Mapping[str, str]) -> list[BackendConfig]:
    """Parse every backend named in BACKENDS, each through its kind's declared variables."""
    return [parse_backend_config(name, env, KINDS) for name in backend_names(env)]


def create_backend(config: BackendConfig) -> Backend:
    return kind_named(config.kind).create(config)


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
        """Every configured backend; a remote one talks on the process's backend loop
        (backends/offloop.py), so its figures are taken where its chunks arrive."""
        return cls({c.name: off_loop(create_backend(c)) for c in backend_configs(env)})

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
