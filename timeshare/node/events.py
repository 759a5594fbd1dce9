"""What a node's core is told (NodeCore.handle): the scheduler's requests,
what the backend and the kernel read, and how each action the core asked
for ended. Each names what the core needs, nothing of Temporal or asyncio."""

from __future__ import annotations

from dataclasses import dataclass, field

from timeshare.models import BackendAction, DeviceBytes, SwitchInput


@dataclass(frozen=True)
class GpusClaimed:
    """A switch or a release of the group arrived, naming the GPUs its policy
    claims here (None: a release from before GPU claims, which names none);
    ``node``: the node a switch is for (another's claims nothing here)."""

    group: str
    gpus: list[int] | None
    node: str = ""


@dataclass(frozen=True)
class SwitchAsked:
    """The node's GPUs for the switch are held (one switch or release on a
    GPU at a time). ``co_residency``: the backend can keep jobs locked on
    the device beside another and knows how much memory is free."""

    request: SwitchInput
    co_residency: bool


@dataclass(frozen=True)
class RoomRead:
    """What the device holds for the group (ReadRoom asked): the jobs the
    backend sees on it, and, where co-residency may apply, what the admitted
    job will hold once restored, what is free, and each job's footprint
    there now, the admitted one's included (None: unknown)."""

    group: str
    seen: list[str]
    admission: DeviceBytes | None = None
    free: DeviceBytes | None = None
    footprints: dict[str, DeviceBytes | None] = field(default_factory=dict)


@dataclass(frozen=True)
class Failure:
    """How a backend call failed: its error's kind (the backend's exception
    class: BackendError, JobFailed, HookFailed, NoDeviceRoom), its message,
    and the job it names, if it names one."""

    error: str
    message: str
    job: str = ""


@dataclass(frozen=True)
class RoomUnread:
    """Reading the device failed."""

    group: str
    failure: Failure


@dataclass(frozen=True)
class ActionDone:
    group: str
    action: BackendAction


@dataclass(frozen=True)
class ActionFailed:
    """A backend action the core asked for failed (``step``: the Act's)."""

    group: str
    job: str
    step: str
    failure: Failure


@dataclass(frozen=True)
class ReleaseAsked:
    """The GPUs are held for the release of ``job``, which left its group
    (``incarnation``: the membership that ended; 0: whichever is here)."""

    group: str
    job: str
    gpus: list[int] | None = None
    incarnation: int = 0


@dataclass(frozen=True)
class ProcessesReleased:
    """The backend let the job's processes go (``restore``: as asked)."""

    group: str
    job: str
    restore: bool


@dataclass(frozen=True)
class ReleaseFailed:
    group: str
    job: str
    failure: Failure


@dataclass(frozen=True)
class ProcessRegistered:
    """A process of the job registered here; ``new``: one the table did not
    hold (a registration that comes again after an agent restart is not)."""

    group: str
    job: str
    new: bool


@dataclass(frozen=True)
class NewcomerTurn:
    """The GPUs are held to deal with a process that registered while
    another job of its group held the device."""

    group: str
    job: str


@dataclass(frozen=True)
class ProcessesExited:
    """Every process the job registered here has exited."""

    group: str
    job: str


@dataclass(frozen=True)
class HostAsked:
    """A checkpoint is about to move ``needed`` host bytes of the job's
    state (read by the backend, before it locks anything): the node has
    ``available`` (MemAvailable); the job's cgroup limit leaves ``room``
    (None: no limit found), as ``limit`` describes it; ``parked``: what the
    backend holds parked here already, in words."""

    group: str
    job: str
    needed: int
    available: int
    room: int | None = None
    limit: str = ""
    parked: str = ""


@dataclass(frozen=True)
class HostDone:
    """The checkpoint that held host memory ended (moved or not)."""

    group: str
    job: str


Event = (
    GpusClaimed
    | SwitchAsked
    | RoomRead
    | RoomUnread
    | ActionDone
    | ActionFailed
    | ReleaseAsked
    | ProcessesReleased
    | ReleaseFailed
    | ProcessRegistered
    | NewcomerTurn
    | ProcessesExited
    | HostAsked
    | HostDone
)
