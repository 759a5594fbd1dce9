"""LockQueue: the scheduling core's functions over one group, as methods, for
unit tests that drive a decision directly rather than through an event. The
product goes through GroupCore.handle, which calls the functions itself
(tests/unit/test_layout.py keeps LockQueue out of it)."""

from __future__ import annotations

from typing import Any

from timeshare.history import GroupHistory
from timeshare.models import GroupStatus, HeartbeatOutput
from timeshare.scheduling import (
    deadlines,
    membership,
    moves,
    prefetch,
    reporting,
    switch_failures,
    switching,
    turns,
)
from timeshare.scheduling.base import Group
from timeshare.scheduling.prefetch import PrefetchChoice
from timeshare.scheduling.state import (
    GroupState,
    JobEntry,
    StoredGrant,
    StoredSwitch,
    SwitchAbort,
    SwitchPlan,
)
from timeshare.scheduling.switch_failures import FailedMove, RetryVerdict


class LockQueue:
    """A group's state and clock, with the core's decisions over them. A
    method that refuses raises QueueError; it may have changed the state
    before (GroupCore.handle keeps no change of an event that raised)."""

    def __init__(self, state: GroupState) -> None:
        self.group = Group.of(state)

    @property
    def state(self) -> GroupState:
        return self.group.state

    # -- membership ---------------------------------------------------------------

    def join(self, job: str, nodes: list[str], token_hash: str, now: float, **options: Any) -> bool:
        """``options``: the job's weight, priority and backfill, as membership.join takes them."""
        return membership.join(self.group, job, nodes, token_hash, now, **options)

    def authenticate(self, job: str, token_hash: str) -> JobEntry:
        return membership.authenticate(self.state, job, token_hash)

    def leave(self, job: str, now: float) -> None:
        membership.leave(self.group, job, now)

    def heartbeat(self, job: str, now: float) -> HeartbeatOutput:
        return deadlines.heartbeat(self.state, job, now)

    # -- turns ------------------------------------------------------------------------

    def request(
        self, job: str, request_id: str, now: float, call_id: str = "", *, phase: str = ""
    ) -> StoredGrant | None:
        return turns.request(self.group, job, request_id, now, call_id, phase=phase)

    def yield_turn(self, job: str, epoch: int, now: float, asks_again: bool = False) -> float:
        return turns.yield_turn(self.group, job, epoch, now, asks_again)

    def keep_turn(self, job: str, epoch: int, phase: str, now: float) -> tuple[bool, float]:
        return turns.keep_turn(self.group, job, epoch, phase, now)

    def cancel(self, job: str, request_id: str, now: float, call_id: str = "") -> bool:
        return turns.cancel(self.group, job, request_id, now, call_id)

    def is_waiting(self, job: str, request_id: str) -> bool:
        return turns.is_waiting(self.state, job, request_id)

    def raise_if_aborted(self, request_id: str) -> None:
        turns.raise_if_aborted(self.state, request_id)

    def pause(self, paused: bool, now: float) -> None:
        turns.pause(self.group, paused, now)

    def drain(self, node: str, drained: bool, now: float) -> None:
        turns.drain(self.group, node, drained, now)

    # -- time ---------------------------------------------------------------------------

    def expire(self, now: float) -> list[str]:
        return deadlines.expire(self.group, now)

    def next_deadline(self, now: float | None = None) -> float | None:
        return deadlines.next_deadline(self.state, self.group.clock if now is None else now)

    def yield_requested_epoch(self, now: float) -> int:
        return deadlines.yield_requested_epoch(self.state, now)

    # -- switches -----------------------------------------------------------------------

    def needs_switch(self) -> bool:
        return moves.needs_switch(self.state, self.group.clock)

    def begin_switch(self, now: float) -> SwitchPlan:
        return switching.begin_switch(self.group, now)

    def finish_switch(self, now: float, restored: bool = False) -> StoredGrant | None:
        return switching.finish_switch(self.group, now, restored)

    def abort_switch(self, reason: str, now: float, abort: SwitchAbort | None = None) -> None:
        switching.abort_switch(self.group, reason, now, abort)

    def set_switch_aside(self, now: float) -> None:
        switching.set_switch_aside(self.group, now)

    def switch_failed(
        self, failures: list[FailedMove], done: list[str], failed: list[str], now: float
    ) -> RetryVerdict:
        return switch_failures.switch_failed(self.group, failures, done, failed, now)

    def record_switches(self, records: list[StoredSwitch]) -> None:
        switching.record_switches(self.state, records)

    def switches_are_quick(self, seconds: float) -> bool:
        return switching.switches_are_quick(self.state, seconds)

    # -- prefetch -----------------------------------------------------------------------

    def expected_ask(self, job: str, now: float) -> float | None:
        return prefetch.expected_ask(self.state, job, now)

    def prefetch_choice(self, now: float) -> PrefetchChoice | None:
        return prefetch.prefetch_choice(self.state, now)

    def prefetch_target(self, now: float) -> str | None:
        return prefetch.prefetch_target(self.state, now)

    def begin_prefetch(self, job: str, now: float) -> SwitchPlan:
        return prefetch.begin_prefetch(self.group, job, now)

    # -- what the group shows -------------------------------------------------------------

    def status(self, now: float | None = None) -> GroupStatus:
        return reporting.status(self.state, self.group.clock if now is None else now)

    def history(self, now: float) -> GroupHistory:
        return reporting.history(self.state, now)
