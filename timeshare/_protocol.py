"""What the sync and asyncio clients share: defaults, request building and
response parsing. Neither client holds any logic beyond sending."""

from __future__ import annotations

import math
import os
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

from google.protobuf import json_format

from timeshare.errors import (
    DeadlineExceeded,
    FailedPrecondition,
    InvalidArgument,
    TimeshareError,
    Unavailable,
)
from timeshare.history import GroupHistory
from timeshare.models import GroupPolicy, GroupStatus, JobStatus, NodeRecord
from timeshare.names import check_name
from timeshare.v1 import timeshare_pb2 as pb

DEFAULT_ADDRESS = "localhost:50051"
# Acquire calls are retried on UNAVAILABLE (a gateway restart) with the same
# request id, so the job keeps its place in the queue.
RETRY_PAUSE_SECONDS = 0.5
# Yield and leave are idempotent on the server, so they are retried through a
# gateway or Temporal restart: this many attempts, RETRY_PAUSE_SECONDS apart.
IDEMPOTENT_ATTEMPTS = 120
# The gateway answers DEADLINE_EXCEEDED itself; the call's own deadline is a
# backstop a little later.
RPC_GRACE_SECONDS = 5.0
# A Join is idempotent on the server: one that the gateway refused because
# its Temporal or scheduler did not answer (a restart, a pause) is sent again
# for this long, as an acquire would be, before the job is told why.
JOIN_RETRY_SECONDS = 60.0
# A turn's watch that broke (a gateway restart) is opened again after this.
WATCH_RETRY_SECONDS = 0.5


def join_again(error: TimeshareError, started: float, now: float) -> bool:
    """Whether a Join that failed so is sent again (where no gateway answers,
    the job is told at once: the address is the likelier fault)."""
    return (
        isinstance(error, Unavailable) and error.from_gateway and now - started < JOIN_RETRY_SECONDS
    )


def resolve_address(address: str | None) -> str:
    return address or os.environ.get("TIMESHARE_ADDRESS") or DEFAULT_ADDRESS


def resolve_nodes(nodes: list[str] | None) -> list[str]:
    if nodes is None:
        from_env = os.environ.get("TIMESHARE_NODES", "")
        nodes = [n.strip() for n in from_env.split(",") if n.strip()]
    return [valid("node", n) for n in nodes]


def from_env(kind: str, value: str | None, variable: str) -> str:
    """A launcher (Kubernetes, Slurm) may name the group and job in the environment."""
    if value is None:
        value = os.environ.get(variable)
    if value is None:
        raise InvalidArgument(f"{kind}: none given; pass it or set {variable}")
    return value


def valid(kind: str, value: str) -> str:
    try:
        return check_name(kind, value)
    except ValueError as error:
        raise InvalidArgument(str(error)) from None


class AcquireDeadline:
    """How long an acquire, with its retries, may go on."""

    def __init__(self, timeout: float | None, now: float) -> None:
        self.at = None if timeout is None else now + timeout

    def rpc_timeout(self, now: float) -> float | None:
        return None if self.at is None else max(0.0, self.at - now) + RPC_GRACE_SECONDS

    def check_retry(self, job: str, now: float) -> None:
        if self.at is not None and now >= self.at:
            raise DeadlineExceeded(f"job {job!r} was not granted in time")


@dataclass
class Turn:
    """A granted turn: the job holds its group's GPUs until it yields."""

    epoch: int
    ticket: int
    waited_seconds: float
    switch_seconds: float
    granted_at: float
    phase: str = ""
    _yield_requested: bool = field(default=False, repr=False, compare=False)
    # The watch last said that every job waiting is a backfill job (and this
    # turn a regular job's): none of them goes before this job's next phase.
    _only_backfill_waiting: bool = field(default=False, repr=False, compare=False)

    @property
    def should_yield(self) -> bool:
        """The group asks for the GPUs back: others wait past this turn's limit,
        or a waiter outranks this job. Kept current while the turn is held;
        check it at a step boundary and yield there."""
        return self._yield_requested


class LeaseClock:
    """When a job must next renew its lease: within a third of lease_seconds
    while it holds the turn and others wait (its watch tells it), else within
    a third of idle_lease_seconds, counted from the last message it sent. An
    acquire in flight needs none (the gateway renews it while it waits). A
    group of an older scheduler (idle_lease_seconds 0) wants a heartbeat every
    third of lease_seconds, whatever happens."""

    def __init__(self, lease_seconds: float, idle_lease_seconds: float, now: float) -> None:
        self.lease_seconds = lease_seconds
        self.idle_lease_seconds = idle_lease_seconds
        self.last_sent = now
        self.contended = False
        self.acquiring = 0

    @property
    def legacy(self) -> bool:
        return self.idle_lease_seconds <= 0

    @property
    def interval(self) -> float:
        if self.legacy or self.contended:
            return max(0.2, self.lease_seconds / 3)
        return max(0.2, self.idle_lease_seconds / 3)

    def sent(self, now: float) -> None:
        self.last_sent = max(self.last_sent, now)

    def due_in(self, now: float) -> float:
        """Seconds until the next renewal is due (0: now)."""
        if self.acquiring and not self.legacy:
            return self.interval
        return max(0.0, self.last_sent + self.interval - now)


