"""What the CUDA checkpoint backends share: each CUDA process's state moves
running -> locked -> checkpointed -> locked -> running, and a job's CUDA
processes on a node move together.

Sources (cited where each rule comes from):
 [API]    CUDA Driver API, "CUDA Checkpointing" (cuCheckpointProcess*), and the
          CUprocessState reference of cuda-bindings 13.x.
 [README] NVIDIA/cuda-checkpoint README.md.
 [CRIU]   checkpoint-restore/criu plugins/cuda/cuda_plugin.c.

Rules:
- Only processes that hold a CUDA context are acted on: a job's registered
  processes and their descendants are each asked for their restore thread
  first ([CRIU] get_cuda_restore_tid: a failure there means "no need to
  checkpoint devices on pid"). DataLoader workers, compile workers and
  launcher shells are left alone here; a freeze layer stacked with this one
  stops them.
- On each node every CUDA process of the job is locked before any is
  checkpointed, and every one restored before any is unlocked, so that no rank
  runs while another's state is gone. Within each phase the ranks move in
  parallel: each rank has its own GPU and link. [API] states no rule against
  calls on different pids at once; the research behind that (and its one
  exception, NCCL communicators and `--launch-job` peers) is in
  tests/emulator/libcuda.c's header.
- CHECKPOINTING and RESTORING ([API] CUprocessState, CUDA 13) are in progress:
  they are waited for. FAILED is terminal: such a job is never unlocked or
  retried as if it were fine (JobFailed), the scheduler evicts it.
- No call is given up on while it may still change a process's state: a lock
  is bounded by the driver's own timeoutMs ([API] CUcheckpointLockArgs); a call
  still running after the call timeout leaves the job's state unknown
  (StateUnknown), and the next action on that process first waits for the call
  to end and reads the state again.
- A checkpoint that leaves any CUDA process of the job on the device fails.
- Host memory for a checkpoint is reserved before anything is locked, against
  every checkpoint under way on the node, whatever its group.
- A job's footprint is read from NVML while it is on the device and is the
  one NVML showed at its checkpoint while parked. Memory NVML cannot tell
  (MIG, no accounting) is unknown, never zero: such a job is never kept
  co-resident, and its host reservation is the whole of its GPUs' used memory.
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
import enum
import json
import time
from collections.abc import Awaitable, Iterator
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

from timeshare.activities.backend import (
    Backend,
    BackendConfig,
    BackendError,
    DeviceBytes,
    JobFailed,
    Released,
    StateUnknown,
)
from timeshare.activities.gpus import DeviceMemory, device_memory, host_memory_available, node_gpus
from timeshare.activities.processes import ProcessTable, alive
from timeshare.activities.residency import fits
from timeshare.hooks.protocol import EvictMode
from timeshare.models import ActionName, BackendAction, RankAction

Result = TypeVar("Result")
JobKey = tuple[str, str]
GiB = 2**30
STATE_POLL_SECONDS = 0.02


class CudaState(enum.StrEnum):
    RUNNING = "running"
    LOCKED = "locked"
    CHECKPOINTED = "checkpointed"
    FAILED = "failed"
    CHECKPOINTING = "checkpointing"
    RESTORING = "restoring"
    # An in-progress state the installed cuda-bindings cannot name: 12.x
    # knows only 0-3 and raises ValueError on CUDA 13's 4 and 5.
    BUSY = "busy"


ON_DEVICE = (CudaState.RUNNING, CudaState.LOCKED)
IN_PROGRESS = (CudaState.CHECKPOINTING, CudaState.RESTORING, CudaState.BUSY)


class NotCuda(Exception):
    """The process holds no CUDA context (never had one, or has exited)."""


class ProcessCheckpointBackend(Backend):
    def __init__(self, config: BackendConfig) -> None:
        self.node = config.node
        self.lock_timeout = config.lock_timeout_seconds
        self.call_timeout = config.call_timeout_seconds
        self.margin = config.co_residency_margin_bytes
        self.record_path = Path(config.record_path) if config.record_path else None
        self.processes = ProcessTable()
        # Each checkpointed job's device bytes per GPU, as NVML saw them
        # (None: NVML could not tell).
        self._parked: dict[JobKey, DeviceBytes | None] = {}
        # Host bytes held for checkpoints under way, per job, any group.
        self._reserved: dict[JobKey, int] = {}
        # The call that may still change each process's state, while it runs.
        self._in_flight: dict[int, asyncio.Future[Any]] = {}
        # Jobs whose device memory NVML cannot tell, and why.
        self._unknown_memory: dict[JobKey, str] = {}
        # Jobs a process of which was seen FAILED: terminal for the job, even
        # once that process has exited, until the job is released.
        self._failed: dict[JobKey, set[int]] = {}
        # When each process's latest call began (wall clock), for the record.
        self._call_began: dict[int, float] = {}

    def attach(self, processes: ProcessTable) -> None:
        self.processes = processes

    def gpus(self) -> list[str]:
        return node_gpus()

    def co_residency(self) -> bool:
        return True

    # -- what a backend provides: each runs until the call ends ----------------

    @abc.abstractmethod
    async def restore_thread(self, pid: int) -> int | None:
        """The process's CUDA restore thread id; None if it holds no CUDA
        context (the answer the driver gives for any other process)."""

    @abc.abstractmethod
    async def read_state(self, pid: int) -> CudaState:
        """The process's checkpoint state; NotCuda if it holds no CUDA context."""

    @abc.abstractmethod
    async def act(self, action: str, pid: int) -> None:
        """lock (bounded by the lock timeout), checkpoint, restore or unlock;
        BackendError with the driver's words if it fails."""

    # -- bounded calls -----------------------------------------------------------

    async def _bounded(self, call: Awaitable[Result], what: str, pid: int, changes: bool) -> Result:
        """Wait for the call for at most the call timeout, never cancelling it:
        a call that changes state and runs on is remembered, and the next
        change of that process waits for it first."""
        if changes:
            await self._previous_call_ended(pid)
        task = asyncio.ensure_future(call)
        if changes:
            self._in_flight[pid] = task
        task.add_done_callback(partial(self._call_ended, pid))
        done, _ = await asyncio.wait({task}, timeout=self.call_timeout)
        if not done:
            raise StateUnknown(
                f"{what} has not returned after {self.call_timeout:g} s (--call-timeout); "
                f"the state of process {pid} is unknown until it does"
            )
        return task.result()

    def _call_ended(self, pid: int, task: asyncio.Future[Any]) -> None:
        if self._in_flight.get(pid) is task:
            del self._in_flight[pid]
        if not task.cancelled():
            task.exception()  # retrieved: a late failure is read again from the state

    async def _previous_call_ended(self, pid: int) -> None:
        earlier = self._in_flight.get(pid)
        if earlier is None or earlier.done():
            return
        done, _ = await asyncio.wait({earlier}, timeout=self.call_timeout)
        if not done:
            raise StateUnknown(
                f"an earlier call on process {pid} is still running after a further "
                f"{self.call_timeout:g} s; its state is unknown"
            )

    async def _settled_state(self, pid: int) -> CudaState:
        """The process's state once no call or operation on it is under way."""
        await self._previous_call_ended(pid)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.call_timeout
        while True:
            state = await self._bounded(
                self.read_state(pid), f"reading the state of process {pid}", pid, False
            )
            if state not in IN_PROGRESS:
                return state
            if loop.time() > deadline:
                raise StateUnknown(
                    f"process {pid} has been {state} for {self.call_timeout:g} s; "
                    "its state is unknown until that ends"
                )
            await asyncio.sleep(STATE_POLL_SECONDS)

    async def _is_cuda(self, pid: int) -> bool:
        tid = await self._bounded(
            self.restore_thread(pid), f"asking process {pid} for its restore thread", pid, False
        )
        return tid is not None

    # -- the job's CUDA processes ------------------------------------------------

    async def cuda_processes(self, group: str, job: str) -> list[int]:
        """The job's processes here that hold a CUDA context."""
        pids = self.processes.processes(group, job)
        found = await asyncio.gather(*(self._is_cuda(pid) for pid in pids))
        return [pid for pid, cuda in zip(pids, found, strict=True) if cuda]

    async def states(
        self, group: str, job: str, allow_failed: bool = False
    ) -> dict[int, CudaState]:
        """Each CUDA process's settled state (processes that exit meanwhile are
        left out). JobFailed if any is FAILED, unless ``allow_failed``."""
        pids = await self.cuda_processes(group, job)
        found = await asyncio.gather(
            *(self._settled_state(pid) for pid in pids), return_exceptions=True
        )
        states: dict[int, CudaState] = {}
        for pid, state in zip(pids, found, strict=True):
            if isinstance(state, NotCuda):
                continue  # exited since it was found
            if isinstance(state, BaseException):
                raise state
            states[pid] = state
        failed = {pid for pid, state in states.items() if state == CudaState.FAILED}
        if failed:
            self._failed.setdefault((group, job), set()).update(failed)
        if (group, job) in self._failed and not allow_failed:
            pids = sorted(self._failed[(group, job)])
            raise JobFailed(group, job, _failed_message(group, job, pids, self.node))
        return states

    def failed(self, group: str, job: str) -> bool:
        return (group, job) in self._failed

    async def resident_jobs(self, group: str) -> list[str]:
        """Jobs with any CUDA process whose state is on the device, including
        jobs that never had a turn; a job with a FAILED process is the
        scheduler's to evict, never counted."""
        resident = []
        for job in self.processes.jobs(group):
            states = (await self.states(group, job, allow_failed=True)).values()
            if not self.failed(group, job) and any(s in ON_DEVICE for s in states):
                resident.append(job)
        return resident

    async def stopped(self, group: str, job: str) -> bool:
        states = await self.states(group, job, allow_failed=True)
        return CudaState.LOCKED in states.values()

    async def on_device(self, group: str, job: str) -> bool:
        states = await self.states(group, job, allow_failed=True)
        return any(state in ON_DEVICE for state in states.values())

    # -- memory --------------------------------------------------------------------

    async def footprint(self, group: str, job: str) -> DeviceBytes | None:
        states = await self.states(group, job, allow_failed=True)
        on_device = [pid for pid, state in states.items() if state in ON_DEVICE]
        return self._noted_footprint(group, job, device_memory(), on_device)

    async def admission_footprint(self, group: str, job: str) -> DeviceBytes | None:
        states = await self.states(group, job, allow_failed=True)
        if any(state in ON_DEVICE for state in states.values()):
            return await self.footprint(group, job)
        return self._parked.get((group, job))

    async def free_memory(self, group: str) -> DeviceBytes | None:
        memory = device_memory()
        if not memory:
            return None
        return {gpu: max(0, m.free_bytes - self.margin) for gpu, m in memory.items()}

    def _noted_footprint(
        self, group: str, job: str, memory: dict[str, DeviceMemory], pids: list[int]
    ) -> DeviceBytes | None:
        found = footprint(memory, pids)
        if found is None:
            self._unknown_memory[(group, job)] = (
                f"co-residency off for {group}/{job} on node {self.node}: NVML cannot tell "
                "its processes' device memory (MIG, or no per-process accounting); it is "
                "moved, never packed"
            )
        else:
            self._unknown_memory.pop((group, job), None)
        return found

    def notes(self) -> list[str]:
        for key in [k for k in self._unknown_memory if not self.processes.processes(*k)]:
            del self._unknown_memory[key]
        return [self._unknown_memory[key] for key in sorted(self._unknown_memory)]

    @contextlib.contextmanager
    def _host_memory_for(
        self, group: str, job: str, memory: dict[str, DeviceMemory], pids: list[int]
    ) -> Iterator[DeviceBytes | None]:
        """Hold host memory for the device bytes about to move (per GPU),
        against every checkpoint under way on this node; refuse before
        locking anything if the host cannot hold them, rather than let the
        kernel's OOM killer pick a victim."""
        moving = self._noted_footprint(group, job, memory, pids)
        # Unknown per process: as much as is used on the GPUs it holds.
        needed = sum(moving.values()) if moving is not None else upper_bound(memory, pids)
        key = (group, job)
        elsewhere = sum(count for other, count in self._reserved.items() if other != key)
        available = host_memory_available() - elsewhere
        if needed > available:
            parked = ", ".join(
                f"{g}/{j} {sum((b or {}).values()) / GiB:.1f} GiB"
                for (g, j), b in sorted(self._parked.items())
            )
            raise BackendError(
                f"job {group}/{job} holds {needed / GiB:.1f} GiB of device memory but the host "
                f"has {available / GiB:.1f} GiB available"
                + (f" ({elsewhere / GiB:.1f} GiB more held by checkpoints under way)"
                   if elsewhere else "")
                + (f"; parked here already: {parked}" if parked else "")
                + "; nothing was moved"
            )  # fmt: skip
        self._reserved[key] = needed
        try:
            yield moving
        finally:
            self._reserved.pop(key, None)

    # -- actions -------------------------------------------------------------------

    async def lock(self, group: str, job: str) -> BackendAction:
        start = time.time()
        states = await self.states(group, job)
        locked = await self._lock_all(group, job, states)
        if not locked:
            return BackendAction(job=job, action="noop")
        return BackendAction(
            job=job, action="lock", seconds=time.time() - start, pids=sorted(locked),
            ranks=[RankAction(pid=pid, action="lock", bytes=0, seconds=s)
                   for pid, s in sorted(locked.items())],
        )  # fmt: skip

    async def checkpoint(self, group: str, job: str, mode: EvictMode = "offload") -> BackendAction:
        states = await self.states(group, job)
        on_device = sorted(pid for pid, state in states.items() if state in ON_DEVICE)
        if not on_device:
            return BackendAction(job=job, action="noop")
        start = time.time()
        memory = device_memory()
        with self._host_memory_for(group, job, memory, on_device) as moving:
            # Phase one: every rank locked. Phase two: every rank checkpointed, at once.
            await self._lock_all(group, job, states)
            moved = await self._each(group, job, "checkpoint", on_device, memory)
            await self._check_all(group, job, CudaState.CHECKPOINTED, "checkpoint")
            self._parked[(group, job)] = moving
        return self._action(job, "checkpoint", start, moved)

    async def restore(self, group: str, job: str) -> BackendAction:
        states = await self.states(group, job)
        to_unlock = sorted(pid for pid, state in states.items() if state != CudaState.RUNNING)
        if not to_unlock:
            return BackendAction(job=job, action="noop")
        start = time.time()
        to_restore = [pid for pid in to_unlock if states[pid] == CudaState.CHECKPOINTED]
        parked = self._parked.get((group, job)) or {}
        # Every rank restored (at once) before any is unlocked.
        restored = await self._each(group, job, "restore", to_restore, None)
        unlocked = await self._each(group, job, "unlock", to_unlock, {})
        await self._check_all(group, job, CudaState.RUNNING, "restore")
        self._parked.pop((group, job), None)
        if not to_restore:
            return self._action(job, "unlock", start, unlocked)
        action = self._action(job, "restore", start, restored)
        return action.model_copy(update={"bytes": sum(parked.values()), "pids": to_unlock})

    async def release(self, group: str, job: str) -> Released:
        """Restore what fits, unlock every locked process; what does not fit
        stays checkpointed (its CUDA calls block; the process can be killed);
        a FAILED process is left as it is."""
        states = await self.states(group, job, allow_failed=True)
        failed = sorted(
            pid for pid in self._failed.get((group, job), set()) if states.get(pid) is not None
        )
        parked = sorted(pid for pid, state in states.items() if state == CudaState.CHECKPOINTED)
        done: list[str] = []
        need, free = self._parked.get((group, job)), await self.free_memory(group)
        if parked and need is not None and free is not None and not fits(need, free):
            done.append(f"no room on the device for the state of {parked}")
        elif parked:
            # Where it is not known to fit the driver decides: a restore that
            # finds no room fails and leaves the process checkpointed
            # ([API] "The GPU to restore onto needs to have enough memory").
            outcomes = await asyncio.gather(
                *(self._act_and_time("restore", pid) for pid in parked), return_exceptions=True
            )
            done += [f"restore of {pid}: {o}" for pid, o in zip(parked, outcomes, strict=True)
                     if isinstance(o, BaseException)]  # fmt: skip
        locked = [
            pid for pid, state in (await self.states(group, job, allow_failed=True)).items()
            if state == CudaState.LOCKED
        ]  # fmt: skip
        outcomes = await asyncio.gather(
            *(self._act_and_time("unlock", pid) for pid in locked), return_exceptions=True
        )
        done += [f"unlock of {pid}: {o}" for pid, o in zip(locked, outcomes, strict=True)
                 if isinstance(o, BaseException)]  # fmt: skip
        after = await self.states(group, job, allow_failed=True)
        if not any(state == CudaState.CHECKPOINTED for state in after.values()):
            self._parked.pop((group, job), None)
        self._failed.pop((group, job), None)  # it left: nothing more to refuse for it
        return Released(
            running=sorted(p for p, s in after.items() if s == CudaState.RUNNING),
            checkpointed=sorted(p for p, s in after.items() if s == CudaState.CHECKPOINTED),
            failed=failed,
            done=done,
        )

    # -- helpers -------------------------------------------------------------------

    async def _act_and_time(self, action: str, pid: int) -> float:
        start = time.monotonic()
        # Wall clock, for the record: ranks of one phase overlap in time.
        self._call_began[pid] = time.time()
        await self._bounded(self.act(action, pid), f"{action} of process {pid}", pid, True)
        return time.monotonic() - start

    async def _lock_all(
        self, group: str, job: str, states: dict[int, CudaState]
    ) -> dict[int, float]:
        """Lock every running CUDA process of the job at once; if one cannot
        be locked, unlock those that were and fail, leaving the job running
        ([CRIU] cuda_plugin_pause_devices unlocks on a failed lock)."""
        running = sorted(pid for pid, state in states.items() if state == CudaState.RUNNING)
        outcomes = await asyncio.gather(
            *(self._act_and_time("lock", pid) for pid in running), return_exceptions=True
        )
        locked = {pid: o for pid, o in zip(running, outcomes, strict=True) if isinstance(o, float)}
        errors = await self._still_there(running, outcomes)
        if not errors:
            return locked
        await self._raise_if_failed(group, job, errors)
        if any(isinstance(e, StateUnknown) for e in errors.values()):
            # A lock that may still take effect: nothing is "left running".
            raise _first(list(errors.values()), StateUnknown)
        unlocked = await asyncio.gather(
            *(self._act_and_time("unlock", pid) for pid in locked), return_exceptions=True
        )
        stuck = [
            pid for pid, o in zip(locked, unlocked, strict=True) if isinstance(o, BaseException)
        ]
        raise BackendError(
            f"job {group}/{job} could not be locked, left running: "
            f"{_first(list(errors.values()), BackendError)}"
            + (f" (and processes {stuck} could not be unlocked again)" if stuck else "")
        )

    async def _each(
        self,
        group: str,
        job: str,
        action: str,
        pids: list[int],
        memory: dict[str, DeviceMemory] | None,
    ) -> list[RankAction]:
        """One action on each process at once; every failure reported, none
        of the others undone. Each rank's bytes are its device memory in
        ``memory`` (None: as NVML shows it afterwards; {}: nothing moves)."""
        outcomes = await asyncio.gather(
            *(self._act_and_time(action, pid) for pid in pids), return_exceptions=True
        )
        errors = await self._still_there(pids, outcomes)
        if memory is None and pids:
            memory = device_memory()
        done = [
            RankAction(
                pid=pid, action=_action_name(action), seconds=o,
                bytes=_rank_bytes(memory, pid) if memory else 0,
            )
            for pid, o in zip(pids, outcomes, strict=True)
            if isinstance(o, float)
        ]  # fmt: skip
        self._record(group, job, done)
        if errors:
            await self._raise_if_failed(group, job, errors)
            unknown = [e for e in errors.values() if isinstance(e, StateUnknown)]
            first = unknown[0] if unknown else _first(list(errors.values()), BackendError)
            ok = [rank.pid for rank in done]
            raise type(first)(
                f"job {group}/{job}: {first}" + (f"; {action} of {ok} succeeded" if ok else "")
            )
        return done

    async def _still_there(
        self, pids: list[int], outcomes: list[float | BaseException]
    ) -> dict[int, BaseException]:
        """The failures of processes that still hold a CUDA context: one that
        exited meanwhile has no state left to move."""
        errors = {}
        for pid, outcome in zip(pids, outcomes, strict=True):
            if isinstance(outcome, BaseException):
                gone = not alive(pid) or not await self._is_cuda(pid)
                if isinstance(outcome, StateUnknown) or not gone:
                    errors[pid] = outcome
        return errors

    async def _check_all(self, group: str, job: str, wanted: CudaState, what: str) -> None:
        """Every CUDA process of the job is ``wanted`` now: a {what} that
        skipped one (a process that began using CUDA meanwhile, say) fails."""
        states = await self.states(group, job)
        skipped = {pid: state for pid, state in states.items() if state != wanted}
        if skipped:
            listed = ", ".join(f"{pid} ({state})" for pid, state in sorted(skipped.items()))
            raise BackendError(
                f"{what} of job {group}/{job} on node {self.node} left processes {listed}, "
                f"not {wanted}; the switch fails rather than report them moved"
            )

    async def _raise_if_failed(
        self, group: str, job: str, errors: dict[int, BaseException]
    ) -> None:
        """A failed call that left a process FAILED is terminal (JobFailed);
        so is one whose process exited after it failed (as a FAILED process
        does at its next CUDA call): the job has lost that rank."""
        try:
            await self.states(group, job)
        except JobFailed:
            raise
        except BackendError:
            pass
        exited = sorted(pid for pid, error in errors.items() if not alive(pid))
        if exited:
            self._failed.setdefault((group, job), set()).update(exited)
            raise JobFailed(group, job, _failed_message(group, job, exited, self.node))
        for error in errors.values():
            if not isinstance(error, BackendError):
                raise error

    def _action(
        self, job: str, action: ActionName, start: float, ranks: list[RankAction]
    ) -> BackendAction:
        known = [rank.bytes for rank in ranks if rank.bytes is not None]
        return BackendAction(
            job=job, action=action, bytes=sum(known), seconds=time.time() - start,
            pids=sorted(rank.pid for rank in ranks), ranks=ranks,
        )  # fmt: skip

    def _record(self, group: str, job: str, ranks: list[RankAction]) -> None:
        if self.record_path is None or not ranks:
            return
        with self.record_path.open("a") as record:
            for rank in ranks:
                began = self._call_began.pop(rank.pid, None)
                record.write(json.dumps({
                    "event": rank.action, "node": self.node, "group": group, "job": job,
                    "pid": rank.pid, "bytes": rank.bytes, "seconds": rank.seconds,
                    "start": began, "end": None if began is None else began + rank.seconds,
                    "at": time.time(),
                }) + "\n")  # fmt: skip


