"""The interface every snapshot backend implements, and how one is chosen.

Backends are discovered through the entry-point group ``timeshare.backends``.
A job is named by its group and its name: two groups may both have a "job-a".
Every action is idempotent: a backend reads the job's state first, so a
retried checkpoint of a checkpointed job (or restore of a resident one) does
nothing and reports ``noop``.
"""

from __future__ import annotations

import abc
from importlib.metadata import entry_points
from typing import ClassVar

from pydantic import BaseModel

from activities.processes import ProcessTable
from timeshare.models import BackendAction

BACKEND_ENTRY_POINT_GROUP = "timeshare.backends"


class BackendConfig(BaseModel):
    """Settings handed to a backend; each backend reads the fields it knows."""

    node: str
    sim_capacity_bytes: int = 141 * 2**30
    sim_bandwidth_bytes_per_second: float = 20e9
    sim_state_bytes: int = 2 * 2**30
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


class BackendError(Exception):
    """A backend action failed; the message says what and why."""


class Backend(abc.ABC):
    name: ClassVar[str]
    simulated: ClassVar[bool] = False

    @classmethod
    @abc.abstractmethod
    def create(cls, config: BackendConfig) -> Backend: ...

    @abc.abstractmethod
    async def checkpoint(self, group: str, job: str) -> BackendAction:
        """Move the job's device state to host memory; no-op unless resident."""

    @abc.abstractmethod
    async def restore(self, group: str, job: str) -> BackendAction:
        """Bring the job's state back to the device; no-op if already resident."""

    @abc.abstractmethod
    async def resident_jobs(self, group: str) -> list[str]:
        """Jobs of ``group`` whose state is in device memory on this node now."""

    def gpus(self) -> list[str]:
        return []

    def attach(self, processes: ProcessTable) -> None:
        """Hand the backend the node's registered processes; only process
        backends keep them."""
        return None

    def describe(self) -> str:
        return self.name


class BackendNotFound(LookupError):
    pass


def available_backends() -> list[str]:
    return sorted(ep.name for ep in entry_points(group=BACKEND_ENTRY_POINT_GROUP))


def load_backend(name: str, config: BackendConfig) -> Backend:
    """One backend, or several stacked with "+" ("freeze+cuda": freeze, then checkpoint)."""
    if "+" in name:
        from activities.stacked import StackedBackend

        return StackedBackend([load_backend(part, config) for part in name.split("+")])
    matches = [ep for ep in entry_points(group=BACKEND_ENTRY_POINT_GROUP) if ep.name == name]
    if not matches:
        known = ", ".join(available_backends()) or "none installed"
        raise BackendNotFound(f"unknown backend {name!r} (available: {known})")
    backend_class = matches[0].load()
    if not (isinstance(backend_class, type) and issubclass(backend_class, Backend)):
        raise BackendNotFound(f"entry point {name!r} does not name a Backend class")
    return backend_class.create(config)
