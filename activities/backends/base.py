"""The interface every snapshot backend implements (timeshare.activities.backends.loading
chooses one by name).

A job is named by its group and its name: two groups may both have a "job-a".
Every action is idempotent: a backend reads the job's state first, so a
retried checkpoint of a checkpointed job (or restore of a resident one) does
nothing and reports ``noop``.

A job's state is running (on the device, the job may use it), locked (on the
device, the job may not run: co-residency) or parked (in host memory).

In a stack ("freeze+cuda", "app+cuda") the layers act in the order their
``evict_order`` gives, whatever order the name lists them in: a job's hooks
first (they need its processes running), then its device state (the CUDA
driver needs the process's restore thread to run), then its processes are
stopped; a restore goes the other way round.
"""

from __future__ import annotations

import abc
from typing import TYPE_CHECKING, ClassVar, Protocol

from pydantic import BaseModel, Field

from timeshare.activities.backends.processes import ProcessTable
from timeshare.hooks.protocol import EvictMode
from timeshare.models import BackendAction, DeviceBytes
from timeshare.node.events import HostAsked

if TYPE_CHECKING:
    from timeshare.activities.backends.hook_registry import HookRegistry


class HostLedger(Protocol):
    """Where a backend holds the host memory a checkpoint needs: the node's
    core decides (timeshare/node/core.py), against every checkpoint under
    way on the node whatever its group."""

    def hold(self, asked: HostAsked) -> None:
        """Hold it, or raise BackendError saying why not (nothing was moved)."""

    def free(self, group: str, job: str) -> None: ...


class BackendConfig(BaseModel):
    """Settings handed to a backend; each backend reads the fields it knows."""

    node: str
    # None: a simulated GPU that holds one job at a time (and no co-residency).
    sim_capacity_bytes: int | None = None
    sim_bandwidth_bytes_per_second: float = 20e9
    # Restores (host to device) at another speed than checkpoints, as on real
    # hosts where saving a job's state takes longer than bringing it back
    # (None: the same speed).
    sim_restore_bandwidth_bytes_per_second: float | None = None
    sim_state_bytes: int = 2 * 2**30
    # Jobs whose simulated state has another size, by job name.
    sim_job_state_bytes: dict[str, int] = Field(default_factory=dict)
    # The node's simulated GPUs (a group's jobs live on those its policy
    # claims), and its simulated host memory (None: as much as parked state needs).
    sim_gpus: int = 1
    sim_host_memory_bytes: int | None = None
    # Where the sim backend appends its residency record (JSON lines).
    sim_record_path: str | None = None
    # Where the sim backend keeps what its GPU holds, so that, like a real GPU,
    # it still holds it after the agent restarts.
    sim_state_path: str | None = None
    # Where a process backend (freeze) appends what it did (JSON lines).
    record_path: str | None = None
    # How long a backend waits for every process of a job to stop (or lock).
    lock_timeout_seconds: float = 10.0
    # The `cuda-checkpoint` utility (default: found on PATH).
    cuda_checkpoint_path: str | None = None
    # No single call of a backend (one utility run) may take longer.
    call_timeout_seconds: float = 300.0
    # The share of a job's simulated state that a discard drops (its KV cache,
    # say) instead of moving it, and how fast the job rebuilds it on admission
    # (0: at once, as a KV cache that is only reallocated).
    sim_discard_fraction: float = 0.5
    sim_rebuild_bytes_per_second: float = 0.0
    # How long a job's evict or admit hook may take.
    hook_timeout_seconds: float = 120.0
    # Device memory co-residency leaves free on each GPU (NVML figures drift).
    co_residency_margin_bytes: int = 2 * 2**30


class BackendError(Exception):
    """A backend action failed; the message says what and why."""


class JobFailed(BackendError):
    """A process of the job is in a terminal failed state (the driver's
    CU_PROCESS_STATE_FAILED): nothing can bring its state back, so the job is
    not unlocked or retried as if it were fine; the scheduler evicts it."""

    def __init__(self, group: str, job: str, message: str) -> None:
        super().__init__(message)
        self.group, self.job = group, job


class HookFailed(BackendError):
    """The job's own workload hook failed, hung or hung up: the job's own
    doing, so the scheduler evicts that job once retries are spent, rather
    than hold every other job of the group back with it."""

    def __init__(self, group: str, job: str, message: str) -> None:
        super().__init__(message)
        self.group, self.job = group, job


class NoDeviceRoom(BackendError):
    """The job's parked state does not fit in the device memory free now, so
    it was not restored: it stays parked and can be restored once the room is
    free. Never retried blindly: a restore the driver fails for lack of memory
    cannot be retried on driver 580 (NVIDIA/cuda-checkpoint#44)."""

    def __init__(self, group: str, job: str, message: str) -> None:
        super().__init__(message)
        self.group, self.job = group, job


class StateUnknown(BackendError):
    """A call on the job's processes is still running past its time limit:
    until it ends nobody can say where the job's state is."""


# The layers of a stack, in the order they act when a job leaves the device.
HOOKS, DEVICE, PROCESSES = 0, 1, 2


