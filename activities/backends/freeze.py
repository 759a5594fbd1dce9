"""The ``freeze`` backend: a job's processes on this node are stopped while
another job holds the GPUs, and continued when its turn comes back.

It acts only on processes registered through the agent's socket (and their
descendants). Where the job's processes, and nothing else, share a cgroup of
their own, it freezes that cgroup (v2 `cgroup.freeze`, else the v1 freezer);
otherwise it stops them with SIGSTOP and continues them with SIGCONT. It moves
no device memory. On its own it keeps a job off the GPU but leaves its memory
there; stacked with a checkpointing backend it stops the job's processes once
their device state is checkpointed (see stacked.py for why not before).

A job that left its group (released) is never frozen again here: a stopped
process cannot even act on SIGTERM, and nobody would ever continue it."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
from pathlib import Path
from typing import Any

from timeshare.activities.backends.base import (
    PROCESSES,
    Backend,
    BackendConfig,
    BackendError,
    Released,
)
from timeshare.activities.backends.cgroups import own_cgroup
from timeshare.activities.backends.gpus import node_gpus
from timeshare.activities.backends.processes import ProcessTable, stopped
from timeshare.hooks.protocol import EvictMode
from timeshare.models import BackendAction

POLL_SECONDS = 0.005


class FreezeBackend(Backend):
    name = "freeze"
    evict_order = PROCESSES

    def __init__(self, config: BackendConfig) -> None:
        self.node = config.node
        self.lock_timeout = config.lock_timeout_seconds
        self.record_path = Path(config.record_path) if config.record_path else None
        self.processes = ProcessTable()
        # Jobs frozen by lock() rather than checkpoint(): their thaw is an unlock.
        self._locked: set[tuple[str, str]] = set()

    @classmethod
    def create(cls, config: BackendConfig) -> FreezeBackend:
        return cls(config)

    def attach(self, processes: ProcessTable) -> None:
        self.processes = processes

    def describe(self) -> str:
        return "freeze (SIGSTOP/SIGCONT of each job's registered processes)"

    def gpus(self) -> list[str]:
        return node_gpus()

    def _is_frozen(self, group: str, job: str) -> bool:
        pids = self.processes.processes(group, job)
        cgroup = own_cgroup(pids)
        if cgroup is not None:
            return cgroup.frozen()
        return all(stopped(pid) for pid in pids)

    async def resident_jobs(self, group: str) -> list[str]:
        return [
            job
            for job in self.processes.jobs(group)
            if not self.processes.released(group, job) and not self._is_frozen(group, job)
        ]

    async def stopped(self, group: str, job: str) -> bool:
        return bool(self.processes.processes(group, job)) and self._is_frozen(group, job)

    async def release(self, group: str, job: str, restore: bool = True) -> Released:
        # Thawed either way: freezing holds no device state to leave parked.
        thawed = await self._thaw(group, job)
        self._locked.discard((group, job))
        done = [f"thawed {thawed.pids}"] if thawed.pids else []
        return Released(running=self.processes.processes(group, job), done=done)

    async def lock(self, group: str, job: str) -> BackendAction:
        # Freezing never moves memory: a lock is the same freeze, reported as one.
        action = await self._freeze(group, job)
        if action.action == "noop":
            return action
        self._locked.add((group, job))
        return action.model_copy(update={"action": "lock"})

    async def checkpoint(self, group: str, job: str, mode: EvictMode = "offload") -> BackendAction:
        self._locked.discard((group, job))
        return await self._freeze(group, job)

    async def _freeze(self, group: str, job: str) -> BackendAction:
        pids = self.processes.processes(group, job)
        if not pids or self.processes.released(group, job) or self._is_frozen(group, job):
            return BackendAction(job=job, action="noop")
        start = time.time()
        cgroup = own_cgroup(pids)
        if cgroup is not None:
            if not await cgroup.set_frozen(True, self.lock_timeout):
                await cgroup.set_frozen(False, self.lock_timeout)
                raise BackendError(
                    f"job {group}/{job}: cgroup {cgroup.path} did not freeze within "
                    f"{self.lock_timeout:g} s; it was left running"
                )
            self._record(event="freeze", group=group, job=job, pids=pids, cgroup=str(cgroup.path),
                         start=start, end=time.time())  # fmt: skip
            return BackendAction(
                job=job, action="checkpoint", seconds=time.time() - start, pids=pids
            )
        running = [pid for pid in pids if not stopped(pid)]
        # Stop every process before waiting on any, so no rank runs on alone.
        self._signal(running, signal.SIGSTOP)
        deadline = time.monotonic() + self.lock_timeout
        while not all(stopped(pid) for pid in running):
            if time.monotonic() > deadline:
                self._signal(running, signal.SIGCONT)
                raise BackendError(
                    f"job {group}/{job}: processes {running} did not stop within "
                    f"{self.lock_timeout:g} s; they were left running"
                )
            await asyncio.sleep(POLL_SECONDS)
        self._record(
            event="freeze", group=group, job=job, pids=running, start=start, end=time.time()
        )
        return BackendAction(
            job=job, action="checkpoint", seconds=time.time() - start, pids=running
        )

    async def restore(self, group: str, job: str) -> BackendAction:
        action = await self._thaw(group, job)
        if action.action != "noop" and (group, job) in self._locked:
            action = action.model_copy(update={"action": "unlock"})
        self._locked.discard((group, job))
        return action

    async def _thaw(self, group: str, job: str) -> BackendAction:
        pids = self.processes.processes(group, job)
        cgroup = own_cgroup(pids)
        if cgroup is not None:
            if not cgroup.frozen():
                return BackendAction(job=job, action="noop")
            start = time.time()
            await cgroup.set_frozen(False, self.lock_timeout)
            self._record(event="thaw", group=group, job=job, pids=pids, start=start,
                         end=time.time())  # fmt: skip
            return BackendAction(job=job, action="restore", seconds=time.time() - start, pids=pids)
        frozen = [pid for pid in pids if stopped(pid)]
        if not frozen:
            return BackendAction(job=job, action="noop")
        start = time.time()
        self._signal(frozen, signal.SIGCONT)
        self._record(event="thaw", group=group, job=job, pids=frozen, start=start, end=time.time())
        return BackendAction(job=job, action="restore", seconds=time.time() - start, pids=frozen)

    @staticmethod
    def _signal(pids: list[int], signum: int) -> None:
        for pid in pids:
            try:
                os.kill(pid, signum)
            except ProcessLookupError:
                continue  # exited meanwhile: nothing left to stop
            except PermissionError as error:
                raise BackendError(
                    f"not allowed to signal process {pid}: {error}; run the agent as root "
                    "or as the jobs' user"
                ) from None

    def _record(self, **event: Any) -> None:
        if self.record_path is not None:
            event["node"] = self.node
            with self.record_path.open("a") as record:
                record.write(json.dumps(event) + "\n")
