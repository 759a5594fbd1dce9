"""The ``sim`` backend: a SIMULATED GPU per node, for tests, demos and laptops.

It holds no real device memory. Each group has simulated GPUs of its own on
each node (groups share a host, not GPUs). Each job's state has a size; a
checkpoint or restore takes size / bandwidth seconds. Every residency interval is recorded,
and admitting a job while another job's state is on the simulated GPU raises
SimOverlapError: the invariant "never two jobs' state on one GPU" is checked
by the backend itself, not only by the scheduler that should uphold it.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections import Counter
from pathlib import Path
from typing import Any, Literal

from activities.backend import Backend, BackendConfig, BackendError
from timeshare.models import BackendAction

Location = Literal["device", "host"]
JobKey = tuple[str, str]  # (group, job)


class SimOverlapError(BackendError):
    pass


class SimBackend(Backend):
    name = "sim"
    simulated = True

    def __init__(self, config: BackendConfig) -> None:
        self.node = config.node
        self.capacity_bytes = config.sim_capacity_bytes
        self.bandwidth = config.sim_bandwidth_bytes_per_second
        self.state_bytes = config.sim_state_bytes
        self.record_path = Path(config.sim_record_path) if config.sim_record_path else None
        self.state_path = Path(config.sim_state_path) if config.sim_state_path else None
        self.location: dict[JobKey, Location] = {}
        self.resident_since: dict[JobKey, float] = {}
        self._load()
        self.events: list[dict[str, Any]] = []
        # Failures to simulate, for tests: (action, job) -> how many more times.
        self.failures: Counter[tuple[str, str]] = Counter()
        # One action at a time: a simulated GPU has one copy engine here.
        self._lock = asyncio.Lock()

    @classmethod
    def create(cls, config: BackendConfig) -> SimBackend:
        return cls(config)

    def describe(self) -> str:
        return (
            f"sim (SIMULATED GPU: {self.capacity_bytes / 2**30:.0f} GiB, "
            f"{self.bandwidth / 1e9:g} GB/s, {self.state_bytes / 2**30:g} GiB per job)"
        )

    def gpus(self) -> list[str]:
        return [f"sim-gpu-0 (simulated, {self.capacity_bytes / 2**30:.0f} GiB)"]

    async def resident_jobs(self, group: str) -> list[str]:
        return self.resident(group)

    def resident(self, group: str) -> list[str]:
        return sorted(
            j for (g, j), where in self.location.items() if where == "device" and g == group
        )

    def inject_failure(
        self, action: Literal["checkpoint", "restore"], job: str, times: int
    ) -> None:
        self.failures[(action, job)] += times

    def _maybe_fail(self, action: str, job: str) -> None:
        if self.failures[(action, job)] > 0:
            self.failures[(action, job)] -= 1
            raise BackendError(f"simulated {action} failure of {job!r} on node {self.node}")

    async def checkpoint(self, group: str, job: str) -> BackendAction:
        key = (group, job)
        async with self._lock:
            if self.location.get(key) != "device":
                return BackendAction(job=job, action="noop")
            self._maybe_fail("checkpoint", job)
            start = time.time()
            await asyncio.sleep(self.state_bytes / self.bandwidth)
            end = time.time()
            self.location[key] = "host"
            since = self.resident_since.pop(key)
            self._save()
            self._record(event="checkpoint", group=group, job=job, start=start, end=end,
                         bytes=self.state_bytes)  # fmt: skip
            self._record(event="resident", group=group, job=job, start=since, end=end)
            return BackendAction(
                job=job, action="checkpoint", bytes=self.state_bytes, seconds=end - start
            )

    async def restore(self, group: str, job: str) -> BackendAction:
        key = (group, job)
        async with self._lock:
            if self.location.get(key) == "device":
                return BackendAction(job=job, action="noop")
            self._maybe_fail("restore", job)
            # Each group has GPUs of its own on a node: only its own jobs conflict.
            others = [
                f"{g}/{j}" for (g, j), w in self.location.items() if w == "device" and g == group
            ]
            if others:
                self._record(event="overlap", group=group, job=job, others=others, at=time.time())
                raise SimOverlapError(
                    f"simulated GPU on node {self.node}: cannot admit {group}/{job} while "
                    f"{others} still resident"
                )
            if self.state_bytes > self.capacity_bytes:
                raise BackendError(
                    f"job {job!r} needs {self.state_bytes} bytes; the simulated GPU has "
                    f"{self.capacity_bytes}"
                )
            # A job never checkpointed has no host copy to bring back.
            moved = self.state_bytes if self.location.get(key) == "host" else 0
            start = time.time()
            self.resident_since[key] = start
            self._save_admitting(key)
            await asyncio.sleep(moved / self.bandwidth)
            end = time.time()
            self.location[key] = "device"
            self._save()
            self._record(event="restore", group=group, job=job, start=start, end=end, bytes=moved)
            return BackendAction(job=job, action="restore", bytes=moved, seconds=end - start)

    def _load(self) -> None:
        if self.state_path is None or not self.state_path.exists():
            return
        saved = json.loads(self.state_path.read_text())
        for entry in saved:
            key = (entry["group"], entry["job"])
            self.location[key] = entry["location"]
            if entry.get("resident_since") is not None:
                self.resident_since[key] = entry["resident_since"]

    def _save_admitting(self, key: JobKey) -> None:
        # From the first byte of a restore the device holds part of the job:
        # a crash mid-restore must not forget it.
        self.location[key] = "device"
        self._save()

    def _save(self) -> None:
        if self.state_path is None:
            return
        saved = [
            {
                "group": g,
                "job": j,
                "location": where,
                "resident_since": self.resident_since.get((g, j)),
            }
            for (g, j), where in self.location.items()
        ]
        partial = self.state_path.with_suffix(".tmp")
        partial.write_text(json.dumps(saved))
        partial.replace(self.state_path)

    def _record(self, **event: Any) -> None:
        event["node"] = self.node
        self.events.append(event)
        if self.record_path is not None:
            with self.record_path.open("a") as record:
                record.write(json.dumps(event) + "\n")
