"""Pydantic models that cross a process boundary: workflow and activity
arguments and results, and the status shown to users.

Each workflow message and activity takes exactly one of these, so fields can
be added later without breaking running workflow histories.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Literal

from pydantic import BaseModel, Field, field_validator, model_validator

from timeshare.scheduling.watch import WatchRecord

GroupStateName = Literal["idle", "held", "switching", "degraded", "paused"]
# auto: a job that yields stays on the device, locked, while the next job's
# state fits beside it (the node agent decides, from its backend's memory
# figures); off: every switch checkpoints the job that yielded.
CoResidency = Literal["auto", "off"]
# fair: the next turn goes to the waiter with the least GPU time for its weight;
# fifo: to the first that asked. Either within a priority (see docs/guide/policies.md).
Ordering = Literal["fair", "fifo"]
Prefetch = Literal["auto", "off"]
# Per-device byte counts, keyed by device name ("gpu0", "sim-gpu-0").
DeviceBytes = dict[str, int]
PHASE_MAX_CHARS = 63
PRIORITY_LIMIT = 1000
MAX_GPUS_PER_NODE = 256


class GroupPolicy(BaseModel):
    """Per-group settings, fixed when the group is created by its first Join."""

    # A holder that others wait for and that sends nothing (the client's
    # renewals included) for this long is evicted, and the turn moves on.
    lease_seconds: float = Field(default=30.0, ge=1.0, le=86400.0)
    # Any other member (idle, waiting, or holding with nobody waiting) that
    # sends nothing for this long is dropped; the client renews at a third.
    idle_lease_seconds: float = Field(default=3600.0, ge=1.0, le=7 * 86400.0)
    # With others waiting, a turn longer than this is asked to yield; 0 = no limit.
    max_turn_seconds: float = Field(default=0.0, ge=0.0, le=7 * 86400.0)
    # How long a holder asked to yield has before it is preempted.
    preempt_grace_seconds: float = Field(default=10.0, ge=0.0, le=86400.0)
    # How long a node agent may take to pick up a switch, or stay silent during one.
    agent_timeout_seconds: float = Field(default=30.0, ge=1.0, le=3600.0)
    # Continue as new after this many grants even if Temporal does not ask; 0 = only when asked.
    continue_as_new_every: int = Field(default=0, ge=0)
    co_residency: CoResidency = "auto"
    # "auto": while the GPUs sit idle, the job expected to ask next is
    # brought onto them ahead of its request (see timeshare/scheduling/prefetch.py).
    prefetch: Prefetch = "auto"
    ordering: Ordering = "fair"
    # Fair share remembers at most this much unused GPU time (per unit of
    # weight) for a job that comes back after a while away.
    fair_credit_seconds: float = Field(default=60.0, ge=0.0, le=86400.0)
    # Waiting this long raises a waiter's priority by one, again and again
    # (0: never), so no one starves behind higher priorities.
    aging_seconds: float = Field(default=0.0, ge=0.0, le=7 * 86400.0)
    # Added to the job's priority for a request of that phase ("train": 1).
    phase_priority: dict[str, int] = Field(default_factory=dict, max_length=64)
    # A waiter that outranks the holder asks it to yield at once, and after
    # this long preempts it (0: never).
    preempt_lower_after_seconds: float = Field(default=0.0, ge=0.0, le=86400.0)
    # A backfill job holding the GPU is asked to yield as soon as a regular
    # job asks, and preempted (or, where only its own hooks could move its
    # state, evicted) if it still holds this long after.
    backfill_grace_seconds: float = Field(default=10.0, ge=0.0, le=86400.0)
    # A switch that keeps failing is given up after this long: the job whose
    # state cannot be moved is evicted (its processes run again, never
    # killed), and the waiting job gets the GPU if it fits, else an error
    # naming the cause. Never forever: a waiter always hears an answer.
    switch_give_up_seconds: float = Field(default=120.0, ge=1.0, le=86400.0)
    # With ordering "fair": when a job behind its share yields while a job
    # ahead of it waits, the turn is held open for the yielder this long at
    # most (sized from how soon it asked again before), so that a job with
    # short turns is not handed over after every one of them (0: never).
    fair_anticipation_seconds: float = Field(default=0.03, ge=0.0, le=1.0)
    # A turn that moves state is weighed against what its switches cost: a
    # backfill job is granted only a gap longer than its switches there and
    # back, and anticipation holds the turn open no longer than a switch
    # would take (False: granted whatever the switches cost).
    switch_cost_aware: bool = True
    # One switch on a node (checkpoint plus restore), in seconds, as the
    # operator knows it: used instead of the measured costs (None: measured).
    switch_cost_seconds: float | None = Field(default=None, ge=0.0, le=86400.0)

    # The GPU indices the group's jobs use on each of their nodes; empty: all
    # of them. A GPU belongs to one group at a time (checked at join).
    gpus: list[int] = Field(default_factory=list, max_length=MAX_GPUS_PER_NODE)

    @field_validator("gpus")
    @classmethod
    def _distinct_indices(cls, gpus: list[int]) -> list[int]:
        if any(not 0 <= gpu < MAX_GPUS_PER_NODE for gpu in gpus):
            raise ValueError(f"GPU indices run from 0 to {MAX_GPUS_PER_NODE - 1}")
        if len(set(gpus)) != len(gpus):
            raise ValueError(f"{gpus} names a GPU twice")
        return sorted(gpus)

    @model_validator(mode="after")
    def _consistent(self) -> GroupPolicy:
        if self.idle_lease_seconds < self.lease_seconds:
            raise ValueError("idle_lease_seconds must be at least lease_seconds")
        for phase, bonus in self.phase_priority.items():
            check_phase(phase)
            if abs(bonus) > PRIORITY_LIMIT:
                raise ValueError(f"phase_priority[{phase!r}] must be within ±{PRIORITY_LIMIT}")
        return self


def check_phase(phase: str) -> str:
    """A phase is free text, but short and printable (it names metrics series)."""
    if len(phase) > PHASE_MAX_CHARS or not phase.isprintable():
        raise ValueError(f"phase: at most {PHASE_MAX_CHARS} printable characters, got {phase!r}")
    return phase


class JoinOutput(BaseModel):
    created: bool
    nodes: list[str]
    lease_seconds: float = 30.0
    idle_lease_seconds: float = 0.0


class Grant(BaseModel):
    """One turn: what an acquire returns."""

    job: str
    request_id: str
    epoch: int
    ticket: int
    granted_at: float
    waited_seconds: float
    switch_seconds: float
    # A preempted turn resumed: the epoch the job was first granted (and yields with).
    resumes_epoch: int = 0
    # The job's state was brought back from host memory for this turn.
    context_restored: bool = False
    phase: str = ""
    # The holder kept the turn into a next phase (Job.next_turn_nowait) where
    # a next_turn would have let others go first: asked to yield from then.
    kept_past_others_at: float = 0.0
    # The epoch its job is told, yields with and is watched by: a resumed
    # turn keeps its first (set by the scheduling core, StoredGrant).
    told_epoch: int = 0


class YieldOutput(BaseModel):
    held_seconds: float
    # The phase of the turn given back.
    phase: str = ""


class KeepTurnOutput(BaseModel):
    grant: Grant
    # A next_turn would have let others go first: the group asks for the
    # turn back now, and they go first after this phase.
    asked_to_yield: bool = False
    # The phase that ended, as a yield reports its turn.
    ended: YieldOutput


class PublishedTurn(BaseModel):
    """What the group published outside its workflow as it made a grant (its
    queue depth and its watch record): where the gateway that delivers the
    grant serves that turn's watch, its first notice needs no read of the group."""

    waiting: int
    record: WatchRecord


