"""GPU memory through NVML, on a fake `pynvml`: a number only when NVML reports the engine's processes."""

from __future__ import annotations

import sys
from types import ModuleType, SimpleNamespace

import pytest

from core.load.engine_memory import MIB, gpu_memory_mib


def fake_pynvml(devices: list[list[SimpleNamespace]]) -> ModuleType:
    """A `pynvml` whose GPUs run the given processes (pid, usedGpuMemory), all as compute processes."""
    module = ModuleType("pynvml")
    module.NVMLError = type("NVMLError", (Exception,), {})
    module.nvmlInit = lambda: None
    module.nvmlShutdown = lambda: None
    module.nvmlDeviceGetCount = lambda: len(devices)
    module.nvmlDeviceGetHandleByIndex = lambda index: index
    module.nvmlDeviceGetComputeRunningProcesses = lambda device: list(devices[device])
    module.nvmlDeviceGetGraphicsRunningProcesses = lambda device: []
    return module


def process(pid: int, used_bytes: int | None) -> SimpleNamespace:
    return SimpleNamespace(pid=pid, usedGpuMemory=used_bytes)


@pytest.fixture
def nvml(monkeypatch):
    def install(*devices: list[SimpleNamespace]) -> None:
        monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml(list(devices)))
    return install


def test_the_engines_processes_on_every_gpu_are_added_up(nvml):
    nvml([process(10, 1000 * MIB), process(99, 5000 * MIB)], [process(11, 500 * MIB)])
    assert gpu_memory_mib({10, 11}) == (1500.0, "NVML, the engine's processes")


def test_processes_nvml_does_not_list_are_not_measured_rather_than_zero(nvml):
    # In a container NVML lists the host's PIDs, none of which is ours.
    nvml([process(4242, 1000 * MIB)])
    used, note = gpu_memory_mib({10, 11})
    assert used is None
    assert note.startswith("not measured (") and "PID namespace" in note


def test_a_process_whose_memory_nvml_does_not_know_is_not_measured(nvml):
    nvml([process(10, 1000 * MIB), process(11, None)])
    used, note = gpu_memory_mib({10, 11})
    assert used is None
    assert note.startswith("not measured (") and "does not report" in note


def test_no_gpu_is_not_measured(nvml):
    nvml()
    assert gpu_memory_mib({10}) == (None, "not measured (NVML sees no GPU)")
