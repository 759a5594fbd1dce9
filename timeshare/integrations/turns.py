"""How an integration takes its turns: acquire one for a phase, give it back,
hand it over at a step boundary, or run something (a reward function) with
the turn given away. The integrations call only these, so the same lines work
in-process, under a coordinator, or with timeshare absent.

Two rules shape every integration, from how the backends stop a job:

- Between giving a turn back and getting the next one, a process that holds
  GPU state runs no device code: the ``cuda`` backends block its CUDA calls
  until its state is back, and that needs its next ``acquire()``, which a
  blocked call never reaches. So a phase change is one ``handover`` (nothing
  runs in between), and off-GPU work is one ``outside`` (only the given call
  runs in between).
- A process registered with the node's agent is stopped whole by the
  ``freeze`` backends: such a process cannot ask for its own turns. It runs
  under a coordinator (timeshare.integrations.coordinator) instead, which
  holds the job's place and runs its ``outside`` work (the rewards) itself.
"""

from __future__ import annotations

import abc
import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

import timeshare
from timeshare._protocol import JobRef
from timeshare.client import Client, Job
from timeshare.errors import FailedPrecondition, TimeshareError
from timeshare.registration import register_process

if TYPE_CHECKING:
    from timeshare.hooks import HookServer, WorkloadHooks

Result = TypeVar("Result")
ENV_GROUP = "TIMESHARE_GROUP"
ENV_JOB = "TIMESHARE_JOB"
ENV_TURNS_FD = "TIMESHARE_TURNS_FD"
# Backends that stop a registered process whole between its turns.
STOPPING_BACKENDS = ("freeze",)


@dataclass(frozen=True)
class TurnRecord:
    """One turn as the job saw it: wall-clock seconds (time.time())."""

    phase: str
    granted_at: float
    yielded_at: float


class Turns(abc.ABC):
    """A job's turns, whichever way they are taken."""

    def __init__(self) -> None:
        self.phase = ""
        self._enroll: tuple[WorkloadHooks | None] | None = None

    @property
    @abc.abstractmethod
    def holding(self) -> bool:
        """Whether the job holds its group's GPUs now."""

    @property
    def enabled(self) -> bool:
        return True

    @property
    def remote(self) -> bool:
        """Whether ``outside`` work runs in another process (its arguments then
        travel as JSON, its function is imported there by name)."""
        return False

    def acquire(self, phase: str) -> None:
        """Hold the turn for ``phase`` (a no-op while held)."""
        if self.holding:
            return
        self._acquire(phase)
        self.phase = phase
        if self._enroll is not None:
            (hooks,) = self._enroll
            self._enroll = None
            self._enroll_now(hooks)

    def release(self) -> None:
        """Give the turn back (a no-op while not held)."""
        if self.holding:
            self._release()

    def handover(self, phase: str) -> None:
        """A yield point: let a waiting job in, then hold the turn for ``phase``."""
        self.release()
        self.acquire(phase)

    def outside(self, call: Callable[..., Result], kwargs: dict[str, Any], then: str) -> Result:
        """Run ``call(**kwargs)`` with the turn given away, then hold it for ``then``."""
        self.release()
        result = call(**kwargs)
        self.acquire(then)
        return result

    def enroll_this_process(self, hooks: WorkloadHooks | None = None) -> None:
        """Make this process one of the job's GPU processes on this node (and
        serve ``hooks`` to its agent), at once if the job holds its turn, else
        as soon as it does: a process enrolled while another job holds the
        GPUs is stopped at once, before it could ask for its turn."""
        if self.holding:
            self._enroll_now(hooks)
        else:
            self._enroll = (hooks,)

    def close(self) -> None:  # noqa: B027  # nothing to leave unless a subclass joined
        """Leave the group; the last turn is held until here, so that what
        runs after training (a final save) runs inside it."""

    @abc.abstractmethod
    def _acquire(self, phase: str) -> None: ...

    @abc.abstractmethod
    def _release(self) -> None: ...

    def _enroll_now(self, hooks: WorkloadHooks | None) -> None:
        return None


class NoTurns(Turns):
    """timeshare is not configured here: everything runs as it would alone."""

    @property
    def holding(self) -> bool:
        return False

    @property
    def enabled(self) -> bool:
        return False

    def acquire(self, phase: str) -> None:
        return None

    def outside(self, call: Callable[..., Result], kwargs: dict[str, Any], then: str) -> Result:
        return call(**kwargs)

    def enroll_this_process(self, hooks: WorkloadHooks | None = None) -> None:
        return None

    def _acquire(self, phase: str) -> None:
        return None

    def _release(self) -> None:
        return None