class AcquireResult(BaseModel):
    """An acquire either granted, or still waiting and to be asked again: waits
    are bounded so no update stays open across continue-as-new."""

    grant: Grant | None = None
    # The turn the same message gave back first (the acquire's yield_epoch),
    # in the answer of the call that gave it back.
    yielded: YieldOutput | None = None
    # With a grant made before this answer (a waiter's), what the group then
    # published; None for a grant made in this message's own task.
    published: PublishedTurn | None = None


class JobToken(BaseModel):
    """A job's token, hashed: what a node agent asks its group about
    (GroupWorkflow.token_matches) before a process joins the job's switches."""

    job: str
    token_hash: str


class TokenCheck(BaseModel):
    """Whether a job's token hash is the one on the group's record: how a node
    agent checks a process that asks to join the job's switches."""

    matches: bool
    # Why not, in words (the job is unknown, was evicted, the token is wrong).
    reason: str = ""
    # Whether the job is in the group now, whatever the token.
    member: bool = False


class HeartbeatOutput(BaseModel):
    holding: bool
    epoch: int
    waiting: int
    should_yield: bool = False
    preempted: bool = False
    lease_seconds: float = 30.0


class JobStatus(BaseModel):
    job: str
    nodes: list[str]
    turns: int
    waited_seconds: float
    held_seconds: float
    preempted: bool = False
    last_seen: float = 0.0
    weight: float = 1.0
    priority: int = 0
    # GPU-seconds divided by weight, as fair share counts them.
    share_seconds: float = 0.0
    backfill: bool = False


