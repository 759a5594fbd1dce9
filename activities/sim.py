"""The ``sim`` backend: a SIMULATED GPU per node, for tests, demos and laptops.

It holds no real device memory. Each group has simulated GPUs of its own on
each node (groups share a host, not GPUs). Each job's state has a size; a
checkpoint or restore takes size / bandwidth seconds. A job's state is
running, locked (on the device but stopped: co-residency) or parked in host
memory.

The backend checks its own invariant and records every interval, so that an
overlap is caught by the device itself, not only by the scheduler that should
prevent it: only one job of a group runs at a time, and the jobs resident on
the GPU fit in its memory. Without a capacity the GPU holds one job at a time,
and admitting a job while another's state is there raises SimOverlapError.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections import Counter
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel

from timeshare.activities.backend import Backend, BackendConfig, BackendError, DeviceBytes
from timeshare.hooks.protocol import EvictMode
from timeshare.models import BackendAction

Location = Literal["running", "locked", "host"]
JobKey = tuple[str, str]  # (group, job)
DEVICE = "sim-gpu-0"


class SimOverlapError(BackendError):
    pass


class SimJob(BaseModel):
    location: Location
    # On the device since (running or locked), and running since.
    resident_since: float | None = None
    running_since: float | None = None
    # Bytes parked in host memory, and bytes a discard dropped that the job
    # rebuilds on its next admission.
    host_bytes: int = 0
    rebuild_bytes: int = 0


class SimBackend(Backend):
    name = "sim"
    simulated = True

    def __init__(self, config: BackendConfig) -> None:
        self.node = config.node
        # Without a capacity, one job at a time: the invariant of a GPU with no co-residency.
        self.shared = config.sim_capacity_bytes is not None
        # Without one, room for the largest job's state (and one job at a time).
        self.capacity_bytes = config.sim_capacity_bytes or max(
            [config.sim_state_bytes, *config.sim_job_state_bytes.values()]
        )
        self.bandwidth = config.sim_bandwidth_bytes_per_second
        self.state_bytes = config.sim_state_bytes
        # Jobs whose state is not the default size, by job name (any group).
        self.job_state_bytes = dict(config.sim_job_state_bytes)
        self.discard_fraction = config.sim_discard_fraction
        self.rebuild_rate = config.sim_rebuild_bytes_per_second
        self.record_path = Path(config.sim_record_path) if config.sim_record_path else None
        self.state_path = Path(config.sim_state_path) if config.sim_state_path else None
        self.jobs: dict[JobKey, SimJob] = {}
        self._load()
        self.events: list[dict[str, Any]] = []
        # Failures to simulate, for tests: (action, job) -> how many more times.
        self.failures: Counter[tuple[str, str]] = Counter()
        # One action at a time: a simulated GPU has one copy engine here.
        self._lock = asyncio.Lock()

    @classmethod
    def create(cls, config: BackendConfig) -> SimBackend:
        return cls(config)

    def _memory(self) -> str:
        if not self.shared:
            return "one job at a time"
        return f"{self.capacity_bytes / 2**30:g} GiB"

    def describe(self) -> str:
        return (
            f"sim (SIMULATED GPU: {self._memory()}, "
            f"{self.bandwidth / 1e9:g} GB/s, {self.state_bytes / 2**30:g} GiB per job"
            f"{f', {len(self.job_state_bytes)} sized apart' if self.job_state_bytes else ''})"
        )

    def gpus(self) -> list[str]:
        return [f"{DEVICE} (simulated, {self._memory()})"]

    def co_residency(self) -> bool:
        return self.shared

    async def resident_jobs(self, group: str) -> list[str]:
        return self.resident(group)

    def resident(self, group: str) -> list[str]:
        """The group's jobs on the device, running or locked."""
        return sorted(j for (g, j), s in self.jobs.items() if g == group and s.location != "host")

    def running(self, group: str) -> list[str]:
        return sorted(
            j for (g, j), s in self.jobs.items() if g == group and s.location == "running"
        )

    async def footprint(self, group: str, job: str) -> DeviceBytes:
        return {DEVICE: self.bytes_of(job)} if job in self.resident(group) else {}

    async def admission_footprint(self, group: str, job: str) -> DeviceBytes:
        return {DEVICE: self.bytes_of(job)}

    async def free_memory(self, group: str) -> DeviceBytes | None:
        if not self.shared:
            return None
        return {DEVICE: self.capacity_bytes - self._used(group)}

    def bytes_of(self, job: str) -> int:
        return self.job_state_bytes.get(job, self.state_bytes)

    def _used(self, group: str) -> int:
        return sum(self.bytes_of(job) for job in self.resident(group))

    def inject_failure(
        self, action: Literal["checkpoint", "restore"], job: str, times: int
    ) -> None:
        self.failures[(action, job)] += times

    def _maybe_fail(self, action: str, job: str) -> None:
        if self.failures[(action, job)] > 0:
            self.failures[(action, job)] -= 1
            raise BackendError(f"simulated {action} failure of {job!r} on node {self.node}")

    async def lock(self, group: str, job: str) -> BackendAction:
        async with self._lock:
            state = self.jobs.get((group, job))
            if state is None or state.location != "running":
                return BackendAction(job=job, action="noop")
            self._stop_running(group, job, state, time.time())
            state.location = "locked"
            self._save()
            return BackendAction(job=job, action="lock")

    async def checkpoint(self, group: str, job: str, mode: EvictMode = "offload") -> BackendAction:
        async with self._lock:
            state = self.jobs.get((group, job))
            if state is None or state.location == "host":
                return BackendAction(job=job, action="noop")
            self._maybe_fail("checkpoint", job)
            start = time.time()
            if state.location == "running":
                self._stop_running(group, job, state, start)
                # Stopped from the first byte: an agent that dies mid-checkpoint
                # comes back to a job on the device that does not run.
                state.location = "locked"
                self._save()
            size = self.bytes_of(job)
            dropped = int(size * self.discard_fraction) if mode == "discard" else 0
            moved = size - dropped
            await asyncio.sleep(moved / self.bandwidth)
            end = time.time()
            since = state.resident_since if state.resident_since is not None else start
            self.jobs[(group, job)] = SimJob(
                location="host", host_bytes=moved, rebuild_bytes=dropped
            )
            self._save()
            self._record(event="checkpoint", group=group, job=job, start=start, end=end,
                         bytes=moved, mode=mode)  # fmt: skip
            # No capacity recorded: a GPU that holds one job at a time.
            capacity = self.capacity_bytes if self.shared else None
            self._record(event="resident", group=group, job=job, start=since, end=end,
                         bytes=size, capacity=capacity)  # fmt: skip
            return BackendAction(job=job, action="checkpoint", bytes=moved, seconds=end - start)

    async def restore(self, group: str, job: str) -> BackendAction:
        key = (group, job)
        async with self._lock:
            state = self.jobs.get(key)
            if state is not None and state.location == "running":
                return BackendAction(job=job, action="noop")
            self._maybe_fail("restore", job)
            self._check_admission(group, job, state)
            start = time.time()
            if state is not None and state.location == "locked":
                state.location, state.running_since = "running", start
                self._save()
                self._record(event="unlock", group=group, job=job, at=start)
                return BackendAction(job=job, action="unlock")
            # A job never checkpointed has no host copy to bring back.
            moved = state.host_bytes if state is not None else 0
            rebuild = state.rebuild_bytes if state is not None else 0
            # From the first byte of a restore the device holds part of the
            # job: a crash mid-restore must not forget it.
            self.jobs[key] = SimJob(location="locked", resident_since=start)
            self._save()
            seconds = moved / self.bandwidth
            if rebuild and self.rebuild_rate > 0:
                seconds += rebuild / self.rebuild_rate
            await asyncio.sleep(seconds)
            end = time.time()
            self.jobs[key] = SimJob(location="running", resident_since=start, running_since=end)
            self._save()
            self._record(event="restore", group=group, job=job, start=start, end=end, bytes=moved)
            return BackendAction(job=job, action="restore", bytes=moved, seconds=end - start)

    def _check_admission(self, group: str, job: str, state: SimJob | None) -> None:
        """Only one job of a group runs; the resident jobs fit in memory (or,
        without a capacity, are only this one)."""
        others = self.resident(group) if not self.shared else self.running(group)
        others = [f"{group}/{j}" for j in others if j != job]
        if others:
            self._record(event="overlap", group=group, job=job, others=others, at=time.time())
            raise SimOverlapError(
                f"simulated GPU on node {self.node}: cannot admit {group}/{job} while "
                f"{others} {'run' if self.shared else 'still resident'}"
            )
        size = self.bytes_of(job)
        if size > self.capacity_bytes:
            raise BackendError(
                f"job {job!r} needs {size} bytes; the simulated GPU has {self.capacity_bytes}"
            )
        if state is not None and state.location == "locked":
            return
        used = self._used(group)
        if used + size > self.capacity_bytes:
            resident = [f"{group}/{j}" for j in self.resident(group)]
            self._record(event="overlap", group=group, job=job, others=resident, at=time.time())
            raise SimOverlapError(
                f"simulated GPU on node {self.node}: {group}/{job} does not fit beside "
                f"{resident} ({used + size} of {self.capacity_bytes} bytes)"
            )

    def _stop_running(self, group: str, job: str, state: SimJob, at: float) -> None:
        if state.running_since is not None:
            self._record(event="running", group=group, job=job, start=state.running_since, end=at)
        state.running_since = None

    def _load(self) -> None:
        if self.state_path is None or not self.state_path.exists():
            return
        for entry in json.loads(self.state_path.read_text()):
            key = (entry.pop("group"), entry.pop("job"))
            if entry.get("location") == "device":  # written before jobs could be locked
                entry["location"] = "running"
                entry["running_since"] = entry.get("resident_since")
            elif entry.get("location") == "host" and "host_bytes" not in entry:
                entry["host_bytes"] = self.state_bytes
            self.jobs[key] = SimJob.model_validate(entry)

    def _save(self) -> None:
        if self.state_path is None:
            return
        saved = [{"group": g, "job": j, **s.model_dump()} for (g, j), s in self.jobs.items()]
        partial = self.state_path.with_suffix(".tmp")
        partial.write_text(json.dumps(saved))
        partial.replace(self.state_path)

    def _record(self, **event: Any) -> None:
        event["node"] = self.node
        self.events.append(event)
        if self.record_path is not None:
            with self.record_path.open("a") as record:
                record.write(json.dumps(event) + "\n")
