"""The registry: built from configuration, lookups that explain themselves, honest status."""

import pytest

from backends.errors import UnknownBackend
from backends.llamacpp import LlamaCppBackend
from backends.offloop import OffLoopBackend
from backends.openai_compat import OpenAICompatBackend
from backends.registry import Registry
from backends.tgi import TGIBackend
from tests.fixtures_app import closed_loopback_port


def test_built_from_env_in_order_with_one_class_per_kind():
    registry = Registry.from_env({})
    assert registry.names == ["llama_cpp", "vllm", "tgi"]
    assert isinstance(registry.get("llama_cpp"), LlamaCppBackend)  # in process: not wrapped
    # A remote backend talks on the backend loop (backends/offloop.py): the wrapper holds the kind's class.
    assert isinstance(registry.get("vllm"), OffLoopBackend) and isinstance(registry.get("vllm").inner, OpenAICompatBackend)
    assert isinstance(registry.get("tgi"), OffLoopBackend) and isinstance(registry.get("tgi").inner, TGIBackend)
    # Each backend answers what its kind declares; callers never compare kind names.
    assert [backend.in_process for backend in registry] == [True, False, False]


def test_unknown_name_lists_the_configured_ones():
    registry = Registry.from_env({"BACKENDS": "llama_cpp,vllm"})
    with pytest.raises(UnknownBackend, match="Configured backends: llama_cpp, vllm"):
        registry.get("tgi")


async def test_a_backend_that_is_down_is_reported_with_the_reason():
    port = closed_loopback_port()  # nothing listens there
    registry = Registry.from_env({
        "BACKENDS": "gone,gone_tgi",
        "GONE_KIND": "vllm", "GONE_BASE_URL": f"http://127.0.0.1:{port}/v1",
        "GONE_TGI_KIND": "tgi", "GONE_TGI_BASE_URL": f"http://127.0.0.1:{port}",
    })
    for name in registry.names:
        status = await registry.status(name, timeout_s=5)
        assert not status.available and status.info is None
        assert f"127.0.0.1:{port}" in status.reason and "not reachable" in status.reason
    await registry.aclose()
