"""What the CUDA checkpoint backends share: each registered process's CUDA
state moves running -> locked -> checkpointed -> locked -> running, and a
job's processes on a node move together.

Order, on each node: every process of the job is locked before any is
checkpointed, and every one restored before any is unlocked, so that no rank
runs while another's state is gone (the fix for multi-rank jobs that
cuda-checkpoint alone would hang). A lock that fails unlocks what was locked
and fails the action, leaving the job running. Across nodes the workflow
first locks the job on every node it leaves (``quiesce``) and only then
checkpoints it anywhere (see docs/user-guide.md). Every call has a timeout.
The state is read first, so every action is idempotent.

A job may also be only locked (co-residency): its memory stays on the device,
and its footprint there is read from NVML; a checkpointed job's footprint is
the one NVML showed when it was checkpointed."""

from __future__ import annotations

import abc
import asyncio
import time
from collections.abc import Awaitable
from typing import TypeVar

from timeshare.activities.backend import Backend, BackendConfig, BackendError, DeviceBytes
from timeshare.activities.gpus import DeviceMemory, device_memory, host_memory_available, node_gpus
from timeshare.activities.processes import ProcessTable
from timeshare.hooks.protocol import EvictMode
from timeshare.models import BackendAction

RUNNING, LOCKED, CHECKPOINTED = "running", "locked", "checkpointed"
ON_DEVICE = (RUNNING, LOCKED)
Result = TypeVar("Result")


class ProcessCheckpointBackend(Backend):
    def __init__(self, config: BackendConfig) -> None:
        self.node = config.node
        self.lock_timeout = config.lock_timeout_seconds
        self.call_timeout = config.call_timeout_seconds
        self.margin = config.co_residency_margin_bytes
        self.processes = ProcessTable()
        # Each checkpointed job's device bytes per GPU, as NVML saw them.
        self._parked: dict[tuple[str, str], DeviceBytes] = {}

    def attach(self, processes: ProcessTable) -> None:
        self.processes = processes

    def gpus(self) -> list[str]:
        return node_gpus()

    def co_residency(self) -> bool:
        return True

    @abc.abstractmethod
    async def state(self, pid: int) -> str:
        """running, locked, checkpointed or failed."""

    @abc.abstractmethod
    async def act(self, action: str, pid: int) -> None:
        """lock (within the lock timeout), checkpoint, restore or unlock."""

    async def within_call_timeout(self, call: Awaitable[Result], what: str) -> Result:
        try:
            return await asyncio.wait_for(call, self.call_timeout)
        except TimeoutError:
            raise BackendError(f"{what} did not finish within {self.call_timeout:g} s") from None

    async def resident_jobs(self, group: str) -> list[str]:
        """Jobs with any process whose state is on the device, including jobs
        that never had a turn."""
        resident = []
        for job in self.processes.jobs(group):
            if any(state in ON_DEVICE for state in (await self._states(group, job)).values()):
                resident.append(job)
        return resident

    async def footprint(self, group: str, job: str) -> DeviceBytes | None:
        states = await self._states(group, job)
        return footprint(device_memory(), [p for p, s in states.items() if s in ON_DEVICE])

    async def admission_footprint(self, group: str, job: str) -> DeviceBytes | None:
        states = await self._states(group, job)
        if any(state in ON_DEVICE for state in states.values()):
            return await self.footprint(group, job)
        return self._parked.get((group, job))

    async def free_memory(self, group: str) -> DeviceBytes | None:
        memory = device_memory()
        if not memory:
            return None
        return {gpu: max(0, m.free_bytes - self.margin) for gpu, m in memory.items()}

    async def lock(self, group: str, job: str) -> BackendAction:
        start = time.time()
        locked = await self._lock_all(group, job, await self._states(group, job))
        if not locked:
            return BackendAction(job=job, action="noop")
        return BackendAction(job=job, action="lock", seconds=time.time() - start, pids=locked)

    async def checkpoint(self, group: str, job: str, mode: EvictMode = "offload") -> BackendAction:
        states = await self._states(group, job)
        on_device = [pid for pid, state in states.items() if state in ON_DEVICE]
        if not on_device:
            return BackendAction(job=job, action="noop")
        start = time.time()
        parked = self._room_for(group, job, on_device)
        # Phase one: every rank locked. Phase two: every rank checkpointed.
        await self._lock_all(group, job, states)
        for pid in on_device:
            await self.act("checkpoint", pid)
        self._parked[(group, job)] = parked
        return BackendAction(
            job=job,
            action="checkpoint",
            bytes=sum(parked.values()),
            seconds=time.time() - start,
            pids=on_device,
        )

    async def restore(self, group: str, job: str) -> BackendAction:
        states = await self._states(group, job)
        start = time.time()
        to_unlock = [pid for pid, state in states.items() if state != RUNNING]
        if not to_unlock:
            return BackendAction(job=job, action="noop")
        to_restore = [pid for pid, state in states.items() if state == CHECKPOINTED]
        # Every rank restored before any is unlocked.
        for pid in to_restore:
            await self.act("restore", pid)
        for pid in to_unlock:
            await self.act("unlock", pid)
        parked = self._parked.pop((group, job), {}) if to_restore else {}
        return BackendAction(
            job=job,
            action="restore" if to_restore else "unlock",
            bytes=sum(parked.values()),
            seconds=time.time() - start,
            pids=to_unlock,
        )

    async def _lock_all(self, group: str, job: str, states: dict[int, str]) -> list[int]:
        """Lock every running process of the job; if one cannot be locked,
        unlock those that were and fail, leaving the job running."""
        locked: list[int] = []
        try:
            for pid in [p for p, state in states.items() if state == RUNNING]:
                await self.act("lock", pid)
                locked.append(pid)
        except BackendError as error:
            for pid in locked:
                await self.act("unlock", pid)
            raise BackendError(
                f"job {group}/{job} could not be locked, left running: {error}"
            ) from None
        return locked

    def _room_for(self, group: str, job: str, pids: list[int]) -> DeviceBytes:
        """The device bytes about to move to host memory, per GPU; refuse
        before locking anything if the host cannot hold them (rather than let
        the kernel's OOM killer pick a victim)."""
        moving = footprint(device_memory(), pids)
        needed = sum(moving.values())
        available = host_memory_available()
        if needed > available:
            raise BackendError(
                f"job {group}/{job} holds {needed / 2**30:.1f} GiB of device memory but the host "
                f"has {available / 2**30:.1f} GiB available; nothing was moved"
            )
        return moving

    async def _states(self, group: str, job: str) -> dict[int, str]:
        return {pid: await self.state(pid) for pid in self.processes.processes(group, job)}


def footprint(memory: dict[str, DeviceMemory], pids: list[int]) -> DeviceBytes:
    """The bytes these processes use on each GPU where they use any."""
    found = {gpu: sum(m.by_pid.get(pid, 0) for pid in pids) for gpu, m in memory.items()}
    return {gpu: count for gpu, count in found.items() if count}
