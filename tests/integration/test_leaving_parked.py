"""A job that leaves while its state is parked in host memory, on the GPU
emulator, with co-residency off: its state never comes back while another
job holds the GPU (it would run beside it), it comes back once the GPU is
free, and its processes may exit meanwhile. This test process plays the agent."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from temporalio.testing import ActivityEnvironment

from tests.cuda_backends import KINDS, MiB, backend_of, read_emulated_nvml, start_job
from tests.polling import wait_until
from timeshare.activities.backends.processes import ProcessTable
from timeshare.activities.switch import SwitchActivities
from timeshare.gpu_check.emulator import CHECKPOINTED, RUNNING
from timeshare.gpu_check.emulator.rig import (
    CudaWorker,
    Emulator,
    nvml_device_memory,
    process_state,
)
from timeshare.models import NodeMove, ReleaseInput, ReleaseOutput, SwitchInput


@pytest.fixture(autouse=True)
def emulated_nvml(gpu_emulator: Emulator, monkeypatch: pytest.MonkeyPatch) -> None:
    read_emulated_nvml(monkeypatch, gpu_emulator)


def switch(admit: str, plan: int, evict: list[str] | None = None) -> SwitchInput:
    return SwitchInput(
        group="g", epoch=plan, plan=plan, co_residency="off",
        move=NodeMove(node="n", admit=admit, evict=evict or []),
    )  # fmt: skip


async def leave(agent: SwitchActivities, job: str) -> ReleaseOutput:
    output: ReleaseOutput = await ActivityEnvironment().run(
        agent.release, ReleaseInput(group="g", job=job)
    )
    return output


def device_bytes(emu: Emulator, pid: int) -> int:
    return nvml_device_memory(emu.env)["gpu0"].by_pid.get(pid) or 0


@pytest.mark.parametrize("kind", KINDS)
async def test_a_parked_job_that_leaves_waits_for_the_gpu_to_be_free(
    gpu_emulator: Emulator, tmp_path: Path, cuda_workers: list[CudaWorker], kind: str
) -> None:
    emu, table = gpu_emulator, ProcessTable()
    backend = backend_of(kind, emu, table)
    agent = SwitchActivities("n", backend, table)
    (parked,) = start_job(emu, tmp_path, cuda_workers, table, "a", ranks=1, nbytes=64 * MiB).pids
    (holder,) = start_job(emu, tmp_path, cuda_workers, table, "b", ranks=1, nbytes=64 * MiB).pids
    await ActivityEnvironment().run(agent.switch, switch("a", 1))
    await ActivityEnvironment().run(agent.switch, switch("b", 2, evict=["a"]))
    assert emu.state(parked) == (0, CHECKPOINTED)

    # a leaves while b holds the GPU: its state stays in host memory, its
    # process is not stopped (its CUDA calls wait), and it is told so.
    released = await leave(agent, "a")
    assert released.checkpointed == [parked]
    assert "parked in host memory while another job holds the GPU" in released.summary
    assert emu.state(parked) == (0, CHECKPOINTED)
    assert device_bytes(emu, parked) == 0 and device_bytes(emu, holder) > 0
    assert process_state(parked) not in ("T", "t")

    # b leaves: the GPU is free, and a's state comes back.
    await leave(agent, "b")
    assert emu.state(parked) == (0, RUNNING)
    assert device_bytes(emu, parked) > 0


async def test_a_parked_job_that_leaves_may_exit_before_the_gpu_is_free(
    gpu_emulator: Emulator, tmp_path: Path, cuda_workers: list[CudaWorker]
) -> None:
    emu, table = gpu_emulator, ProcessTable()
    backend = backend_of("cuda", emu, table)
    agent = SwitchActivities("n", backend, table)
    (rank,) = start_job(emu, tmp_path, cuda_workers, table, "a", ranks=1, nbytes=64 * MiB).ranks
    start_job(emu, tmp_path, cuda_workers, table, "b", ranks=1, nbytes=64 * MiB)
    await ActivityEnvironment().run(agent.switch, switch("a", 1))
    await ActivityEnvironment().run(agent.switch, switch("b", 2, evict=["a"]))
    await leave(agent, "a")
    # Its process exits with its state in host memory, which goes with it.
    rank.kill()
    await asyncio.to_thread(
        wait_until, lambda: process_state(rank.pid) in ("", "Z"), "the parked process to exit"
    )
    assert emu.state(rank.pid)[1] is None  # the driver knows it no more
    # The GPU frees: nothing is left to bring back, and nothing fails.
    released = await leave(agent, "b")
    assert released.failed == [] and "a" not in await backend.resident_jobs("g")
