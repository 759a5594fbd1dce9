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
  timeshare/gpu_check/emulator/libcuda.c's header.
- CHECKPOINTING and RESTORING ([API] CUprocessState, CUDA 13) are in progress:
  they are waited for. FAILED is terminal: such a job is never unlocked or
  retried as if it were fine (JobFailed), the scheduler evicts it.
- No call is given up on while it may still change a process's state: a lock
  is bounded by the driver's own timeoutMs ([API] CUcheckpointLockArgs); a call
  still running after the call timeout leaves the job's state unknown
  (StateUnknown), and the next action on that process first waits for the call
  to end and reads the state again. Reads count as in flight too, and hung
  calls cannot take every thread (bounded_calls.py).
- A checkpoint that leaves any CUDA process of the job on the device fails.
- Host memory for a checkpoint is held before anything is locked (the node's
  ledger), device memory for a restore before the driver is asked; a restore
  that does not fit is refused (NoDeviceRoom) and the job stays parked. One
  the driver still fails for lack of memory can never be restored on driver
  580 (NVIDIA/cuda-checkpoint#44): the job fails (JobFailed) for good.
- A job's footprint is read from NVML while it is on the device and is the
  one NVML showed at its checkpoint while parked. Memory NVML cannot tell
  (MIG, no accounting, a process it does not list) is unknown, never zero:
  such a job is never kept co-resident, and its reservations are the whole of
  its GPUs' used memory.
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
import json
import time
from collections.abc import Iterator
from functools import partial
from pathlib import Path

from timeshare.activities.backends.base import (
    Backend,
    BackendConfig,
    BackendError,
    HostLedger,
    JobFailed,
    NoDeviceRoom,
    Released,
    StateUnknown,
)
from timeshare.activities.backends.bounded_calls import BoundedCalls
from timeshare.activities.backends.checkpoint_memory import (
    MemoryHeld,
    footprint,
    rank_bytes,
    unrestorable_message,
    upper_bounds,
)
from timeshare.activities.backends.cuda_states import (
    IN_PROGRESS,
    ON_DEVICE,
    CudaState,
    NotCuda,
    OutOfDeviceMemory,
    action_name,
    failed_message,
)
from timeshare.activities.backends.gpus import DeviceMemory, device_memory, node_gpus
from timeshare.activities.backends.processes import ProcessTable, alive
from timeshare.hooks.protocol import EvictMode
from timeshare.models import ActionName, BackendAction, DeviceBytes, RankAction

JobKey = tuple[str, str]
GiB = 2**30
STATE_POLL_SECONDS = 0.02
# Calls that may hang past the call timeout before no new one starts: half
# of a backend's threads (cuda_driver.py's pool) stay for healthy processes.
STUCK_CALLS = 32


class ProcessCheckpointBackend(Backend):
    def __init__(self, config: BackendConfig, stuck_limit: int = STUCK_CALLS) -> None:
        self.node = config.node
        self.lock_timeout = config.lock_timeout_seconds
        self.call_timeout = config.call_timeout_seconds
        self.margin = config.co_residency_margin_bytes
        self.record_path = Path(config.record_path) if config.record_path else None
        self.processes = ProcessTable()
        self.calls = BoundedCalls(self.call_timeout, stuck_limit)
        self.held = MemoryHeld(self.node)
        # Each checkpointed job's device bytes per GPU as NVML saw them (None: it
        # could not tell), and the room its restore needs (unknown: all in use).
        self._parked: dict[JobKey, DeviceBytes | None] = {}
        self._room: dict[JobKey, DeviceBytes] = {}
        # Jobs whose device memory NVML cannot tell, and why.
        self._unknown_memory: dict[JobKey, str] = {}
        # Jobs a process of which was seen FAILED: terminal for the job, even
        # once that process has exited, until the job is released.
        self._failed: dict[JobKey, set[int]] = {}
        # Processes whose restore ran out of device memory, and per job those
        # of them that can never be restored (NVIDIA/cuda-checkpoint#44): terminal likewise.
        self._out_of_memory: set[int] = set()
        self._lost: dict[JobKey, set[int]] = {}
        # When each process's latest call began (wall clock), for the record.
        self._call_began: dict[int, float] = {}

    def attach(self, processes: ProcessTable) -> None:
        self.processes = processes

    def attach_host_ledger(self, ledger: HostLedger) -> None:
        self.held.ledger = ledger

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

    async def _settled_state(self, pid: int) -> CudaState:
        """The process's state once no call or operation on it is under way."""
        await self.calls.ended(pid)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.call_timeout
        while True:
            state = await self.calls.read(
                partial(self.read_state, pid), f"reading the state of process {pid}", pid, "state"
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
        tid = await self.calls.read(
            partial(self.restore_thread, pid),
            f"asking process {pid} for its restore thread",
            pid,
            "probe",
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
            raise JobFailed(group, job, failed_message(group, job, pids, self.node))
        if (group, job) in self._lost and not allow_failed:
            pids = sorted(self._lost[(group, job)])
            raise JobFailed(group, job, unrestorable_message(group, job, pids, self.node))
        return states

    def failed(self, group: str, job: str) -> bool:
        return (group, job) in self._failed or (group, job) in self._lost

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
                "its processes' device memory (MIG, no per-process accounting, or an agent "
                "in another PID namespace); it is moved, never packed"
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
        """Hold host memory for the device bytes about to move (per GPU)."""
        moving = self._noted_footprint(group, job, memory, pids)
        # Unknown per process: as much as is used on the GPUs it holds.
        needed = sum((moving if moving is not None else upper_bounds(memory, pids)).values())
        parked = ", ".join(
            f"{g}/{j} {sum((b or {}).values()) / GiB:.1f} GiB"
            for (g, j), b in sorted(self._parked.items())
        )
        with self.held.host_for((group, job), needed, pids, parked):
            yield moving

    def _device_room(self, group: str, job: str) -> contextlib.AbstractContextManager[None]:
        """Hold the device memory the job's restore needs, or refuse
        (NoDeviceRoom). Where nothing is known of it (parked before this
        agent started, or no NVML) the driver decides."""
        need, memory = self._room.get((group, job)), device_memory()
        if need is None or not memory:
            return contextlib.nullcontext()
        return self.held.device_for(
            (group, job), need, memory, self._parked.get((group, job)) is not None
        )

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
            try:
                moved = await self._each(group, job, "checkpoint", on_device, memory)
                await self._check_all(group, job, CudaState.CHECKPOINTED, "checkpoint")
            except (JobFailed, StateUnknown):
                raise  # nothing may act on the job now
            except BackendError as error:
                if not self.processes.released(group, job):
                    raise  # a member: the retry moves only what is left
                raise BackendError(f"{error}{await self._resume(group, job)}") from None
            self._parked[(group, job)] = moving
            self._room[(group, job)] = (
                moving if moving is not None else upper_bounds(memory, on_device)
            )
        return self._action(job, "checkpoint", start, moved)

    async def restore(self, group: str, job: str) -> BackendAction:
        states = await self.states(group, job)
        to_unlock = sorted(pid for pid, state in states.items() if state != CudaState.RUNNING)
        if not to_unlock:
            return BackendAction(job=job, action="noop")
        start = time.time()
        to_restore = [pid for pid in to_unlock if states[pid] == CudaState.CHECKPOINTED]
        parked = self._parked.get((group, job)) or {}
        # Every rank restored (at once), in room held for it, before any is unlocked.
        restored = []
        if to_restore:
            with self._device_room(group, job):
                restored = await self._restore_all(group, job, to_restore)
        unlocked = await self._each(group, job, "unlock", to_unlock, {})
        await self._check_all(group, job, CudaState.RUNNING, "restore")
        self._parked.pop((group, job), None)
        self._room.pop((group, job), None)
        if not to_restore:
            return self._action(job, "unlock", start, unlocked)
        action = self._action(job, "restore", start, restored)
        return action.model_copy(update={"bytes": sum(parked.values()), "pids": to_unlock})

    async def release(self, group: str, job: str, restore: bool = True) -> Released:
        """Restore what fits (with ``restore``), unlock every locked process;
        the rest stays checkpointed (its CUDA calls block; it may exit); a
        FAILED or unrestorable process is left as it is."""
        key = (group, job)
        states = await self.states(group, job, allow_failed=True)
        failed = sorted(pid for pid in self._failed.get(key, set()) if states.get(pid) is not None)
        lost = sorted(pid for pid in self._lost.get(key, set()) if pid in states)
        parked = sorted(
            pid for pid, state in states.items()
            if state == CudaState.CHECKPOINTED and pid not in lost
        )  # fmt: skip
        done = [unrestorable_message(group, job, lost, self.node)] if lost else []
        if parked and not restore:
            done.append(f"{parked} parked in host memory while another job holds the GPU: "
                        "restored once it is free")  # fmt: skip
        elif parked:
            try:
                with self._device_room(group, job):
                    done += await self._try_each("restore", parked)
                if newly_lost := sorted(set(parked) & self._out_of_memory):
                    done.append(unrestorable_message(group, job, newly_lost, self.node))
            except NoDeviceRoom as refused:
                done.append(f"not restored: {refused}")
        locked = [
            pid for pid, state in (await self.states(group, job, allow_failed=True)).items()
            if state == CudaState.LOCKED
        ]  # fmt: skip
        done += await self._try_each("unlock", locked)
        after = await self.states(group, job, allow_failed=True)
        if not any(state == CudaState.CHECKPOINTED for state in after.values()):
            self._parked.pop(key, None)
            self._room.pop(key, None)
        # It left: nothing more to refuse for it.
        self._failed.pop(key, None)
        self._out_of_memory -= self._lost.pop(key, set()) | set(after)
        return Released(
            running=sorted(p for p, s in after.items() if s == CudaState.RUNNING),
            checkpointed=sorted(p for p, s in after.items() if s == CudaState.CHECKPOINTED),
            failed=failed,
            done=done,
        )

    async def _resume(self, group: str, job: str) -> str:
        """After a checkpoint of a job that left its group failed part-way:
        bring back the ranks it moved and unlock every rank, since nobody
        would ever unlock them (the scheduler evicts a job whose state keeps
        failing to move, then tries its switch once more; [CRIU] cuda_plugin
        likewise resumes the devices of a task whose dump failed). Says what
        could not be undone."""
        states = await self.states(group, job, allow_failed=True)
        undone = await self._try_each(
            "restore", [pid for pid, state in states.items() if state == CudaState.CHECKPOINTED]
        )
        states = await self.states(group, job, allow_failed=True)
        undone += await self._try_each(
            "unlock", [pid for pid, state in states.items() if state == CudaState.LOCKED]
        )
        if not undone:
            return "; the job runs on, its state on the device"
        return f"; and it could not be resumed ({'; '.join(undone)})"

    # -- helpers -------------------------------------------------------------------

    async def _try_each(self, action: str, pids: list[int]) -> list[str]:
        """The action on each process at once; what failed, and why."""
        pids = sorted(pids)
        outcomes = await asyncio.gather(
            *(self._act_and_time(action, pid) for pid in pids), return_exceptions=True
        )
        return [f"{action} of {pid}: {o}" for pid, o in zip(pids, outcomes, strict=True)
                if isinstance(o, BaseException)]  # fmt: skip

    async def _act_and_time(self, action: str, pid: int) -> float:
        start = time.monotonic()
        # Wall clock, for the record: ranks of one phase overlap in time.
        self._call_began[pid] = time.time()
        try:
            await self.calls.change(
                partial(self.act, action, pid), f"{action} of process {pid}", pid
            )
        except OutOfDeviceMemory:
            self._out_of_memory.add(pid)
            raise
        return time.monotonic() - start

    async def _restore_all(self, group: str, job: str, pids: list[int]) -> list[RankAction]:
        """Restore every rank at once. One the driver failed for lack of
        device memory can never be restored on driver 580
        (NVIDIA/cuda-checkpoint#44): the job is failed, never asked again."""
        try:
            return await self._each(group, job, "restore", pids, None)
        except BackendError:
            lost = sorted(set(pids) & self._out_of_memory)
            if not lost:
                raise
            self._lost.setdefault((group, job), set()).update(lost)
            raise JobFailed(group, job, unrestorable_message(group, job, lost, self.node)) from None

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
                pid=pid, action=action_name(action), seconds=o,
                bytes=rank_bytes(memory, pid) if memory else 0,
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
            raise JobFailed(group, job, failed_message(group, job, exited, self.node))
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


def _first(errors: list[BaseException], kind: type[BackendError]) -> BackendError:
    for error in errors:
        if isinstance(error, kind):
            return error
    return BackendError(str(errors[0]))