def apply_notice(turn: Turn, lease: LeaseClock, notice: pb.TurnNotice) -> tuple[bool, bool]:
    """Take in what the turn's watch said. Returns (the turn has just been
    asked to yield, the job has just become contended: renew now)."""
    asked = notice.should_yield and not turn.should_yield
    turn._yield_requested = turn._yield_requested or notice.should_yield
    turn._only_backfill_waiting = notice.only_backfill_waiting
    contended = notice.holding and notice.waiting > 0
    became = contended and not lease.contended
    lease.contended = contended
    return asked, became


def may_keep_turn(turn: Turn | None, lease: LeaseClock, heard: bool) -> bool:
    """Whether Job.next_turn_nowait keeps the turn without waiting for an
    answer: only once the turn's watch has spoken (``heard``), and while what
    it last said is that nobody waits but backfill jobs (which never go before
    a regular job's next phase) and nobody asks for the turn back. Otherwise
    it waits for next_turn's answer, which lets others go first."""
    if not heard or turn is None or turn.should_yield:
        return False
    return not lease.contended or turn._only_backfill_waiting


class GroupMember(Protocol):
    @property
    def group(self) -> str: ...

    @property
    def name(self) -> str: ...


Member = TypeVar("Member", bound=GroupMember)


def acquisition_order(jobs: Sequence[Member]) -> list[Member]:
    """The one order every caller takes several groups in (by group name), so
    that no two callers can each hold a group the other waits for."""
    groups = [job.group for job in jobs]
    if not jobs:
        raise InvalidArgument("acquire_all: no jobs given")
    if len(set(groups)) != len(groups):
        raise InvalidArgument(
            f"acquire_all: one job per group (got groups {groups}): a job waiting for "
            "a group another of the caller's jobs holds would wait forever"
        )
    return sorted(jobs, key=lambda job: job.group)


@dataclass
class JobRef:
    group: str
    job: str
    token: str
    nodes: list[str]
    lease_seconds: float = 30.0
    epoch: int | None = None
    idle_lease_seconds: float = 0.0
    backfill: bool = False

    @property
    def heartbeat_seconds(self) -> float:
        # Three beats per lease: one lost beat never costs the job its place.
        return max(0.2, self.lease_seconds / 3)

    def acquire_request(self, timeout: float | None, phase: str = "") -> pb.AcquireRequest:
        if self.epoch is not None:
            raise FailedPrecondition(
                f"job {self.job!r} already holds the turn (epoch {self.epoch}); yield it first"
            )
        return self._ask(timeout, phase, 0)

    def next_turn_request(self, timeout: float | None, phase: str = "") -> pb.AcquireRequest:
        """An acquire that gives back the turn held, in the same message."""
        if self.epoch is None:
            raise FailedPrecondition(
                f"job {self.job!r} does not hold the turn; acquire it instead of next_turn"
            )
        return self._ask(timeout, phase, self.epoch)

    def _ask(self, timeout: float | None, phase: str, yield_epoch: int) -> pb.AcquireRequest:
        if timeout is not None and (math.isnan(timeout) or timeout < 0):
            raise InvalidArgument(f"timeout must be a positive number of seconds, got {timeout}")
        return pb.AcquireRequest(
            group=self.group,
            job=self.job,
            job_token=self.token,
            request_id=uuid.uuid4().hex,
            timeout_seconds=timeout or 0.0,
            phase=phase,
            yield_epoch=yield_epoch,
        )

    def granted(self, response: pb.AcquireResponse) -> Turn:
        self.epoch = response.epoch
        return Turn(
            epoch=response.epoch,
            ticket=response.ticket,
            waited_seconds=response.waited_seconds,
            switch_seconds=response.switch_seconds,
            granted_at=response.granted_at,
            phase=response.phase,
        )

    def watch_request(self, turn: Turn) -> pb.WatchTurnRequest:
        return pb.WatchTurnRequest(
            group=self.group, job=self.job, job_token=self.token, epoch=turn.epoch,
            backfill=self.backfill,
        )  # fmt: skip

    def keep_turn_request(self, phase: str = "") -> pb.KeepTurnRequest:
        if self.epoch is None:
            raise FailedPrecondition(
                f"job {self.job!r} does not hold the turn; acquire it instead of next_turn_nowait"
            )
        return pb.KeepTurnRequest(
            group=self.group, job=self.job, job_token=self.token, epoch=self.epoch, phase=phase
        )

    def yield_request(self) -> pb.YieldRequest:
        if self.epoch is None:
            raise FailedPrecondition(f"job {self.job!r} does not hold the turn; nothing to yield")
        return pb.YieldRequest(
            group=self.group, job=self.job, job_token=self.token, epoch=self.epoch
        )

    def yielded(self) -> None:
        self.epoch = None

    def heartbeat_request(self) -> pb.HeartbeatRequest:
        return pb.HeartbeatRequest(group=self.group, job=self.job, job_token=self.token)

    def leave_request(self) -> pb.LeaveRequest:
        return pb.LeaveRequest(group=self.group, job=self.job, job_token=self.token)


