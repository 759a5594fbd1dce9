"""What every part of the lock queue shares: the group as the core sees it,
its refusals, and the renewal of a job's lease by any of its messages.

The parts are modules of plain functions, in layers, each calling only the
ones below it: ordering and backfill (who goes next), moves (what a switch
moves), anticipation and prefetch, turns (asking, yielding, granting),
membership, then deadlines and switching, switch_failures and reporting.
A function that moves the group's clock on (every one that may grant does)
takes the Group; every other one takes the GroupState."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypeVar

from timeshare.refusals import Refusal
from timeshare.scheduling.rules import Rules
from timeshare.scheduling.state import GroupState

MAX_JOBS_PER_GROUP = 64
MAX_NODES_PER_JOB = 256
# Reasons kept for requests and jobs that were ended by the scheduler, so the
# caller's next message can be told why; the oldest are forgotten first.
MAX_REMEMBERED_REASONS = 256
# Marks a node whose state a failed switch left uncertain: any job needs a
# switch there before it may be granted.
UNKNOWN_RESIDENT = "?"
# Phases whose ask gaps a job keeps (the oldest is forgotten first).
MAX_PHASES_REMEMBERED = 16


class QueueError(Exception):
    """A message the queue refuses; ``code`` says why, as the gRPC status to
    report; ``details``, what the client's typed error carries (SwitchFailed)."""

    def __init__(self, code: Refusal, message: str, details: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.details = details


@dataclass
class Group:
    """A group's durable state, and the latest time a grant was considered
    at: what a question asked without a time (whether a switch plan still
    stands, a status) orders the waiters by. The clock is not durable: a new
    run starts it at the state's ``since``."""

    state: GroupState
    clock: float

    @classmethod
    def of(cls, state: GroupState) -> Group:
        return cls(state, state.since)

    def tell(self, now: float) -> None:
        self.clock = max(self.clock, now)


Remembered = TypeVar("Remembered")


def remember(reasons: dict[str, Remembered], key: str, reason: Remembered) -> None:
    reasons[key] = reason
    while len(reasons) > MAX_REMEMBERED_REASONS:
        del reasons[next(iter(reasons))]


def rules_of(state: GroupState) -> Rules:
    """The rules the group decides by, fixed when it was created."""
    return Rules.of(state.rules)


def decides_by_policies(state: GroupState) -> bool:
    """Whether the group decides by scheduling policies (rules 2) or as
    groups created before them did (FIFO, one lease for all)."""
    return rules_of(state).policies


def touch(state: GroupState, job: str, now: float) -> None:
    """Any message from a job renews its lease."""
    entry = state.jobs.get(job)
    if entry is not None:
        entry.last_seen = max(entry.last_seen, now)