def footprint(memory: dict[str, DeviceMemory], pids: list[int]) -> DeviceBytes | None:
    """The bytes these processes use on each GPU where they use any; None
    if NVML cannot tell for any of them."""
    found: DeviceBytes = {}
    for gpu, m in memory.items():
        counts = [m.by_pid[pid] for pid in pids if pid in m.by_pid]
        if any(count is None for count in counts):
            return None
        total = sum(count for count in counts if count is not None)
        if total:
            found[gpu] = total
    return found


def upper_bound(memory: dict[str, DeviceMemory], pids: list[int]) -> int:
    """All the memory used on every GPU where any of these processes appears."""
    return sum(m.used_bytes for m in memory.values() if any(pid in m.by_pid for pid in pids))


def _rank_bytes(memory: dict[str, DeviceMemory], pid: int) -> int | None:
    found = footprint(memory, [pid])
    return None if found is None else sum(found.values())


def _action_name(action: str) -> ActionName:
    names: dict[str, ActionName] = {
        "lock": "lock", "checkpoint": "checkpoint", "restore": "restore", "unlock": "unlock",
    }  # fmt: skip
    return names[action]


def _first(errors: list[BaseException], kind: type[BackendError]) -> BackendError:
    for error in errors:
        if isinstance(error, kind):
            return error
    return BackendError(str(errors[0]))


def _failed_message(group: str, job: str, pids: list[int], node: str) -> str:
    return (
        f"job {group}/{job}: the CUDA state of processes {pids} on node {node} is FAILED "
        "(terminal: the driver cannot checkpoint, restore or unlock them); the job is "
        "evicted and must be restarted"
    )