class GroupStatus(BaseModel):
    group: str
    state: GroupStateName
    holder: str = ""
    epoch: int = 0
    queue: list[str] = Field(default_factory=list)
    jobs: list[JobStatus] = Field(default_factory=list)
    resident: dict[str, str] = Field(default_factory=dict)
    switches: int = 0
    grants: int = 0
    switch_seconds_total: float = 0.0
    degraded_cause: str = ""
    paused: bool = False
    drained: list[str] = Field(default_factory=list)
    policy: GroupPolicy = Field(default_factory=GroupPolicy)
    preemptions: int = 0
    evictions: int = 0
    # Runs of the group's workflow so far (continue-as-new starts a new one).
    runs: int = 1
    # Times the scheduler rebuilt the group after its workflow task kept
    # failing (docs/reliability.md, "A group that cannot be replayed").
    heals: int = 0
    # When the group entered its current state (seconds since the Unix epoch).
    state_since: float = 0.0
    # The job a switch under way is bringing in.
    switching_to: str = ""
    # The phase the holder named for its turn, and whether it is asked to yield.
    holder_phase: str = ""
    yield_requested: bool = False


class NodeMove(BaseModel):
    """What one node must do for a switch: evict these jobs, then admit one
    (none where ``admit`` is empty: the node only sees a job leave)."""

    node: str
    admit: str
    evict: list[str] = Field(default_factory=list)


# The switch activity's phases. A job that leaves several nodes is first
# stopped on all of them ("quiesce": every rank's hooks called and every rank
# locked, state still on the device), and only then checkpointed anywhere.
SwitchPhase = Literal["switch", "quiesce"]


class SwitchInput(BaseModel):
    group: str
    epoch: int
    move: NodeMove
    # The plan's number in its group: an agent refuses one older than it ran.
    plan: int = 0
    # The trace context of the acquire this switch serves.
    trace_context: dict[str, str] = Field(default_factory=dict)
    # The group's policy; "off" for a scheduler that predates it.
    co_residency: CoResidency = "off"
    phase: SwitchPhase = "switch"
    # The GPUs the group's policy claims on each node (empty: all).
    gpus: list[int] = Field(default_factory=list)
    # The membership (incarnation) of each member job the move names: a job
    # that left and joined again is a member again, whatever the release of
    # its earlier membership does or did.
    incarnations: dict[str, int] = Field(default_factory=dict)