class JobIdentity:
    """What both job handles (blocking and asyncio) say about themselves."""

    ref: JobRef

    @property
    def group(self) -> str:
        return self.ref.group

    @property
    def name(self) -> str:
        return self.ref.job

    @property
    def nodes(self) -> list[str]:
        return self.ref.nodes

    @property
    def token(self) -> str:
        """The job's token from its Join: what the job's processes present to
        their node agents (hand it to workers as TIMESHARE_JOB_TOKEN). A secret:
        whoever holds it may act as the job."""
        return self.ref.token


def join_request(
    group: str | None,
    job: str | None,
    nodes: list[str] | None,
    policy: GroupPolicy | None,
    weight: float = 1.0,
    priority: int = 0,
    backfill: bool = False,
) -> pb.JoinRequest:
    if math.isnan(weight) or not 0 < weight <= 1000:
        raise InvalidArgument(f"weight must be above 0 and at most 1000, got {weight}")
    return pb.JoinRequest(
        group=valid("group", from_env("group", group, "TIMESHARE_GROUP")),
        job=valid("job", from_env("job", job, "TIMESHARE_JOB")),
        nodes=resolve_nodes(nodes),
        policy=pb.GroupPolicy(**policy.model_dump()) if policy is not None else None,
        weight=weight,
        priority=priority,
        backfill=backfill,
    )


def job_ref(request: pb.JoinRequest, response: pb.JoinResponse) -> JobRef:
    return JobRef(
        group=request.group,
        job=request.job,
        token=response.job_token,
        nodes=list(response.nodes),
        lease_seconds=response.lease_seconds or 30.0,
        idle_lease_seconds=response.idle_lease_seconds,
        backfill=request.backfill,
    )


def evict_request(group: str, job: str, reason: str) -> pb.EvictRequest:
    return pb.EvictRequest(group=valid("group", group), job=valid("job", job), reason=reason)


def pause_request(group: str, paused: bool) -> pb.PauseRequest:
    return pb.PauseRequest(group=valid("group", group), paused=paused)


def drain_request(node: str, drained: bool) -> pb.DrainRequest:
    return pb.DrainRequest(node=valid("node", node), drained=drained)


def group_history(message: pb.GroupHistory) -> GroupHistory:
    fields = json_format.MessageToDict(
        message, preserving_proto_field_name=True, always_print_fields_with_no_presence=True
    )
    return GroupHistory.model_validate(fields)


def group_status(message: pb.GroupStatus) -> GroupStatus:
    return GroupStatus(
        group=message.group,
        state=message.state,  # type: ignore[arg-type]  # validated by pydantic
        holder=message.holder,
        epoch=message.epoch,
        queue=list(message.queue),
        jobs=[
            JobStatus(
                job=j.job,
                nodes=list(j.nodes),
                turns=j.turns,
                waited_seconds=j.waited_seconds,
                held_seconds=j.held_seconds,
                preempted=j.preempted,
                last_seen=j.last_seen,
                weight=j.weight or 1.0,
                priority=j.priority,
                share_seconds=j.share_seconds,
                backfill=j.backfill,
            )
            for j in message.jobs
        ],
        resident={r.node: r.job for r in message.residency},
        switches=message.switches,
        grants=message.grants,
        switch_seconds_total=message.switch_seconds_total,
        degraded_cause=message.degraded_cause,
        paused=message.paused,
        drained=list(message.drained),
        policy=GroupPolicy.model_validate(policy_fields(message.policy)),
        preemptions=message.preemptions,
        evictions=message.evictions,
        holder_phase=message.holder_phase,
        yield_requested=message.yield_requested,
    )


def policy_fields(message: pb.GroupPolicy) -> dict[str, Any]:
    """The policy fields set on the wire (maps as dicts, repeated ones as lists)."""
    fields: dict[str, Any] = {}
    for descriptor, value in message.ListFields():
        if isinstance(value, (str, int, float)):
            fields[descriptor.name] = value
        elif hasattr(value, "keys"):
            fields[descriptor.name] = dict(value)
        else:
            fields[descriptor.name] = list(value)
    return fields


def node_record(message: pb.NodeStatus) -> NodeRecord:
    return NodeRecord(
        node=message.node,
        backend=message.backend,
        simulated=message.simulated,
        alive=message.alive,
        last_seen=message.last_seen,
        gpus=list(message.gpus),
        drained=message.drained,
        notes=list(message.notes),
    )
