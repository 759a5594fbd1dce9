"""Memory a CUDA checkpoint or restore needs, checked before anything moves,
on the GPU emulator: device room for a restore (a restore the driver fails
for lack of memory can never be retried on driver 580, NVIDIA/cuda-checkpoint#44),
a process NVML does not list is unknown and never kept
co-resident, and a checkpoint respects the memory limit of the job's cgroup."""

from __future__ import annotations

import asyncio
import contextlib
import os
from pathlib import Path

import pytest
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

from tests.cuda_backends import (
    CONFIG,
    KINDS,
    MiB,
    backend_of,
    driver_backend,
    read_emulated_nvml,
    start_job,
    switch_input,
)
from tests.polling import wait_until
from timeshare.activities.backends.base import BackendError, JobFailed, NoDeviceRoom
from timeshare.activities.backends.cgroups import Hierarchy, cgroup_memory_room, hierarchies
from timeshare.activities.backends.gpus import DeviceMemory
from timeshare.activities.backends.processes import ProcessTable
from timeshare.activities.switch import SwitchActivities
from timeshare.gpu_check import emulator
from timeshare.gpu_check.emulator import CHECKPOINTED, CUDA_ERROR_OUT_OF_MEMORY, RUNNING
from timeshare.gpu_check.emulator.rig import CudaWorker, Emulator, nvml_device_memory, start_worker
from timeshare.models import NO_DEVICE_ROOM, FailureKind


@pytest.fixture(autouse=True)
def emulated_nvml(gpu_emulator: Emulator, monkeypatch: pytest.MonkeyPatch) -> None:
    read_emulated_nvml(monkeypatch, gpu_emulator)


@pytest.mark.parametrize("kind", KINDS)
async def test_a_restore_that_does_not_fit_is_refused_before_the_driver_is_asked(
    gpu_emulator: Emulator, tmp_path: Path, cuda_workers: list[CudaWorker], kind: str
) -> None:
    """Asked to restore into a full device, the driver would fail and leave
    the process unrestorable for good (NVIDIA/cuda-checkpoint#44): the room is checked first,
    and the job stays parked, restorable once the room is free."""
    emu, table = gpu_emulator, ProcessTable()
    backend = backend_of(kind, emu, table)
    agent = SwitchActivities("n", backend, table)
    (rank,) = start_job(emu, tmp_path, cuda_workers, table, "a", ranks=1, nbytes=400 * MiB).ranks
    await backend.checkpoint("g", "a")
    filler = start_worker(emu.env, tmp_path, "filler", nbytes=700 * MiB)  # of the GPU's 1 GiB
    cuda_workers.append(filler)
    with pytest.raises(ApplicationError) as refused:
        await ActivityEnvironment().run(agent.switch, switch_input("g", "a", 1))
    failure = refused.value
    assert (failure.type, failure.non_retryable) == (FailureKind.RESTORE, True)
    assert failure.details == ("a", NO_DEVICE_ROOM)
    assert "gpu0: needs 0.4 GiB, 0.3 GiB free" in failure.message
    assert f"in use by processes {filler.pid} (0.7 GiB)" in failure.message
    assert not emulator.calls(emu.log, "restoreThread.restore", rank.pid)
    released = await backend.release("g", "a")  # nor is it tried on the way out
    assert released.checkpointed == [rank.pid] and "not restored" in released.done[0]
    filler.kill()
    await asyncio.to_thread(
        wait_until, lambda: filler.pid not in nvml_device_memory(emu.env)["gpu0"].by_pid, "room"
    )
    assert (await backend.restore("g", "a")).action == "restore"
    rank.advancing()


