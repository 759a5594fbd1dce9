"""What the scheduling core is told: one typed event per message a job or an
operator sends, per timer, and per outcome of a switch or a release
(GroupCore.handle). Each names what the core needs, nothing of Temporal."""

from __future__ import annotations

from dataclasses import dataclass, field

from timeshare.scheduling.state import StoredSwitch


@dataclass(frozen=True)
class Join:
    job: str
    nodes: list[str]
    token_hash: str
    weight: float = 1.0
    priority: int = 0
    backfill: bool = False


@dataclass(frozen=True)
class Acquire:
    job: str
    token_hash: str
    request_id: str
    # The call now waiting for the request (a retry of it takes over).
    call_id: str = ""
    trace_context: dict[str, str] = field(default_factory=dict)
    phase: str = ""
    # The epoch of the turn this same message gives back first (0: none).
    yield_epoch: int = 0


@dataclass(frozen=True)
class AcquireTimedOut:
    """A waiting acquire's own timeout ran out: it is withdrawn."""

    job: str
    request_id: str
    call_id: str = ""


@dataclass(frozen=True)
class CancelAcquire:
    job: str
    token_hash: str
    request_id: str
    call_id: str = ""


@dataclass(frozen=True)
class Yield:
    job: str
    token_hash: str
    epoch: int


@dataclass(frozen=True)
class KeepTurn:
    job: str
    token_hash: str
    epoch: int
    phase: str = ""


@dataclass(frozen=True)
class Heartbeat:
    job: str
    token_hash: str


@dataclass(frozen=True)
class Leave:
    job: str
    token_hash: str


@dataclass(frozen=True)
class Evict:
    job: str
    reason: str


@dataclass(frozen=True)
class Pause:
    paused: bool


@dataclass(frozen=True)
class Drain:
    node: str
    drained: bool


@dataclass(frozen=True)
class RunStarted:
    """A run of the group's workflow begins: a new group, or one continued
    as new (releases it carries are started again)."""


@dataclass(frozen=True)
class Tick:
    """The group looks at itself: after a message or when a timer rang.
    ``continue_as_new_suggested``: Temporal finds the history long."""

    continue_as_new_suggested: bool = False


@dataclass(frozen=True)
class NodeSwitched:
    """A node's part of a switch went through."""

    node: str
    # Jobs whose processes on the node have exited.
    gone: list[str] = field(default_factory=list)
    # Whether it brought state back from host memory.
    restored: bool = False


@dataclass(frozen=True)
class NodeFailed:
    """A node's part of a switch failed, after the activity's own retries.
    ``kind`` says what failed: "checkpoint" (``job``'s state could not leave;
    "" where the node could not say whose), "restore" (the admitted job's
    state could not come back), "job-failed" (``job``'s CUDA state is FAILED,
    terminal), "hook" (``job``'s own workload hooks failed its checkpoint),
    "unreachable" (the agent did not answer: the outcome is unknown),
    "other" (anything else the agent refused)."""

    node: str
    cause: str
    kind: str
    job: str = ""


@dataclass(frozen=True)
class SwitchAttempted:
    """Every node of an attempt answered (or a quiesce failed: ``done`` empty)."""

    done: list[NodeSwitched]
    failed: list[NodeFailed]
    # False where the attempt stopped at its quiesce: nothing moved.
    moved: bool = True
    # Each node's part, for the group's history of switches.
    records: list[StoredSwitch] = field(default_factory=list)


@dataclass(frozen=True)
class SwitchPaused:
    """The pause after a failed attempt ended (its time, or the plan fell)."""


@dataclass(frozen=True)
class ReleaseEnded:
    """A node's agent let a job that left go (or could not be reached);
    ``incarnation`` as the Release that asked for it."""

    job: str
    node: str
    incarnation: int = 0


Message = Join | Acquire | CancelAcquire | Yield | KeepTurn | Heartbeat | Leave
Event = (
    Message
    | AcquireTimedOut
    | Evict
    | Pause
    | Drain
    | RunStarted
    | Tick
    | SwitchAttempted
    | SwitchPaused
    | ReleaseEnded
)
