"""What every part of the lock queue shares: its state, its refusals, and the
operations one concern asks of another (QueueBase's stubs, each implemented
by the part named beside it)."""

from __future__ import annotations

from typing import TypeVar

from timeshare.refusals import Refusal
from timeshare.scheduling.rules import Rules
from timeshare.scheduling.state import (
    GroupState,
    JobEntry,
    StoredGrant,
    StoredMove,
    SwitchAbort,
    SwitchPlan,
    Waiter,
)

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


Remembered = TypeVar("Remembered")


def remember(reasons: dict[str, Remembered], key: str, reason: Remembered) -> None:
    reasons[key] = reason
    while len(reasons) > MAX_REMEMBERED_REASONS:
        del reasons[next(iter(reasons))]


class QueueBase:
    """Decisions over a GroupState. Every method either changes the state
    consistently or raises QueueError and changes nothing."""

    def __init__(self, state: GroupState) -> None:
        self.state = state
        # The latest time the queue was told of: what a call without one
        # (a status query) orders the waiters by.
        self._clock = state.since

    @property
    def rules(self) -> Rules:
        """The rules the group decides by, fixed when it was created."""
        return Rules.of(self.state.rules)

    @property
    def policies(self) -> bool:
        """Whether the group decides by scheduling policies (rules 2) or as
        groups created before them did (FIFO, one lease for all)."""
        return self.rules.policies

    # -- what one part asks of another ----------------------------------------

    def touch(self, job: str, now: float) -> None:  # membership
        raise NotImplementedError

    def evict(self, job: str, reason: str, now: float) -> bool:  # membership
        raise NotImplementedError

    def evict_failed(self, job: str, reason: str, now: float) -> None:  # membership
        raise NotImplementedError

    def _epoch_known_to(self, job: str) -> int:  # turns
        raise NotImplementedError

    def _eligible(self) -> list[Waiter]:  # turns
        raise NotImplementedError

    def _next_waiter(self, now: float | None = None) -> Waiter | None:  # turns
        raise NotImplementedError

    def _charge(self, job: str, turn: StoredGrant, now: float) -> float:  # turns
        raise NotImplementedError

    def _end_turn(self, turn: StoredGrant, now: float, ended_by: str) -> None:  # turns
        raise NotImplementedError

    def _grant_ready(  # turns
        self, now: float, switched: tuple[int, float, bool] | None = None
    ) -> None:
        raise NotImplementedError

    def _anticipate(self, job: str, turn: StoredGrant, now: float) -> None:  # anticipation
        raise NotImplementedError

    def _anticipated(self, now: float) -> str | None:  # anticipation
        raise NotImplementedError

    def yield_requested_epoch(self, now: float) -> int:  # deadlines
        raise NotImplementedError

    def _yield_due_reached(self, now: float) -> bool:  # deadlines
        raise NotImplementedError

    def needs_switch(self) -> bool:  # switching
        raise NotImplementedError

    def moves_for(self, job: str) -> list[StoredMove]:  # switching
        raise NotImplementedError

    def _begin(self, waiter: Waiter, now: float, prefetch: bool) -> SwitchPlan:  # switching
        raise NotImplementedError

    def _leaving_elsewhere(self, moves: list[StoredMove]) -> list[StoredMove]:  # switching
        raise NotImplementedError

    def _now_resident(self, move: StoredMove) -> None:  # switching
        raise NotImplementedError

    def _plan(self) -> SwitchPlan:  # switching
        raise NotImplementedError

    def abort_switch(  # switching
        self, reason: str, now: float, abort: SwitchAbort | None = None
    ) -> None:
        raise NotImplementedError

    def _note_ask(self, entry: JobEntry, now: float) -> None:  # prefetch
        raise NotImplementedError
