"""What the tests of the CUDA checkpoint backends share: jobs of CUDA worker
processes on the GPU emulator, the backends on it (this test process plays the
agent: the cuda backend calls the emulated driver loaded here, the
cuda-checkpoint backend runs the emulator's utility), and NVML as the real
pynvml reads it there."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from timeshare.activities.backends.base import BackendConfig
from timeshare.activities.backends.checkpointing import ProcessCheckpointBackend
from timeshare.activities.backends.cuda_checkpoint import CudaCheckpointBackend
from timeshare.activities.backends.cuda_driver import CudaDriverBackend
from timeshare.activities.backends.processes import ProcessTable
from timeshare.gpu_check import emulator
from timeshare.gpu_check.emulator.rig import CudaWorker, Emulator, nvml_device_memory, start_worker
from timeshare.models import NodeMove, SwitchInput

MiB = 2**20
GiB = 2**30
CONFIG = BackendConfig(node="n", lock_timeout_seconds=2.0, call_timeout_seconds=30.0)
KINDS = ["cuda", "cuda-checkpoint"]


class Job:
    def __init__(self, ranks: list[CudaWorker]) -> None:
        self.ranks = sorted(ranks, key=lambda rank: rank.pid)

    @property
    def pids(self) -> list[int]:
        return [rank.pid for rank in self.ranks]


@contextlib.contextmanager
def running_workers(emu: Emulator) -> Iterator[list[CudaWorker]]:
    """The workers a test starts; killed, and the emulator's faults cleared, after."""
    started: list[CudaWorker] = []
    try:
        yield started
    finally:
        emulator.clear_faults(emu.state_dir)
        for worker in started:
            worker.kill()


def read_emulated_nvml(monkeypatch: pytest.MonkeyPatch, emu: Emulator) -> None:
    """The backends read NVML (through the real pynvml, in a child process)."""
    monkeypatch.setattr(
        "timeshare.activities.backends.checkpointing.device_memory",
        lambda: nvml_device_memory(emu.env),
    )


def start_job(
    emu: Emulator,
    tmp_path: Path,
    workers: list[CudaWorker],
    table: ProcessTable,
    name: str,
    ranks: int = 2,
    nbytes: int = 8 * MiB,
    group: str = "g",
    children: int = 0,
) -> Job:
    job = []
    for index in range(ranks):
        worker = start_worker(
            emu.env, tmp_path, f"{group}-{name}-{index}", nbytes=nbytes, children=children
        )
        workers.append(worker)
        job.append(worker)
        table.register(group, name, worker.pid)
    return Job(job)


def driver_backend(emu: Emulator, table: ProcessTable, config: BackendConfig = CONFIG) -> Any:
    backend = CudaDriverBackend(config, emu.driver)
    backend.attach(table)
    return backend


def utility_backend(emu: Emulator, table: ProcessTable) -> CudaCheckpointBackend:
    backend = CudaCheckpointBackend(CONFIG, str(emu.lib_dir / emulator.UTILITY))
    backend.attach(table)
    return backend


def backend_of(kind: str, emu: Emulator, table: ProcessTable) -> ProcessCheckpointBackend:
    made: ProcessCheckpointBackend = (
        driver_backend(emu, table) if kind == "cuda" else utility_backend(emu, table)
    )
    return made


def spans(emu: Emulator, call: str, pids: list[int]) -> list[tuple[float, float, int]]:
    return sorted(s for s in emulator.intervals(emu.log, call) if s[2] in pids)


def switch_input(group: str, admit: str, plan: int, evict: list[str] | None = None) -> SwitchInput:
    return SwitchInput(
        group=group, epoch=plan, plan=plan, co_residency="auto",
        move=NodeMove(node="n", admit=admit, evict=evict or []),
    )  # fmt: skip
