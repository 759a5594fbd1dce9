"""What the CUDA checkpoint backends share: each registered process's CUDA
state moves running -> locked -> checkpointed -> locked -> running, and a
job's processes on a node move together.

Order: lock every process before checkpointing any, and restore every process
before unlocking any, so that no rank runs while another's state is gone (the
fix for multi-rank jobs that cuda-checkpoint alone would hang). A lock that
fails unlocks what was locked and fails the action, leaving the job running.
Every call has a timeout. The state is read first, so every action is
idempotent."""

from __future__ import annotations

import abc
import asyncio
import time
from collections.abc import Awaitable
from typing import TypeVar

from activities.backend import Backend, BackendConfig, BackendError
from activities.gpus import device_memory_by_pid, host_memory_available, node_gpus
from activities.processes import ProcessTable
from timeshare.models import BackendAction

RUNNING, LOCKED, CHECKPOINTED = "running", "locked", "checkpointed"
ON_DEVICE = (RUNNING, LOCKED)
Result = TypeVar("Result")


class ProcessCheckpointBackend(Backend):
    def __init__(self, config: BackendConfig) -> None:
        self.node = config.node
        self.lock_timeout = config.lock_timeout_seconds
        self.call_timeout = config.call_timeout_seconds
        self.processes = ProcessTable()

    def attach(self, processes: ProcessTable) -> None:
        self.processes = processes

    def gpus(self) -> list[str]:
        return node_gpus()

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

    async def checkpoint(self, group: str, job: str) -> BackendAction:
        states = await self._states(group, job)
        start = time.time()
        moving = [pid for pid, state in states.items() if state in ON_DEVICE]
        device_bytes = self._room_for(group, job, moving)
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
        to_checkpoint = [pid for pid, state in states.items() if state in ON_DEVICE]
        if not to_checkpoint:
            return BackendAction(job=job, action="noop")
        for pid in to_checkpoint:
            await self.act("checkpoint", pid)
        return BackendAction(
            job=job,
            action="checkpoint",
            bytes=device_bytes,
            seconds=time.time() - start,
            pids=to_checkpoint,
        )

    async def restore(self, group: str, job: str) -> BackendAction:
        states = await self._states(group, job)
        start = time.time()
        to_unlock = [pid for pid, state in states.items() if state != RUNNING]
        if not to_unlock:
            return BackendAction(job=job, action="noop")
        for pid in [p for p, state in states.items() if state == CHECKPOINTED]:
            await self.act("restore", pid)
        for pid in to_unlock:
            await self.act("unlock", pid)
        return BackendAction(job=job, action="restore", seconds=time.time() - start, pids=to_unlock)

    def _room_for(self, group: str, job: str, pids: list[int]) -> int:
        """The device bytes about to move to host memory; refuse before locking
        anything if the host cannot hold them (rather than let the kernel's
        OOM killer pick a victim)."""
        used = device_memory_by_pid()
        needed = sum(used.get(pid, 0) for pid in pids)
        available = host_memory_available()
        if needed > available:
            raise BackendError(
                f"job {group}/{job} holds {needed / 2**30:.1f} GiB of device memory but the host "
                f"has {available / 2**30:.1f} GiB available; nothing was moved"
            )
        return needed

    async def _states(self, group: str, job: str) -> dict[int, str]:
        return {pid: await self.state(pid) for pid in self.processes.processes(group, job)}
