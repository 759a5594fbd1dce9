"""The node's NVIDIA GPUs, read through NVML (pynvml). Where there is no
driver the inventory is absent, with the reason, never a zero."""

from __future__ import annotations

import warnings
from pathlib import Path
from types import ModuleType

from pydantic import BaseModel

# The driver's checkpoint API (cuCheckpointProcess*) needs this branch or later.
CHECKPOINT_API_DRIVER = 570


class GpuInfo(BaseModel):
    index: int
    uuid: str
    name: str
    memory_total_bytes: int
    memory_used_bytes: int
    driver_version: str
    checkpoint_api: bool
    # Percent of the last sample period a kernel ran (NVML); None if unreadable.
    utilization_percent: float | None = None

    def describe(self) -> str:
        api = "checkpoint API" if self.checkpoint_api else "no checkpoint API"
        return (
            f"gpu{self.index} {self.name} {self.uuid} "
            f"{self.memory_used_bytes / 2**30:.1f}/{self.memory_total_bytes / 2**30:.0f} GiB, "
            f"driver {self.driver_version} ({api})"
        )


class NoGpus(Exception):
    """NVML is not usable here; the message says why."""


def _nvml() -> ModuleType:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the pynvml shim warns that it is deprecated
        import pynvml
    module: ModuleType = pynvml
    return module


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value


class DeviceMemory(BaseModel):
    """One GPU's memory as NVML reports it."""

    free_bytes: int
    # None for a process whose memory NVML cannot tell: pynvml gives
    # usedGpuMemory None for NVML_VALUE_NOT_AVAILABLE, which is what it
    # reports under MIG and without per-process accounting. Unknown, never 0.
    by_pid: dict[int, int | None]
    total_bytes: int = 0

    @property
    def used_bytes(self) -> int:
        return max(0, self.total_bytes - self.free_bytes)


def _add(total: int | None, count: int | None) -> int | None:
    return None if total is None or count is None else total + count


def device_memory() -> dict[str, DeviceMemory]:
    """Each GPU's free memory and the bytes each process uses on it, keyed
    "gpu<index>"; empty without NVML."""
    nvml = _nvml()
    try:
        nvml.nvmlInit()
    except Exception:
        return {}
    try:
        found = {}
        for index in range(nvml.nvmlDeviceGetCount()):
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            by_pid: dict[int, int | None] = {}
            for process in nvml.nvmlDeviceGetComputeRunningProcesses(handle):
                used = process.usedGpuMemory
                count = None if used is None else int(used)
                by_pid[process.pid] = _add(by_pid.get(process.pid, 0), count)
            memory = nvml.nvmlDeviceGetMemoryInfo(handle)
            found[f"gpu{index}"] = DeviceMemory(
                free_bytes=int(memory.free), by_pid=by_pid, total_bytes=int(memory.total)
            )
        return found
    finally:
        nvml.nvmlShutdown()


def device_memory_by_pid() -> dict[int, int | None]:
    """Device bytes each process uses, over every GPU (None: NVML cannot
    tell); empty without NVML."""
    used: dict[int, int | None] = {}
    for gpu in device_memory().values():
        for pid, count in gpu.by_pid.items():
            used[pid] = _add(used.get(pid, 0), count)
    return used


def host_memory_available() -> int:
    """MemAvailable from /proc/meminfo, in bytes."""
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    return 0


def node_gpus() -> list[str]:
    """This node's GPUs described for the node registry; none without a driver."""
    try:
        return [gpu.describe() for gpu in gpu_inventory()]
    except NoGpus:
        return []


def gpu_inventory() -> list[GpuInfo]:
    nvml = _nvml()
    try:
        nvml.nvmlInit()
    except Exception as error:
        raise NoGpus(f"no NVIDIA driver found ({error})") from None
    try:
        driver = _text(nvml.nvmlSystemGetDriverVersion())
        major = int(driver.split(".")[0]) if driver.split(".")[0].isdigit() else 0
        gpus = []
        for index in range(nvml.nvmlDeviceGetCount()):
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            memory = nvml.nvmlDeviceGetMemoryInfo(handle)
            try:
                utilization: float | None = float(nvml.nvmlDeviceGetUtilizationRates(handle).gpu)
            except Exception:  # some GPUs (MIG slices) have no utilization counter
                utilization = None
            gpus.append(
                GpuInfo(
                    index=index,
                    uuid=_text(nvml.nvmlDeviceGetUUID(handle)),
                    name=_text(nvml.nvmlDeviceGetName(handle)),
                    memory_total_bytes=int(memory.total),
                    memory_used_bytes=int(memory.used),
                    driver_version=driver,
                    checkpoint_api=major >= CHECKPOINT_API_DRIVER,
                    utilization_percent=utilization,
                )
            )
        return gpus
    finally:
        nvml.nvmlShutdown()
