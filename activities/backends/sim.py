"""The ``sim`` backend: SIMULATED GPUs per node, for tests, demos and laptops.

It holds no real device memory. A node has ``sim_gpus`` simulated GPUs and a
simulated host memory, both shared by every group on the node, as a real
host's are: a group's jobs live on the GPUs its policy claims (all of them by
default). Each job's state has a size on each of those GPUs; a checkpoint or
restore takes size / bandwidth seconds (restores may have a bandwidth of
their own). A job's state is running, locked (on the device but stopped:
co-residency), parked in host memory, or failed (the driver's terminal
state: nothing brings it back).

The backend checks its own invariant and records every interval, so that an
overlap is caught by the device itself, not only by the scheduler that should
prevent it: only one job runs on a GPU at a time, whatever its group, and the
jobs resident on a GPU fit in its memory. Without a capacity a GPU holds one
job at a time, and admitting a job while another's state is there raises
SimOverlapError. Parked state of every group counts against the host memory.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections import Counter, defaultdict
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field

from timeshare.activities.backends.base import (
    Backend,
    BackendConfig,
    BackendError,
    JobFailed,
    Released,
)
from timeshare.hooks.protocol import EvictMode
from timeshare.models import NOT_ENOUGH_HOST_MEMORY, BackendAction, DeviceBytes

Location = Literal["running", "locked", "host", "failed"]
JobKey = tuple[str, str]  # (group, job)
GiB = 2**30


def saved_state_holds_nothing(path: Path) -> bool:
    """Whether a state file SimBackend wrote records no job: an empty list.
    A file that cannot be read or parsed is not known to hold nothing."""
    try:
        held: object = json.loads(path.read_text())
    except (OSError, ValueError):
        return False
    return held == []


def device_name(index: int) -> str:
    return f"sim-gpu-{index}"


DEVICE = device_name(0)


class SimOverlapError(BackendError):
    pass


class SimJob(BaseModel):
    location: Location
    # On the device since (running or locked), and running since.
    resident_since: float | None = None
    running_since: float | None = None
    # Bytes parked in host memory (per GPU it held), and bytes a discard
    # dropped that the job rebuilds on its next admission.
    host_bytes: int = 0
    rebuild_bytes: int = 0
    # The GPUs its state is (or was last) on.
    devices: list[int] = Field(default_factory=lambda: [0])


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
        self.restore_bandwidth = config.sim_restore_bandwidth_bytes_per_second or self.bandwidth
        self.state_bytes = config.sim_state_bytes
        # Jobs whose state is not the default size, by job name (any group).
        self.job_state_bytes = dict(config.sim_job_state_bytes)
        self.discard_fraction = config.sim_discard_fraction
        self.rebuild_rate = config.sim_rebuild_bytes_per_second
        self.gpu_count = config.sim_gpus
        self.host_bytes = config.sim_host_memory_bytes
        self.record_path = Path(config.sim_record_path) if config.sim_record_path else None
        self.state_path = Path(config.sim_state_path) if config.sim_state_path else None
        if self.state_path is not None:
            self.state_path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        self.jobs: dict[JobKey, SimJob] = {}
        # The GPUs each group's policy claims (all of them when it names none).
        self.placement: dict[str, list[int]] = {}
        self._load()
        self.events: list[dict[str, Any]] = []
        # Failures to simulate, for tests: (action, job) -> how many more
        # times, and which of them leave the job failed for good.
        self.failures: Counter[tuple[str, str]] = Counter()
        self.terminal: set[tuple[str, str]] = set()
        # One action at a time per simulated GPU: each has one link to the
        # host, which its checkpoints and restores share. Groups on other
        # GPUs of the node move their state meanwhile.
        self._links: defaultdict[int, asyncio.Lock] = defaultdict(asyncio.Lock)

    @classmethod
    def create(cls, config: BackendConfig) -> SimBackend:
        return cls(config)

    def _memory(self) -> str:
        if not self.shared:
            return "one job at a time"
        return f"{self.capacity_bytes / GiB:g} GiB"

    def describe(self) -> str:
        gpus = f"{self.gpu_count} SIMULATED GPUs" if self.gpu_count > 1 else "SIMULATED GPU"
        host = f", {self.host_bytes / GiB:g} GiB host" if self.host_bytes is not None else ""
        restores = (
            f" ({self.restore_bandwidth / 1e9:g} GB/s restoring)"
            if self.restore_bandwidth != self.bandwidth
            else ""
        )
        return (
            f"sim ({gpus}: {self._memory()}, {self.bandwidth / 1e9:g} GB/s{restores}, "
            f"{self.state_bytes / GiB:g} GiB per job{host}"
            f"{f', {len(self.job_state_bytes)} sized apart' if self.job_state_bytes else ''})"
        )

    def gpus(self) -> list[str]:
        return [f"{device_name(i)} (simulated, {self._memory()})" for i in range(self.gpu_count)]

    def co_residency(self) -> bool:
        return self.shared

    def place(self, group: str, gpus: list[int]) -> None:
        """The GPUs the group's policy claims; none named: all of them."""
        wanted = [gpu for gpu in gpus if 0 <= gpu < self.gpu_count]
        self.placement[group] = sorted(set(wanted)) or list(range(self.gpu_count))

    def _devices(self, group: str) -> list[int]:
        return self.placement.get(group) or list(range(self.gpu_count))

    async def resident_jobs(self, group: str) -> list[str]:
        return self.resident(group)

    def resident(self, group: str) -> list[str]:
        """The group's jobs on the device, running or locked."""
        return sorted(
            j
            for (g, j), s in self.jobs.items()
            if g == group and s.location in ("running", "locked")
        )

    def running(self, group: str) -> list[str]:
        return sorted(
            j for (g, j), s in self.jobs.items() if g == group and s.location == "running"
        )

    def _on(self, device: int, *locations: Location) -> list[JobKey]:
        """Every group's jobs whose state is on this GPU, in these locations."""
        return sorted(
            key for key, s in self.jobs.items() if s.location in locations and device in s.devices
        )

    def failed(self, group: str, job: str) -> bool:
        state = self.jobs.get((group, job))
        return state is not None and state.location == "failed"

    async def stopped(self, group: str, job: str) -> bool:
        state = self.jobs.get((group, job))
        return state is not None and state.location == "locked"

    async def footprint(self, group: str, job: str) -> DeviceBytes:
        state = self.jobs.get((group, job))
        if state is None or state.location not in ("running", "locked"):
            return {}
        return {device_name(d): self.bytes_of(job) for d in state.devices}

    async def admission_footprint(self, group: str, job: str) -> DeviceBytes:
        return {device_name(d): self.bytes_of(job) for d in self._devices(group)}

    async def free_memory(self, group: str) -> DeviceBytes | None:
        if not self.shared:
            return None
        return {device_name(d): self.capacity_bytes - self._used(d) for d in self._devices(group)}

    def bytes_of(self, job: str) -> int:
        return self.job_state_bytes.get(job, self.state_bytes)

    def _used(self, device: int) -> int:
        # A failed job's simulated CUDA context is gone with its state.
        return sum(self.bytes_of(job) for _, job in self._on(device, "running", "locked"))

    def inject_failure(
        self,
        action: Literal["checkpoint", "restore"],
        job: str,
        times: int,
        terminal: bool = False,
    ) -> None:
        """The next ``times`` such actions on the job fail; ``terminal``: the
        first of them leaves its state failed for good (as the driver's
        CU_PROCESS_STATE_FAILED)."""
        self.failures[(action, job)] += times
        if terminal:
            self.terminal.add((action, job))

    def _maybe_fail(self, group: str, job: str, action: str, state: SimJob | None) -> None:
        if state is not None and state.location == "failed":
            raise JobFailed(group, job, self._failed_message(group, job))
        if self.failures[(action, job)] <= 0:
            return
        self.failures[(action, job)] -= 1
        if (action, job) in self.terminal and state is not None:
            self.terminal.discard((action, job))
            self._stop_running(group, job, state, time.time())
            state.location = "failed"
            self._save()
            raise JobFailed(group, job, self._failed_message(group, job))
        raise BackendError(f"simulated {action} failure of {job!r} on node {self.node}")

    def _failed_message(self, group: str, job: str) -> str:
        return (
            f"job {group}/{job}: its simulated device state on node {self.node} is FAILED "
            "(terminal); the job is evicted and must be restarted"
        )

    @contextlib.asynccontextmanager
    async def _links_of(self, group: str) -> AsyncIterator[None]:
        """The links of the group's GPUs, taken in index order (no two
        actions can wait for each other's)."""
        async with contextlib.AsyncExitStack() as held:
            for device in sorted(self._devices(group)):
                await held.enter_async_context(self._links[device])
            yield

    async def lock(self, group: str, job: str) -> BackendAction:
        async with self._links_of(group):
            state = self.jobs.get((group, job))
            if state is not None and state.location == "failed":
                raise JobFailed(group, job, self._failed_message(group, job))
            if state is None or state.location != "running":
                return BackendAction(job=job, action="noop")
            self._stop_running(group, job, state, time.time())
            state.location = "locked"
            self._save()
            return BackendAction(job=job, action="lock")

    async def checkpoint(self, group: str, job: str, mode: EvictMode = "offload") -> BackendAction:
        async with self._links_of(group):
            state = self.jobs.get((group, job))
            if state is None or state.location == "host":
                return BackendAction(job=job, action="noop")
            self._maybe_fail(group, job, "checkpoint", state)
            size = self.bytes_of(job)
            dropped = int(size * self.discard_fraction) if mode == "discard" else 0
            moved = size - dropped
            self._check_host_room(group, job, moved * len(state.devices))
            start = time.time()
            seconds = moved * len(state.devices) / self.bandwidth
            if state.location == "running":
                self._stop_running(group, job, state, start)
                state.location = "locked"
                if seconds > 0:
                    # Stopped from the first byte: an agent that dies mid-checkpoint
                    # comes back to a job on the device that does not run. (A move
                    # that takes no time has no in-between for a crash to find.)
                    self._save()
            if seconds > 0:
                await asyncio.sleep(seconds)
            end = time.time()
            since = state.resident_since if state.resident_since is not None else start
            self.jobs[(group, job)] = SimJob(
                location="host", host_bytes=moved, rebuild_bytes=dropped, devices=state.devices
            )
            self._save()
            total = moved * len(state.devices)
            self._record(event="checkpoint", group=group, job=job, start=start, end=end,
                         bytes=total, mode=mode)  # fmt: skip
            self._record_resident(group, job, since, end, state.devices)
            return BackendAction(job=job, action="checkpoint", bytes=total, seconds=end - start)

    def _check_host_room(self, group: str, job: str, moving: int) -> None:
        """Every group's parked state shares the node's host memory."""
        if self.host_bytes is None:
            return
        parked = {
            key: s.host_bytes * len(s.devices)
            for key, s in self.jobs.items()
            if s.location == "host" and key != (group, job)
        }
        if sum(parked.values()) + moving > self.host_bytes:
            held = ", ".join(f"{g}/{j} {b / GiB:g} GiB" for (g, j), b in sorted(parked.items()))
            raise BackendError(
                f"{NOT_ENOUGH_HOST_MEMORY}: job {group}/{job} holds {moving / GiB:g} GiB of "
                f"simulated device memory but the simulated host of node {self.node} has "
                f"{(self.host_bytes - sum(parked.values())) / GiB:g} GiB left (parked: "
                f"{held or 'nothing'}); nothing was moved"
            )

    async def restore(self, group: str, job: str) -> BackendAction:
        key = (group, job)
        async with self._links_of(group):
            state = self.jobs.get(key)
            if state is not None and state.location == "running":
                return BackendAction(job=job, action="noop")
            self._maybe_fail(group, job, "restore", state)
            devices = self._devices(group) if state is None or state.location == "host" else (
                state.devices)  # fmt: skip
            self._check_admission(group, job, state, devices)
            start = time.time()
            if state is not None and state.location == "locked":
                state.location, state.running_since = "running", start
                self._save()
                self._record(event="unlock", group=group, job=job, at=start)
                return BackendAction(job=job, action="unlock")
            # A job never checkpointed has no host copy to bring back.
            moved = state.host_bytes * len(devices) if state is not None else 0
            rebuild = state.rebuild_bytes * len(devices) if state is not None else 0
            seconds = moved / self.restore_bandwidth
            if rebuild and self.rebuild_rate > 0:
                seconds += rebuild / self.rebuild_rate
            if seconds > 0:
                # From the first byte of a restore the device holds part of the
                # job: a crash mid-restore must not forget it.
                self.jobs[key] = SimJob(location="locked", resident_since=start, devices=devices)
                self._save()
                await asyncio.sleep(seconds)
            end = time.time()
            self.jobs[key] = SimJob(
                location="running", resident_since=start, running_since=end, devices=devices
            )
            self._save()
            self._record(event="restore", group=group, job=job, start=start, end=end, bytes=moved)
            return BackendAction(job=job, action="restore", bytes=moved, seconds=end - start)

    async def release(self, group: str, job: str, restore: bool = True) -> Released:
        """The job's simulated processes left with it: its state is dropped
        wherever it was, so it holds no simulated GPU or host memory."""
        async with self._links_of(group):
            state = self.jobs.pop((group, job), None)
            if state is None:
                return Released()
            now = time.time()
            self._stop_running(group, job, state, now)
            if state.location in ("locked", "failed") and state.resident_since is not None:
                self._record_resident(group, job, state.resident_since, now, state.devices)
            self._save()
            self._record(event="release", group=group, job=job, at=now, was=state.location)
            return Released(done=[f"dropped its simulated {state.location} state"])

    def _check_admission(
        self, group: str, job: str, state: SimJob | None, devices: list[int]
    ) -> None:
        """Only one job runs on a GPU, whatever its group; the resident jobs
        fit in its memory (or, without a capacity, are only this one)."""
        me = (group, job)
        for device in devices:
            where = ("running", "locked") if not self.shared else ("running",)
            others = [f"{g}/{j}" for g, j in self._on(device, *where) if (g, j) != me]
            if others:
                self._record(event="overlap", group=group, job=job, others=others,
                             at=time.time(), device=device_name(device))  # fmt: skip
                raise SimOverlapError(
                    f"simulated GPU {device_name(device)} on node {self.node}: cannot admit "
                    f"{group}/{job} while {others} {'run' if self.shared else 'still resident'}"
                )
        size = self.bytes_of(job)
        if size > self.capacity_bytes:
            raise BackendError(
                f"job {job!r} needs {size} bytes; the simulated GPU has {self.capacity_bytes}"
            )
        if state is not None and state.location == "locked":
            return
        for device in devices:
            used = self._used(device)
            if used + size > self.capacity_bytes:
                resident = [f"{g}/{j}" for g, j in self._on(device, "running", "locked")]
                self._record(event="overlap", group=group, job=job, others=resident,
                             at=time.time(), device=device_name(device))  # fmt: skip
                raise SimOverlapError(
                    f"simulated GPU {device_name(device)} on node {self.node}: {group}/{job} does "
                    f"not fit beside {resident} ({used + size} of "
                    f"{self.capacity_bytes} bytes)"
                )

    def _stop_running(self, group: str, job: str, state: SimJob, at: float) -> None:
        if state.running_since is not None:
            self._record(event="running", group=group, job=job, start=state.running_since, end=at,
                         devices=[device_name(d) for d in state.devices])  # fmt: skip
        state.running_since = None

    def _record_resident(
        self, group: str, job: str, since: float, end: float, devices: list[int]
    ) -> None:
        # No capacity recorded: a GPU that holds one job at a time.
        capacity = self.capacity_bytes if self.shared else None
        self._record(event="resident", group=group, job=job, start=since, end=end,
                     bytes=self.bytes_of(job), capacity=capacity,
                     devices=[device_name(d) for d in devices])  # fmt: skip

    def _load(self) -> None:
        if self.state_path is None or not self.state_path.exists():
            return
        for entry in json.loads(self.state_path.read_text()):
            key = (entry.pop("group"), entry.pop("job"))
            if entry.get("location") == "device":  # written before jobs could be locked
                entry["location"] = "running"
                entry["running_since"] = entry.get("resident_since")
            elif entry.get("location") == "host" and "host_bytes" not in entry:
                entry["host_bytes"] = self.bytes_of(key[1])
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
