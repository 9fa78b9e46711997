"""How much memory an engine holds: its processes' RSS, and their GPU memory through NVML.

A local server is found by the port it listens on (its child processes - vLLM's
engine core, TGI's shards - are counted with it); the embedded llama.cpp lives
in this process. GPU memory is read with NVML (`nvidia-ml-py`) for those
processes when a GPU is present. What cannot be measured says why ("remote
server", "no GPU") - never a guess.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from urllib.parse import urlparse

import psutil

from backends.base import Backend
from vocabulary import LOOPBACK_HOSTS

MIB = 1024 * 1024


@dataclass(frozen=True)
class MemoryReading:
    """An engine's memory, or why it was not measured."""

    cpu_rss_mib: float | None
    cpu_note: str
    gpu_mib: float | None
    gpu_note: str


def listening_pid(port: int) -> int | None:
    """The process listening on a loopback TCP port, or None."""
    for connection in psutil.net_connections(kind="tcp"):
        if connection.status == psutil.CONN_LISTEN and connection.laddr and connection.laddr.port == port:
            return connection.pid
    return None


def process_tree(pid: int) -> list[psutil.Process]:
    """A process and all its descendants."""
    process = psutil.Process(pid)
    return [process, *process.children(recursive=True)]


def _rss_mib(processes: list[psutil.Process]) -> float:
    total = 0
    for process in processes:
        try:
            total += process.memory_info().rss
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return total / MIB


def gpu_memory_mib(pids: set[int]) -> tuple[float | None, str]:
    """GPU memory used by `pids` on every GPU (NVML), or None and why not."""
    try:
        import pynvml
    except ImportError:
        return None, "not measured (nvidia-ml-py is not installed)"
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return None, "not measured (no GPU: NVML is not available)"
    try:
        count = pynvml.nvmlDeviceGetCount()
        if count == 0:
            return None, "not measured (NVML sees no GPU)"
        used: list[int | None] = []
        for index in range(count):
            device = pynvml.nvmlDeviceGetHandleByIndex(index)
            processes = (pynvml.nvmlDeviceGetComputeRunningProcesses(device)
                         + pynvml.nvmlDeviceGetGraphicsRunningProcesses(device))
            used += [p.usedGpuMemory for p in processes if p.pid in pids]
        # Zero would be a guess in both cases: NVML may list other PIDs than ours (another PID
        # namespace, as in a container), and may not know a process's memory (None).
        if not used:
            return None, ("not measured (NVML lists none of the engine's processes: it uses no GPU, "
                          "or runs in another PID namespace, e.g. a container)")
        if any(value is None for value in used):
            return None, "not measured (NVML does not report the memory of the engine's processes here)"
        return sum(used) / MIB, "NVML, the engine's processes"
    except pynvml.NVMLError as error:
        return None, f"not measured (NVML: {error})"
    finally:
        pynvml.nvmlShutdown()


def measure_memory(backend: Backend) -> MemoryReading:
    """The engine's memory now: this process for an in-process engine, or the local server behind `backend.url`."""
    if backend.in_process:
        processes = process_tree(os.getpid())
        note = "this process (the model is loaded in it)"
    else:
        parsed = urlparse(backend.url)
        if (parsed.hostname or "") not in LOOPBACK_HOSTS:
            return MemoryReading(None, "not measured (remote server)", None, "not measured (remote server)")
        port = parsed.port or (443 if parsed.scheme == "https" else 80)
        try:
            pid = listening_pid(port)
        except psutil.AccessDenied:
            return MemoryReading(None, "not measured (no permission to list sockets)", None, "not measured")
        if pid is None:
            return MemoryReading(None, f"not measured (no process of ours listens on port {port})", None,
                                 "not measured")
        try:
            processes = process_tree(pid)
        except psutil.NoSuchProcess:
            return MemoryReading(None, "not measured (the server exited)", None, "not measured")
        note = f"process {pid} on port {port}" + (f" + {len(processes) - 1} child(ren)" if len(processes) > 1 else "")
    gpu, gpu_note = gpu_memory_mib({process.pid for process in processes})
    return MemoryReading(_rss_mib(processes), note, gpu, gpu_note)
