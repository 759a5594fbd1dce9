"""The lock queue of one group: plain data in, decisions out.

This module imports nothing from Temporal and does no I/O; time is always
passed in. GroupWorkflow feeds it every message and carries out the switches
it plans, so every scheduling rule lives here and is tested here.

Rules:
- at most one job holds the turn; the turn is named by a growing epoch;
- grants follow arrival order (tickets), head of the queue first;
- a job is granted only after every other job's state has left every node it
  needs: the planned switch evicts the resident job and admits the next one,
  and the grant happens only when every node has reported;
- when the next job is already resident everywhere it runs, the grant is
  immediate and no node is touched (the lazy, "deferred snapshot" path).
"""

from __future__ import annotations

import hmac
from typing import Literal

from pydantic import BaseModel, Field

from timeshare.models import (
    Grant,
    GroupStateName,
    GroupStatus,
    HeartbeatOutput,
    JobStatus,
    NodeMove,
)

ErrorCode = Literal[
    "INVALID_ARGUMENT",
    "NOT_FOUND",
    "UNAUTHENTICATED",
    "FAILED_PRECONDITION",
    "RESOURCE_EXHAUSTED",
]

MAX_JOBS_PER_GROUP = 64
MAX_NODES_PER_JOB = 256


class QueueError(Exception):
    """A message the queue refuses; ``code`` is the gRPC status name to report."""

    def __init__(self, code: ErrorCode, message: str) -> None:
        super().__init__(message)
        self.code: ErrorCode = code
        self.message = message


class JobEntry(BaseModel):
    nodes: list[str]
    token_hash: str
    joined_at: float
    last_seen: float
    turns: int = 0
    waited_seconds: float = 0.0
    held_seconds: float = 0.0


class Waiter(BaseModel):
    job: str
    request_id: str
    ticket: int
    since: float


class SwitchPlan(BaseModel):
    waiter: Waiter
    epoch: int
    moves: list[NodeMove]
    started_at: float


class GroupState(BaseModel):
    """Everything the scheduler knows about a group; carried across continue-as-new."""

    group: str
    jobs: dict[str, JobEntry] = Field(default_factory=dict)
    queue: list[Waiter] = Field(default_factory=list)
    turn: Grant | None = None
    epoch: int = 0
    next_ticket: int = 1
    resident: dict[str, str] = Field(default_factory=dict)
    switching: SwitchPlan | None = None
    degraded_cause: str = ""
    grants: int = 0
    switches: int = 0
    switch_seconds_total: float = 0.0


