"""What the scheduling core is told: one typed event per message a job or an
operator sends, per timer, and per outcome of a switch or a release
(GroupCore.handle). Each names what the core needs, nothing of Temporal.

A message is one shape from the gateway to the core: the group workflow's
updates take these events as their arguments (validated where they are
made, and where Temporal decodes them), and hand them to the core as they
are. Their fields keep the names the updates' arguments had before they were
the events, so that every recorded history's payloads still decode."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from pydantic import ConfigDict, Field
from pydantic.dataclasses import dataclass as message

from timeshare.models import PRIORITY_LIMIT, FailureKind
from timeshare.scheduling.state import StoredSwitch

if TYPE_CHECKING:
    # Its facts are these events: imported for the annotation alone.
    from timeshare.scheduling.healing import HealInput

# Unknown fields (a newer sender's) are ignored, never refused.
_MESSAGE = ConfigDict(extra="ignore")


@message(frozen=True, config=_MESSAGE)
class Join:
    job: str
    nodes: list[str]
    token_hash: str
    # Fair share counts GPU time divided by weight; priority goes first.
    weight: float = Field(default=1.0, gt=0.0, le=1000.0)
    priority: int = Field(default=0, ge=-PRIORITY_LIMIT, le=PRIORITY_LIMIT)
    # A backfill job runs only while no regular job holds or waits for the GPU.
    backfill: bool = False


@message(frozen=True, config=_MESSAGE)
class Acquire:
    job: str
    token_hash: str
    request_id: str
    # The call now waiting for the request (a retry of it takes over).
    call_id: str = ""
    # W3C trace context of the caller (traceparent, tracestate), if traced.
    trace_context: dict[str, str] = field(default_factory=dict)
    # What the job will do with the turn ("rollout", "train"): recorded, and
    # weighed by the group's phase_priority.
    phase: str = ""
    # The epoch of the turn this same message gives back first (0: none).
    yield_epoch: int = 0
    # How long the workflow keeps the request waiting (0: until granted);
    # the core never reads it.
    timeout_seconds: float = 0.0


@dataclass(frozen=True)
class AcquireTimedOut:
    """A waiting acquire's own timeout ran out: it is withdrawn."""

    job: str
    request_id: str
    call_id: str = ""


@message(frozen=True, config=_MESSAGE)
class CancelAcquire:
    job: str
    token_hash: str
    request_id: str
    call_id: str = ""


@message(frozen=True, config=_MESSAGE)
class Yield:
    job: str
    token_hash: str
    epoch: int


@message(frozen=True, config=_MESSAGE)
class KeepTurn:
    job: str
    token_hash: str
    epoch: int
    phase: str = ""


@message(frozen=True, config=_MESSAGE)
class Heartbeat:
    job: str
    token_hash: str


@message(frozen=True, config=_MESSAGE)
class Leave:
    job: str
    token_hash: str


@message(frozen=True, config=_MESSAGE)
class Evict:
    job: str
    reason: str


@message(frozen=True, config=_MESSAGE)
class Pause:
    paused: bool


@message(frozen=True, config=_MESSAGE)
class Drain:
    node: str
    drained: bool


@dataclass(frozen=True)
class RunStarted:
    """A run of the group's workflow begins: a new group, or one continued
    as new (releases it carries are started again)."""


@dataclass(frozen=True)
class Healed:
    """The run was started by the scheduler's healer after the last one kept
    failing its workflow task: its state is brought up to what the facts
    say, before any message reaches it (scheduling/healing.py)."""

    rebuild: HealInput


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
    ``kind`` says what failed (models.FailureKind); ``job``, whose state
    could not leave or failed for good ("" where the node could not say)."""

    node: str
    cause: str
    kind: FailureKind
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
    | Healed
    | Tick
    | SwitchAttempted
    | SwitchPaused
    | ReleaseEnded
)
