"""What a node's core decides (NodeCore.handle): the commands the agent's
executor (activities/switch.py) carries out in order, each in one place."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

# What a step does to a job's processes on the device.
Step = Literal["lock", "checkpoint", "restore", "quiesce"]


@dataclass(frozen=True)
class Place:
    """Tell the backend the GPUs the group claims here (none: all)."""

    group: str
    gpus: list[int]


@dataclass(frozen=True)
class ReadRoom:
    """Read what the device holds for the group (RoomRead): which jobs, and,
    ``shared``, what ``admit`` needs, what is free and each job's footprint."""

    group: str
    admit: str
    shared: bool


@dataclass(frozen=True)
class Act:
    """One step on one job's processes (ActionDone or ActionFailed follows)."""

    group: str
    job: str
    step: Step


@dataclass(frozen=True)
class Refuse:
    """The request ends in this failure: ``type`` (models.FailureKind's
    value, or another name), its message, the details the scheduler reads,
    and whether a retry could mend it."""

    type: str
    message: str
    details: tuple[str, ...] = ()
    non_retryable: bool = False


@dataclass(frozen=True)
class AnswerSwitch:
    """The switch went through: ``others``, the group's other jobs it dealt
    with; ``kept``, those left on the device beside the admitted one."""

    group: str
    admit: str
    others: list[str]
    kept: list[str]
    evicted: list[str]
    quiesce: bool = False


@dataclass(frozen=True)
class ReleaseProcesses:
    """Let the job's processes go (``restore``: its state back on the device
    where it fits; else it stays parked in host memory). ``leaver``: a job
    that left while parked, brought back now that the GPUs are free (a
    failure is only logged)."""

    group: str
    job: str
    restore: bool
    leaver: bool = False


@dataclass(frozen=True)
class AnswerRelease:
    """The release is answered; ``too_late_for``: the membership it was for
    had ended and a later one is here, so nothing was done (0: released)."""

    group: str
    job: str
    too_late_for: int = 0


@dataclass(frozen=True)
class MeetNewcomer:
    """A process of ``job`` registered while another job of its group holds
    the device: once the group's GPUs are held, tell the core (NewcomerTurn)."""

    group: str
    job: str


@dataclass(frozen=True)
class ReserveHost:
    group: str
    job: str
    bytes: int


@dataclass(frozen=True)
class FreeHost:
    group: str
    job: str
    bytes: int


@dataclass(frozen=True)
class EvictWhenGone:
    """The job's processes are gone while it is a member here: evict it
    from its group once they stay gone a while (workers/agent/exit_watch.py)."""

    group: str
    job: str


@dataclass(frozen=True)
class Persist:
    """What a restart keeps changed: save the record (NodeState.durable)."""


@dataclass(frozen=True)
class Log:
    message: str
    warning: bool = False


Command = (
    Place
    | ReadRoom
    | Act
    | Refuse
    | AnswerSwitch
    | ReleaseProcesses
    | AnswerRelease
    | MeetNewcomer
    | ReserveHost
    | FreeHost
    | EvictWhenGone
    | Persist
    | Log
)