class FailureKind(StrEnum):
    """What failed in a node's part of a switch: the agent gives its switch
    activity's failure this type, the workflow reads it back into the
    event it hands the core (scheduling/events.NodeFailed), and the core
    decides by it. The values are the types written in histories."""

    # Another job's state could not leave the device (stay degraded and
    # retry); the job is named in the failure's details where known.
    CHECKPOINT = "CheckpointFailed"
    # The admitted job's state could not come back: its acquire is aborted.
    RESTORE = "RestoreFailed"
    # A process of the job named in the details is in the driver's terminal
    # FAILED state: the workflow evicts that job (non-retryable).
    JOB_FAILED = "JobFailed"
    # The workload hooks of the job named in the details failed or hung while
    # its state was to leave the device (retryable): once the retries are
    # spent, the workflow evicts that job, and the switch goes on without it.
    HOOK = "HookFailed"
    # The agent did not answer in time (an activity timeout; never raised).
    UNREACHABLE = "Unreachable"
    # Anything else the agent refused.
    OTHER = "Other"

    @classmethod
    def of(cls, failure_type: str | None) -> FailureKind:
        try:
            return cls(failure_type or cls.OTHER)
        except ValueError:
            return cls.OTHER


# The second detail of a non-retryable RESTORE failure (the first is the job):
# the job's parked state does not fit in the device memory free on the node,
# so nothing was restored; it stays parked and restorable. Not retried: a
# restore the driver fails for lack of memory can never be retried on driver
# 580 (NVIDIA/cuda-checkpoint#44), so the room is checked first.
NO_DEVICE_ROOM = "NoDeviceRoom"
# How a checkpoint refused for want of host memory to park the job in
# begins: the cause a failing switch names (docs/reliability.md).
NOT_ENOUGH_HOST_MEMORY = "not enough host memory to park the job"

ActionName = Literal["checkpoint", "restore", "lock", "unlock", "noop"]


class RankAction(BaseModel):
    """What one process (a rank) of a job went through in an action."""

    pid: int
    action: ActionName
    # Device bytes moved; None where NVML could not tell (MIG, no accounting).
    bytes: int | None = 0
    seconds: float = 0.0


class BackendAction(BaseModel):
    job: str
    # lock / unlock: the job stopped or resumed running with its state left
    # on the device (co-residency); checkpoint / restore moved it.
    action: ActionName
    bytes: int = 0
    seconds: float = 0.0
    # The processes acted on.
    pids: list[int] = Field(default_factory=list)
    # Per process, where the backend moves each one on its own (the CUDA
    # backends); empty in histories written before it existed.
    ranks: list[RankAction] = Field(default_factory=list)


class ReleaseInput(BaseModel):
    """The ``release`` activity: the job left its group; let its processes on
    this node go (thawed, restored where it fits, never left stopped)."""

    group: str
    job: str
    reason: str = ""
    gpus: list[int] = Field(default_factory=list)
    # The membership of the job that ended (0: any; a scheduler from before
    # memberships were counted): an agent that has seen a later one since
    # (SwitchInput.incarnations) leaves the job's processes to it.
    incarnation: int = 0


class ReleaseOutput(BaseModel):
    node: str
    job: str
    # Processes that run again with their state on the device.
    running: list[int] = Field(default_factory=list)
    # Processes left checkpointed (no room on the device) but not stopped:
    # their CUDA calls block until they are killed.
    checkpointed: list[int] = Field(default_factory=list)
    # Processes in the driver's FAILED state: CUDA is unusable there.
    failed: list[int] = Field(default_factory=list)
    summary: str = ""


class SwitchOutput(BaseModel):
    node: str
    backend: str
    actions: list[BackendAction] = Field(default_factory=list)
    seconds: float = 0.0
    # Jobs whose registered processes on this node have all exited: the
    # scheduler drops them instead of switching them in again and again.
    gone: list[str] = Field(default_factory=list)
    # Jobs whose state stays on this node's device, locked, beside the admitted one.
    co_resident: list[str] = Field(default_factory=list)


class NodeInfo(BaseModel):
    node: str
    backend: str
    simulated: bool
    gpus: list[str] = Field(default_factory=list)
    # What the agent wants operators to know (co-residency off for a job, and why).
    notes: list[str] = Field(default_factory=list)


class NodeRecord(NodeInfo):
    alive: bool = True
    last_seen: float = 0.0
    drained: bool = False