class Released(BaseModel):
    """What releasing a job that left its group did to its processes here."""

    running: list[int] = Field(default_factory=list)
    checkpointed: list[int] = Field(default_factory=list)
    failed: list[int] = Field(default_factory=list)
    # What each layer did, in words.
    done: list[str] = Field(default_factory=list)

    def merged(self, other: Released) -> Released:
        """Two layers' reports of one job: a process that runs again as a
        process but whose device state is still parked (or FAILED) is listed
        as such."""
        failed = set(self.failed) | set(other.failed)
        checkpointed = (set(self.checkpointed) | set(other.checkpointed)) - failed
        return Released(
            running=sorted((set(self.running) | set(other.running)) - checkpointed - failed),
            checkpointed=sorted(checkpointed),
            failed=sorted(failed),
            done=self.done + other.done,
        )


class Backend(abc.ABC):
    name: ClassVar[str]
    simulated: ClassVar[bool] = False
    # Where this backend acts among the layers of a stack (HOOKS, DEVICE, PROCESSES).
    evict_order: ClassVar[int] = DEVICE

    @classmethod
    @abc.abstractmethod
    def create(cls, config: BackendConfig) -> Backend: ...

    @abc.abstractmethod
    async def checkpoint(self, group: str, job: str, mode: EvictMode = "offload") -> BackendAction:
        """Move the job's device state to host memory (``discard``: what the
        job can rebuild may be dropped instead); no-op unless on the device."""

    @abc.abstractmethod
    async def restore(self, group: str, job: str) -> BackendAction:
        """Bring the job's state back to the device and let it run; no-op if
        it runs already. A job that was only locked is unlocked ("unlock")."""

    @abc.abstractmethod
    async def resident_jobs(self, group: str) -> list[str]:
        """Jobs of ``group`` whose state is in device memory on this node now,
        running or locked."""

    async def lock(self, group: str, job: str) -> BackendAction:
        """Stop the job running, leaving its state on the device; no-op unless running."""
        raise BackendError(f"backend {self.name} cannot lock a job without checkpointing it")

    async def quiesce(self, group: str, job: str, mode: EvictMode = "offload") -> BackendAction:
        """Everything a checkpoint does before it moves state: the job stops
        running and its state stays on the device, so that a job on several
        nodes is stopped everywhere before it is checkpointed anywhere. The
        checkpoint that follows finishes the work. Most backends: a lock."""
        return await self.lock(group, job)

    def failed(self, group: str, job: str) -> bool:
        """The job was seen in a terminal failed state here (JobFailed)."""
        return False

    async def on_device(self, group: str, job: str) -> bool:
        """Any of the job's state is in device memory here (running or locked)."""
        return job in await self.resident_jobs(group)

    async def stopped(self, group: str, job: str) -> bool:
        """The job is stopped here with its state still on the device (locked
        or frozen)."""
        return False

    def co_residency(self) -> bool:
        """Whether policy "auto" lets jobs share the device here: the backend
        can lock without checkpointing and knows how much memory is free."""
        return False

    async def footprint(self, group: str, job: str) -> DeviceBytes | None:
        """Device bytes the job's state holds on the device now ({} when it
        holds none there); None when unknown."""
        return None

    async def admission_footprint(self, group: str, job: str) -> DeviceBytes | None:
        """Device bytes the job's state will hold once restored; None when unknown."""
        return None

    async def free_memory(self, group: str) -> DeviceBytes | None:
        """Device bytes still free for ``group``'s jobs, less any safety
        margin; None when unknown."""
        return None

    def evict_mode(self, group: str, job: str) -> EvictMode | None:
        """How the job asked to be evicted, if it told this backend."""
        return None

    def place(self, group: str, gpus: list[int]) -> None:
        """The GPU indices the group's policy claims on this node (none: all);
        only the sim backend uses them, to model GPUs shared by groups."""
        return None

    async def release(self, group: str, job: str, restore: bool = True) -> Released:
        """The job left its group: let its processes here run again and
        never leave them stopped; its state goes back to the device where it
        fits, unless ``restore`` is off (another job holds the device and
        co-residency is off): then it stays parked in host memory, and a
        later release with ``restore`` brings it back. Idempotent."""
        return Released()

    def notes(self) -> list[str]:
        """What operators should know about this node now, one line each
        (shown by `timeshare status`)."""
        return []

    def gpus(self) -> list[str]:
        return []

    def attach(self, processes: ProcessTable) -> None:
        """Hand the backend the node's registered processes; only process
        backends keep them."""
        return None

    def attach_hooks(self, hooks: HookRegistry) -> None:
        """Hand the backend the node's workload hook connections; only the
        app backend keeps them."""
        return None

    def attach_host_ledger(self, ledger: HostLedger) -> None:
        """Hand the backend the node's host memory ledger; only backends that
        move state into their processes' host memory (CUDA) ask it."""
        return None

    def describe(self) -> str:
        return self.name


class BackendNotFound(LookupError):
    pass
