"""Memory a CUDA checkpoint or restore needs, measured and held before
anything moves: host memory for a checkpoint, device memory for a restore.

- A job's footprint is what NVML shows its processes using, per GPU. A
  process NVML cannot tell (MIG, no per-process accounting: usedGpuMemory
  unavailable) or does not list at all (an agent in another PID namespace sees
  other pids; a process NVML has not caught up with) is unknown, never zero.
  Where unknown, the bound is all the memory in use on the GPUs it may use.
- Host memory for a checkpoint is held against every checkpoint under way on
  the node, whatever its group, and checked against the node's MemAvailable
  and against the memory limit of every cgroup of the job's processes (the
  driver copies device memory into the process's own host memory, charged to
  its container).
- Device memory for a restore is held against every restore under way on the
  node and checked against what NVML shows free: a restore the driver fails
  for lack of device memory cannot be retried on driver 580
  (NVIDIA/cuda-checkpoint#44: later restores fail with
  CUDA_ERROR_OPERATING_SYSTEM, the process can only be killed), so it is
  never left to the driver to find out. No margin is added: NVML's per-process
  figure includes the process's context (docs/facts.md: 2566 MiB shown for a
  process holding 2 GiB, the same before its checkpoint and after its restore).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from timeshare.activities.backends.base import BackendError, HostLedger, NoDeviceRoom
from timeshare.activities.backends.cgroups import memory_room
from timeshare.activities.backends.gpus import DeviceMemory, host_memory_available
from timeshare.models import DeviceBytes
from timeshare.node.commands import Refuse
from timeshare.node.core import NodeCore
from timeshare.node.events import HostAsked, HostDone
from timeshare.node.state import NodeState

GiB = 2**30
JobKey = tuple[str, str]


def footprint(memory: dict[str, DeviceMemory], pids: list[int]) -> DeviceBytes | None:
    """The bytes these processes use on each GPU where they use any; None
    if NVML cannot tell for any of them, or lists one of them nowhere."""
    if any(all(pid not in m.by_pid for m in memory.values()) for pid in pids):
        return None
    found: DeviceBytes = {}
    for gpu, m in memory.items():
        counts = [m.by_pid[pid] for pid in pids if pid in m.by_pid]
        if any(count is None for count in counts):
            return None
        total = sum(count for count in counts if count is not None)
        if total:
            found[gpu] = total
    return found


def upper_bounds(memory: dict[str, DeviceMemory], pids: list[int]) -> DeviceBytes:
    """All the memory used on each GPU where any of these processes appears;
    on every GPU if one of them appears nowhere."""
    anywhere = any(all(pid not in m.by_pid for m in memory.values()) for pid in pids)
    return {
        gpu: m.used_bytes
        for gpu, m in memory.items()
        if anywhere or any(pid in m.by_pid for pid in pids)
    }


def rank_bytes(memory: dict[str, DeviceMemory], pid: int) -> int | None:
    found = footprint(memory, [pid])
    return None if found is None else sum(found.values())


def unrestorable_message(group: str, job: str, pids: list[int], node: str) -> str:
    return (
        f"job {group}/{job}: the restore of processes {pids} on node {node} ran out of device "
        "memory; on driver 580 a process whose restore failed so can never be restored "
        "(NVIDIA/cuda-checkpoint#44: every later restore fails with "
        "CUDA_ERROR_OPERATING_SYSTEM); the job is evicted and must be restarted: kill those "
        "processes to free their host memory"
    )


def _gib(count: int) -> str:
    return f"{count / GiB:.1f} GiB"


class OwnLedger:
    """The ledger of a backend no agent handed one (a backend used on its
    own): a node's core of its own decides, as an agent's would."""

    def __init__(self, node: str) -> None:
        self._core = NodeCore(NodeState(node=node))

    def hold(self, asked: HostAsked) -> None:
        for command in self._core.handle(asked):
            if isinstance(command, Refuse):
                raise BackendError(command.message)

    def free(self, group: str, job: str) -> None:
        self._core.handle(HostDone(group, job))


class MemoryHeld:
    """Host bytes held for checkpoints (in the node's ledger: its core's
    record) and device bytes for restores under way on one node, per job,
    whatever its group."""

    def __init__(self, node: str) -> None:
        self.node = node
        self.ledger: HostLedger = OwnLedger(node)
        self._device: dict[JobKey, DeviceBytes] = {}

    @contextlib.contextmanager
    def host_for(self, key: JobKey, needed: int, pids: list[int], parked: str) -> Iterator[None]:
        """Hold ``needed`` host bytes for the job's checkpoint, read against
        the node's MemAvailable and the memory limit of every cgroup of the
        job's processes (the driver copies device memory into the process's
        own host memory, charged to its container); the ledger refuses
        (BackendError) before anything is locked where they cannot take it."""
        group, job = key
        limit = memory_room(pids)
        described = (
            f"{limit.cgroup} ({limit.file} {_gib(limit.limit)}, {_gib(limit.used)} in use)"
            if limit is not None
            else ""
        )
        self.ledger.hold(
            HostAsked(
                group, job, needed, host_memory_available(),
                room=limit.bytes if limit is not None else None, limit=described, parked=parked,
            )
        )  # fmt: skip
        try:
            yield
        finally:
            self.ledger.free(group, job)

    @contextlib.contextmanager
    def device_for(
        self, key: JobKey, need: DeviceBytes, memory: dict[str, DeviceMemory], known: bool
    ) -> Iterator[None]:
        """Hold the device bytes the job's restore needs on each GPU; refuse
        (NoDeviceRoom) before the driver is asked if any GPU lacks them."""
        group, job = key
        short = []
        for gpu, count in sorted(need.items()):
            held = sum(r.get(gpu, 0) for other, r in self._device.items() if other != key)
            free = memory[gpu].free_bytes if gpu in memory else 0
            if count > free - held:
                users = sorted(
                    ((c or 0, p) for p, c in (memory[gpu].by_pid if gpu in memory else {}).items()),
                    reverse=True,
                )[:5]
                short.append(
                    f"{gpu}: needs {_gib(count)}, {_gib(free)} free"
                    + (f" ({_gib(held)} of it held by restores under way)" if held else "")
                    + (f"; in use by processes {', '.join(f'{p} ({_gib(c)})' for c, p in users)}"
                       if users else "")
                )  # fmt: skip
        if short:
            size = "" if known else " (NVML could not tell its size: all that was in use)"
            raise NoDeviceRoom(
                group,
                job,
                f"job {group}/{job} cannot come back on node {self.node}: no room on the "
                f"device{size}: {'; '.join(short)}. Nothing was restored; it stays parked and "
                "can be restored once that room is free (a restore the driver fails for lack "
                "of memory could never be retried on driver 580: "
                "NVIDIA/cuda-checkpoint#44)",
            )
        self._device[key] = need
        try:
            yield
        finally:
            self._device.pop(key, None)