class JobTurns(Turns):
    """This process holds the job's place in its group and asks for its turns."""

    def __init__(self, job: Job, client: Client | None = None) -> None:
        super().__init__()
        self.job = job
        self._client = client
        self._granted_at: float | None = None
        self.records: list[TurnRecord] = []
        self._hooks: HookServer | None = None
        self._closed = False

    @classmethod
    def join(
        cls, group: str | None = None, job: str | None = None, address: str | None = None
    ) -> JobTurns:
        client = timeshare.connect(address)
        return cls(client.join(group, job), client)

    @property
    def holding(self) -> bool:
        return self._granted_at is not None

    def _acquire(self, phase: str) -> None:
        self.job.acquire(phase=phase)
        self._granted_at = time.time()

    def handover(self, phase: str) -> None:
        """As Turns.handover, in one message (Job.next_turn): with nobody
        waiting the job keeps its GPUs and nothing moves."""
        if not self.holding:
            self.acquire(phase)
            return
        granted_at, self._granted_at = self._granted_at, None
        if granted_at is not None:
            self.records.append(TurnRecord(self.phase, granted_at, time.time()))
        self.job.next_turn(phase=phase)
        self._granted_at = time.time()
        self.phase = phase

    def _release(self) -> None:
        granted_at, self._granted_at = self._granted_at, None
        # The turn's use ends when it is given back: once the yield is
        # recorded, the next job's switch may begin before yield_() returns.
        if granted_at is not None:
            self.records.append(TurnRecord(self.phase, granted_at, time.time()))
        self.job.yield_()

    def _enroll_now(self, hooks: WorkloadHooks | None) -> None:
        self.refuse_stopping_backends()
        if hooks is None:
            register_process(self.job.group, self.job.name, token=self.job.token)
            return
        from timeshare.hooks import serve_hooks

        self._hooks = serve_hooks(hooks, self.job.group, self.job.name, token=self.job.token)

    def refuse_stopping_backends(self) -> None:
        """A process that asks for its own turns cannot be one that the
        backend stops between them: it would never ask for the next."""
        if self._client is None:
            return
        stopping = [
            f"{node.node} ({node.backend})"
            for node in self._client.list_nodes()
            if node.node in self.job.nodes
            and any(layer in STOPPING_BACKENDS for layer in node.backend.split("+"))
        ]
        if stopping:
            raise FailedPrecondition(
                f"the agents of {', '.join(stopping)} stop a job's processes whole between "
                "its turns, so this process cannot ask for its own: start it under "
                "`python -m timeshare.integrations.coordinator --group G --job J -- COMMAND`"
            )

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._hooks is not None:
            self._hooks.close()
            self._hooks = None
        # The turn may have moved on in another process of the job (a
        # ticket's): leaving gives back whatever the job holds.
        with contextlib.suppress(TimeshareError):
            self.release()
        self.job.leave()
        if self._client is not None:
            self._client.close()

    def ticket(self) -> TurnTicket:
        """What another process of this job needs to take its turns on from
        here (``JobTurns.adopt``): one process at a time asks for them."""
        ref = self.job.ref
        address = self._client.address if self._client is not None else ""
        return TurnTicket(
            address=address, group=ref.group, job=ref.job, token=ref.token, nodes=ref.nodes,
            lease_seconds=ref.lease_seconds, idle_lease_seconds=ref.idle_lease_seconds,
            epoch=ref.epoch if self.holding else None, phase=self.phase,
        )  # fmt: skip

    @classmethod
    def adopt(cls, ticket: TurnTicket) -> JobTurns:
        """The job's turns, taken on in this process from a ticket: the turn
        held when it was written is held here (no second Join: that would
        give the job a new token and lock the first process out)."""
        client = timeshare.connect(ticket.address or None)
        ref = JobRef(
            group=ticket.group, job=ticket.job, token=ticket.token, nodes=list(ticket.nodes),
            lease_seconds=ticket.lease_seconds, epoch=ticket.epoch,
            idle_lease_seconds=ticket.idle_lease_seconds,
        )  # fmt: skip
        turns = cls(Job(client, ref), client)
        if ticket.epoch is not None:
            turns._granted_at = time.time()
            turns.phase = ticket.phase
        return turns


@dataclass(frozen=True)
class TurnTicket:
    """A job's place and its turn held, handed to another of its processes
    (a Ray actor the driver made) inside the pickled wrappers. Holds the
    job's token: it travels only where TIMESHARE_JOB_TOKEN would."""

    address: str
    group: str
    job: str
    token: str
    nodes: list[str]
    lease_seconds: float
    idle_lease_seconds: float
    epoch: int | None
    phase: str
