"""The GPU inventory read through NVML, with a fake NVML module."""

from __future__ import annotations

import sys
from types import ModuleType, SimpleNamespace

import pytest

from timeshare.activities.backends.gpus import NoGpus, gpu_inventory


def fake_nvml(driver: str, fail: bool = False) -> ModuleType:
    nvml = ModuleType("pynvml")

    def init() -> None:
        if fail:
            raise RuntimeError("NVML Shared Library Not Found")

    nvml.nvmlInit = init  # type: ignore[attr-defined]
    nvml.nvmlShutdown = lambda: None  # type: ignore[attr-defined]
    nvml.nvmlSystemGetDriverVersion = lambda: driver.encode()  # type: ignore[attr-defined]
    nvml.nvmlDeviceGetCount = lambda: 2  # type: ignore[attr-defined]
    nvml.nvmlDeviceGetHandleByIndex = lambda i: i  # type: ignore[attr-defined]
    nvml.nvmlDeviceGetUUID = lambda h: f"GPU-{h}"  # type: ignore[attr-defined]
    nvml.nvmlDeviceGetName = lambda h: b"NVIDIA H200"  # type: ignore[attr-defined]
    nvml.nvmlDeviceGetMemoryInfo = lambda h: SimpleNamespace(  # type: ignore[attr-defined]
        total=141 * 2**30, used=2**30 * h
    )
    return nvml


def test_inventory_reads_each_gpu_and_the_checkpoint_api(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", fake_nvml("575.51.03"))
    gpus = gpu_inventory()
    assert [(g.index, g.uuid, g.memory_used_bytes) for g in gpus] == [
        (0, "GPU-0", 0),
        (1, "GPU-1", 2**30),
    ]
    assert all(g.checkpoint_api and g.name == "NVIDIA H200" for g in gpus)
    monkeypatch.setitem(sys.modules, "pynvml", fake_nvml("550.90.07"))
    assert not any(g.checkpoint_api for g in gpu_inventory())


def test_no_driver_is_said_not_zeroed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", fake_nvml("", fail=True))
    with pytest.raises(NoGpus, match="no NVIDIA driver"):
        gpu_inventory()