async def test_restores_under_way_hold_their_room_whatever_their_group(
    gpu_emulator: Emulator, tmp_path: Path, cuda_workers: list[CudaWorker]
) -> None:
    emu, table = gpu_emulator, ProcessTable()
    backend = driver_backend(emu, table)
    one = start_job(emu, tmp_path, cuda_workers, table, "a", ranks=1, nbytes=400 * MiB, group="g1")
    two = start_job(emu, tmp_path, cuda_workers, table, "b", ranks=1, nbytes=400 * MiB, group="g2")
    await backend.checkpoint("g1", "a")
    await backend.checkpoint("g2", "b")
    cuda_workers.append(start_worker(emu.env, tmp_path, "filler", nbytes=300 * MiB))
    for pid in one.pids + two.pids:  # both restores under way at once
        emulator.add_fault(emu.state_dir, pid, "restore", "delay", 500)
    outcomes = await asyncio.gather(
        backend.restore("g1", "a"), backend.restore("g2", "b"), return_exceptions=True
    )
    refused = [o for o in outcomes if isinstance(o, BaseException)]
    assert len(refused) == 1 and isinstance(refused[0], NoDeviceRoom), outcomes
    assert "held by restores under way" in str(refused[0])
    # The refused job was never asked: it can still come back.
    left = two if isinstance(outcomes[1], BaseException) else one
    assert not emulator.calls(emu.log, "restoreThread.restore", left.pids[0])
    assert emu.state(left.pids[0]) == (0, CHECKPOINTED)


@pytest.mark.parametrize("kind", KINDS)
async def test_a_restore_the_driver_fails_for_lack_of_memory_fails_the_job_for_good(
    gpu_emulator: Emulator, tmp_path: Path, cuda_workers: list[CudaWorker], kind: str
) -> None:
    """NVIDIA/cuda-checkpoint#44: such a process can never be restored on driver 580. The job
    is failed (the scheduler evicts it), never asked to restore again."""
    emu, table = gpu_emulator, ProcessTable()
    backend = backend_of(kind, emu, table)
    agent = SwitchActivities("n", backend, table)
    (rank,) = start_job(emu, tmp_path, cuda_workers, table, "a", ranks=1).ranks
    await backend.checkpoint("g", "a")
    emulator.add_fault(emu.state_dir, rank.pid, "restore", "error", CUDA_ERROR_OUT_OF_MEMORY)
    with pytest.raises(JobFailed, match=r"ran out of device memory.*cuda-checkpoint#44"):
        await backend.restore("g", "a")
    emulator.clear_faults(emu.state_dir)
    asked = len(emulator.calls(emu.log, "restoreThread.restore", rank.pid))
    with pytest.raises(ApplicationError) as failed:
        await ActivityEnvironment().run(agent.switch, switch_input("g", "a", 1))
    assert (failed.value.type, failed.value.details) == (FailureKind.JOB_FAILED, ("a",))
    assert len(emulator.calls(emu.log, "restoreThread.restore", rank.pid)) == asked
    released = await backend.release("g", "a")
    assert released.checkpointed == [rank.pid] and "cuda-checkpoint#44" in released.done[0]
    assert len(emulator.calls(emu.log, "restoreThread.restore", rank.pid)) == asked


def hide_from_nvml(monkeypatch: pytest.MonkeyPatch, emu: Emulator, hidden: list[int]) -> None:
    """NVML lists these processes nowhere: as an agent in another PID namespace
    sees it, or before NVML has caught up with a new process."""

    def memory() -> dict[str, DeviceMemory]:
        return {
            gpu: m.model_copy(
                update={"by_pid": {p: c for p, c in m.by_pid.items() if p not in hidden}}
            )
            for gpu, m in nvml_device_memory(emu.env).items()
        }

    monkeypatch.setattr("timeshare.activities.backends.checkpointing.device_memory", memory)


