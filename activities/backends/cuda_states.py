"""A CUDA process's checkpoint states, as the driver names them, and what
the CUDA checkpoint backends say about them (checkpointing.py has the rules).

[API] CUprocessState of the CUDA Driver API, cuda-bindings 13.x."""

from __future__ import annotations

import enum

from timeshare.activities.backends.base import BackendError
from timeshare.models import ActionName


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


class OutOfDeviceMemory(BackendError):
    """A restore the driver failed for lack of device memory."""


def action_name(action: str) -> ActionName:
    names: dict[str, ActionName] = {
        "lock": "lock", "checkpoint": "checkpoint", "restore": "restore", "unlock": "unlock",
    }  # fmt: skip
    return names[action]


def failed_message(group: str, job: str, pids: list[int], node: str) -> str:
    return (
        f"job {group}/{job}: the CUDA state of processes {pids} on node {node} is FAILED "
        "(terminal: the driver cannot checkpoint, restore or unlock them); the job is "
        "evicted and must be restarted"
    )