class LockQueue:
    """Decisions over a GroupState. Every method either changes the state
    consistently or raises QueueError and changes nothing."""

    def __init__(self, state: GroupState) -> None:
        self.state = state

    # -- membership -------------------------------------------------------

    def join(self, job: str, nodes: list[str], token_hash: str, now: float) -> bool:
        """Add or refresh a job; returns True when the job is new."""
        if not nodes:
            raise QueueError("INVALID_ARGUMENT", f"job {job!r} names no nodes")
        if len(nodes) > MAX_NODES_PER_JOB:
            raise QueueError(
                "INVALID_ARGUMENT", f"nodes: at most {MAX_NODES_PER_JOB} per job, got {len(nodes)}"
            )
        if len(set(nodes)) != len(nodes):
            raise QueueError("INVALID_ARGUMENT", f"nodes: {nodes} names a node twice")
        entry = self.state.jobs.get(job)
        if entry is None:
            if len(self.state.jobs) >= MAX_JOBS_PER_GROUP:
                raise QueueError(
                    "RESOURCE_EXHAUSTED",
                    f"group {self.state.group!r} already has {MAX_JOBS_PER_GROUP} jobs",
                )
            self.state.jobs[job] = JobEntry(
                nodes=list(nodes), token_hash=token_hash, joined_at=now, last_seen=now
            )
            return True
        if sorted(entry.nodes) != sorted(nodes) and self._is_active(job):
            raise QueueError(
                "FAILED_PRECONDITION",
                f"job {job!r} holds or waits for the turn; yield before changing its nodes",
            )
        entry.nodes = list(nodes)
        entry.token_hash = token_hash
        entry.last_seen = now
        return False

    def authenticate(self, job: str, token_hash: str) -> JobEntry:
        entry = self.state.jobs.get(job)
        if entry is None:
            raise QueueError(
                "NOT_FOUND", f"job {job!r} is not in group {self.state.group!r}; Join first"
            )
        if not hmac.compare_digest(entry.token_hash, token_hash):
            raise QueueError("UNAUTHENTICATED", f"wrong job token for job {job!r}")
        return entry

    def leave(self, job: str, now: float) -> None:
        if job not in self.state.jobs:
            return
        turn = self.state.turn
        if turn is not None and turn.job == job:
            self.release(job, turn.epoch, now)
        self.state.queue = [w for w in self.state.queue if w.job != job]
        del self.state.jobs[job]
        self._grant_ready(now)

    def heartbeat(self, job: str, now: float) -> HeartbeatOutput:
        self.state.jobs[job].last_seen = now
        turn = self.state.turn
        holding = turn is not None and turn.job == job
        return HeartbeatOutput(
            holding=holding,
            epoch=turn.epoch if turn is not None and holding else 0,
            waiting=len(self.state.queue),
        )

    # -- acquire ------------------------------------------------------------

    def check_acquire(self, job: str, request_id: str) -> None:
        """Refuse an acquire that cannot be served, without changing anything."""
        if not request_id:
            raise QueueError("INVALID_ARGUMENT", "request_id must not be empty")
        turn = self.state.turn
        if turn is not None and turn.job == job and turn.request_id != request_id:
            raise QueueError(
                "FAILED_PRECONDITION",
                f"job {job!r} already holds the turn (epoch {turn.epoch}); yield it first",
            )
        for waiter in self.state.queue:
            if waiter.job == job and waiter.request_id != request_id:
                raise QueueError(
                    "FAILED_PRECONDITION",
                    f"job {job!r} already waits with request {waiter.request_id!r}",
                )

    def request(self, job: str, request_id: str, now: float) -> Grant | None:
        """Queue an acquire (once per request_id); return its grant if it is granted now."""
        self.check_acquire(job, request_id)
        if self.grant_for(job, request_id) is None and not self.is_waiting(job, request_id):
            self.state.queue.append(
                Waiter(job=job, request_id=request_id, ticket=self.state.next_ticket, since=now)
            )
            self.state.next_ticket += 1
            self._grant_ready(now)
        return self.grant_for(job, request_id)

    def grant_for(self, job: str, request_id: str) -> Grant | None:
        turn = self.state.turn
        if turn is not None and turn.job == job and turn.request_id == request_id:
            return turn
        return None

    def is_waiting(self, job: str, request_id: str) -> bool:
        return any(w.job == job and w.request_id == request_id for w in self.state.queue)

    def cancel(self, job: str, request_id: str, now: float) -> bool:
        """Withdraw a waiting request; False if it is granted or being switched in."""
        switching = self.state.switching
        if switching is not None and switching.waiter.request_id == request_id:
            return False
        before = len(self.state.queue)
        self.state.queue = [
            w for w in self.state.queue if not (w.job == job and w.request_id == request_id)
        ]
        if len(self.state.queue) == before:
            return False
        self._grant_ready(now)
        return True

    # -- yield --------------------------------------------------------------

    def check_release(self, job: str, epoch: int) -> Grant:
        turn = self.state.turn
        if turn is None or turn.job != job:
            holder = turn.job if turn is not None else "nobody"
            raise QueueError(
                "FAILED_PRECONDITION",
                f"job {job!r} does not hold the turn of group {self.state.group!r} "
                f"(held by {holder})",
            )
        if turn.epoch != epoch:
            raise QueueError(
                "FAILED_PRECONDITION",
                f"stale epoch {epoch}: job {job!r} holds epoch {turn.epoch}",
            )
        return turn

    def release(self, job: str, epoch: int, now: float) -> float:
        """Record a yield; nothing moves on the nodes. Returns seconds held."""
        turn = self.check_release(job, epoch)
        held = max(0.0, now - turn.granted_at)
        entry = self.state.jobs.get(job)
        if entry is not None:
            entry.held_seconds += held
        self.state.turn = None
        self._grant_ready(now)
        return held

    # -- switches -----------------------------------------------------------

    def needs_switch(self) -> bool:
        """True when the head of the queue may go next but nodes must move first."""
        return self.state.turn is None and self.state.switching is None and bool(self.state.queue)

    def begin_switch(self, now: float) -> SwitchPlan:
        if not self.needs_switch():
            raise QueueError("FAILED_PRECONDITION", "no switch is due")
        head = self.state.queue[0]
        plan = SwitchPlan(
            waiter=head,
            epoch=self.state.epoch + 1,
            moves=self.moves_for(head.job),
            started_at=now,
        )
        self.state.switching = plan
        return plan

    def switch_failed(self, cause: str) -> None:
        self.state.degraded_cause = cause

    def finish_switch(self, now: float) -> Grant | None:
        """Every node reported: record the new residency and grant the head."""
        plan = self.state.switching
        if plan is None:
            raise QueueError("FAILED_PRECONDITION", "no switch is under way")
        for move in plan.moves:
            self.state.resident[move.node] = move.admit
        self.state.switching = None
        self.state.degraded_cause = ""
        self.state.switches += 1
        seconds = max(0.0, now - plan.started_at)
        self.state.switch_seconds_total += seconds
        grant = None
        if self.state.queue and self.state.queue[0].request_id == plan.waiter.request_id:
            grant = self._grant_head(now, seconds)
        self._grant_ready(now)
        return grant

    def moves_for(self, job: str) -> list[NodeMove]:
        moves = []
        for node in self.state.jobs[job].nodes:
            resident = self.state.resident.get(node)
            if resident != job:
                moves.append(NodeMove(node=node, admit=job, evict=[resident] if resident else []))
        return moves

    # -- status ---------------------------------------------------------------

    def status(self) -> GroupStatus:
        s = self.state
        state: GroupStateName = "idle"
        if s.degraded_cause:
            state = "degraded"
        elif s.switching is not None:
            state = "switching"
        elif s.turn is not None:
            state = "held"
        return GroupStatus(
            group=s.group,
            state=state,
            holder=s.turn.job if s.turn is not None else "",
            epoch=s.epoch,
            queue=[w.job for w in s.queue],
            jobs=[
                JobStatus(
                    job=name,
                    nodes=entry.nodes,
                    turns=entry.turns,
                    waited_seconds=entry.waited_seconds,
                    held_seconds=entry.held_seconds,
                )
                for name, entry in sorted(s.jobs.items())
            ],
            resident=dict(sorted(s.resident.items())),
            switches=s.switches,
            grants=s.grants,
            switch_seconds_total=s.switch_seconds_total,
            degraded_cause=s.degraded_cause,
        )

    # -- internals ------------------------------------------------------------

    def _is_active(self, job: str) -> bool:
        turn = self.state.turn
        return (turn is not None and turn.job == job) or any(w.job == job for w in self.state.queue)

    def _grant_ready(self, now: float) -> None:
        """Grant the head at once when it needs no node to move."""
        if self.needs_switch() and not self.moves_for(self.state.queue[0].job):
            self._grant_head(now, 0.0)

    def _grant_head(self, now: float, switch_seconds: float) -> Grant:
        head = self.state.queue.pop(0)
        self.state.epoch += 1
        self.state.grants += 1
        waited = max(0.0, now - head.since)
        grant = Grant(
            job=head.job,
            request_id=head.request_id,
            epoch=self.state.epoch,
            ticket=head.ticket,
            granted_at=now,
            waited_seconds=waited,
            switch_seconds=switch_seconds,
        )
        self.state.turn = grant
        entry = self.state.jobs[head.job]
        entry.turns += 1
        entry.waited_seconds += waited
        return grant