async def test_a_process_nvml_does_not_list_is_unknown_never_zero(
    gpu_emulator: Emulator,
    tmp_path: Path,
    cuda_workers: list[CudaWorker],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    emu, table = gpu_emulator, ProcessTable()
    backend = driver_backend(emu, table)
    (rank,) = start_job(emu, tmp_path, cuda_workers, table, "a", ranks=1, nbytes=64 * MiB).ranks
    hide_from_nvml(monkeypatch, emu, [rank.pid])
    assert await backend.footprint("g", "a") is None
    (note,) = backend.notes()
    assert "co-residency off for g/a" in note and "PID namespace" in note
    # Its host reservation is all the memory in use on its GPUs, not zero.
    monkeypatch.setattr(
        "timeshare.activities.backends.checkpoint_memory.host_memory_available", lambda: 32 * MiB
    )
    with pytest.raises(BackendError, match=r"holds 0\.\d GiB .* nothing was moved"):
        await backend.checkpoint("g", "a")
    assert emu.state(rank.pid) == (0, RUNNING)


async def test_a_resident_job_of_unknown_size_is_never_kept_co_resident(
    gpu_emulator: Emulator,
    tmp_path: Path,
    cuda_workers: list[CudaWorker],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    emu, table = gpu_emulator, ProcessTable()
    backend = driver_backend(emu, table, CONFIG.model_copy(update={"co_residency_margin_bytes": 0}))
    agent = SwitchActivities("n", backend, table)
    start_job(emu, tmp_path, cuda_workers, table, "a", ranks=1, nbytes=4 * MiB)
    (other,) = start_job(emu, tmp_path, cuda_workers, table, "b", ranks=1, nbytes=4 * MiB).ranks
    hide_from_nvml(monkeypatch, emu, [other.pid])
    # a is known and fits beside b many times over; b's size is unknown: b leaves.
    switched = await ActivityEnvironment().run(agent.switch, switch_input("g", "a", 1, ["b"]))
    assert switched.co_resident == []
    assert (switched.actions[0].job, switched.actions[0].action) == ("b", "checkpoint")
    assert emu.state(other.pid) == (0, CHECKPOINTED)


def memory_cgroup_to_write() -> Hierarchy | None:
    """A memory cgroup hierarchy this test may make a child cgroup in."""
    for hierarchy in hierarchies("memory"):
        if not os.access(hierarchy.mount, os.W_OK):
            continue
        if hierarchy.version == 1:
            return hierarchy
        controls = hierarchy.mount / "cgroup.subtree_control"
        if controls.exists() and "memory" in controls.read_text().split():
            return hierarchy
    return None


async def test_a_checkpoint_respects_the_memory_limit_of_the_jobs_cgroup(
    gpu_emulator: Emulator, tmp_path: Path, cuda_workers: list[CudaWorker]
) -> None:
    """The driver copies device memory into the process's own host memory,
    charged to its container: past the container's limit its OOM killer
    would pick a victim, however much the node has available."""
    hierarchy = memory_cgroup_to_write()
    if hierarchy is None:
        pytest.skip("no writable memory cgroup here (needs root)")
    emu, table = gpu_emulator, ProcessTable()
    backend = driver_backend(emu, table)
    (rank,) = start_job(emu, tmp_path, cuda_workers, table, "a", ranks=1, nbytes=96 * MiB).ranks
    name = f"timeshare-test-{os.getpid()}"
    cgroup = hierarchy.mount / name
    limit = "memory.max" if hierarchy.version == 2 else "memory.limit_in_bytes"
    cgroup.mkdir()
    try:
        (cgroup / limit).write_text(str(48 * MiB))
        (cgroup / "cgroup.procs").write_text(str(rank.pid))
        with pytest.raises(BackendError, match=rf"memory limit of its cgroup /{name} \({limit}"):
            await backend.checkpoint("g", "a")
        assert emu.state(rank.pid) == (0, RUNNING)
    finally:
        rank.kill()
        for _ in range(100):
            with contextlib.suppress(OSError):
                cgroup.rmdir()
                break
            await asyncio.sleep(0.05)


def test_cgroup_v2_limits_are_read_up_to_the_root(tmp_path: Path) -> None:
    """The tightest of a cgroup's and its ancestors' memory.max less
    memory.current; "max" is no limit (a cgroup v2 tree laid out as files)."""
    leaf = tmp_path / "pod" / "container"
    leaf.mkdir(parents=True)
    for directory, limit, used in ((leaf, "max", 10), (leaf.parent, str(100 * MiB), 60 * MiB)):
        (directory / "memory.max").write_text(limit + "\n")
        (directory / "memory.current").write_text(f"{used}\n")
    room = cgroup_memory_room(Hierarchy(2, tmp_path, "memory"), "/pod/container")
    assert room is not None
    assert (room.bytes, room.cgroup, room.file) == (40 * MiB, "/pod", "memory.max")
    assert cgroup_memory_room(Hierarchy(2, tmp_path, "memory"), "/") is None
