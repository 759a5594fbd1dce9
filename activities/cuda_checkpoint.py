"""The ``cuda-checkpoint`` backend: moves each registered process's device
state to host memory and back with NVIDIA's `cuda-checkpoint` utility
(`--action lock|checkpoint|restore|unlock --pid`, `--get-state`), for hosts
where the driver's checkpoint API cannot be used in process.

Order across a job's processes on the node: lock every process before
checkpointing any, and restore every process before unlocking any, so that no
rank runs while another's state is gone. A lock that fails (the driver's lock
timeout) unlocks what was locked and fails the action, leaving the job
running. Every utility run has a timeout; a hung one fails the action."""

from __future__ import annotations

import asyncio
import shutil
import time
from pathlib import Path

from activities.backend import Backend, BackendConfig, BackendError
from activities.gpus import NoGpus, gpu_inventory, node_gpus
from activities.processes import ProcessTable
from timeshare.models import BackendAction

RUNNING, LOCKED, CHECKPOINTED = "running", "locked", "checkpointed"
ON_DEVICE = (RUNNING, LOCKED)


class CudaCheckpointBackend(Backend):
    name = "cuda-checkpoint"

    def __init__(self, config: BackendConfig, utility: str) -> None:
        self.node = config.node
        self.utility = utility
        self.lock_timeout = config.lock_timeout_seconds
        self.call_timeout = config.call_timeout_seconds
        self.processes = ProcessTable()

    @classmethod
    def create(cls, config: BackendConfig) -> CudaCheckpointBackend:
        try:
            gpu_inventory()
        except NoGpus as error:
            raise BackendError(f"backend cuda-checkpoint cannot run here: {error}") from None
        utility = config.cuda_checkpoint_path or shutil.which("cuda-checkpoint")
        if not utility or not Path(utility).exists():
            raise BackendError(
                "the cuda-checkpoint utility was not found; put it on PATH or pass "
                "--cuda-checkpoint PATH (it ships with NVIDIA driver 550 and later)"
            )
        return cls(config, utility)

    def attach(self, processes: ProcessTable) -> None:
        self.processes = processes

    def describe(self) -> str:
        return f"cuda-checkpoint ({self.utility})"

    def gpus(self) -> list[str]:
        return node_gpus()

    async def resident_jobs(self, group: str) -> list[str]:
        """Jobs with any registered process whose state is on the device,
        including jobs that never had a turn."""
        resident = []
        for job in self.processes.jobs(group):
            states = await self._states(group, job)
            if any(state in ON_DEVICE for state in states.values()):
                resident.append(job)
        return resident

    async def checkpoint(self, group: str, job: str) -> BackendAction:
        states = await self._states(group, job)
        start = time.time()
        to_lock = [pid for pid, state in states.items() if state == RUNNING]
        locked: list[int] = []
        try:
            for pid in to_lock:
                await self._run("--action", "lock", "--pid", str(pid),
                                "--timeout", str(int(self.lock_timeout * 1000)))  # fmt: skip
                locked.append(pid)
        except BackendError as error:
            for pid in locked:
                await self._run("--action", "unlock", "--pid", str(pid))
            raise BackendError(
                f"job {group}/{job} could not be locked, left running: {error}"
            ) from None
        to_checkpoint = [pid for pid, state in states.items() if state in ON_DEVICE]
        if not to_checkpoint:
            return BackendAction(job=job, action="noop")
        for pid in to_checkpoint:
            await self._run("--action", "checkpoint", "--pid", str(pid))
        return BackendAction(job=job, action="checkpoint", seconds=time.time() - start)

    async def restore(self, group: str, job: str) -> BackendAction:
        states = await self._states(group, job)
        start = time.time()
        to_restore = [pid for pid, state in states.items() if state == CHECKPOINTED]
        to_unlock = [pid for pid, state in states.items() if state != RUNNING]
        if not to_unlock:
            return BackendAction(job=job, action="noop")
        for pid in to_restore:
            await self._run("--action", "restore", "--pid", str(pid))
        for pid in to_unlock:
            await self._run("--action", "unlock", "--pid", str(pid))
        return BackendAction(job=job, action="restore", seconds=time.time() - start)

    async def _states(self, group: str, job: str) -> dict[int, str]:
        """Each process's CUDA state, read before acting: every action is idempotent."""
        states = {}
        for pid in self.processes.processes(group, job):
            states[pid] = (await self._run("--get-state", "--pid", str(pid))).strip()
        return states

    async def _run(self, *args: str) -> str:
        process = await asyncio.create_subprocess_exec(
            self.utility, *args,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        try:
            out, err = await asyncio.wait_for(process.communicate(), self.call_timeout)
        except TimeoutError:
            process.kill()
            await process.wait()
            raise BackendError(
                f"cuda-checkpoint {' '.join(args)} did not finish within {self.call_timeout:g} s"
            ) from None
        if process.returncode != 0:
            raise BackendError(
                f"cuda-checkpoint {' '.join(args)} failed: {err.decode().strip() or out.decode()}"
            )
        return out.decode()
