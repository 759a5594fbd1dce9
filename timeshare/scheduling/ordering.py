"""Who goes next in a group with scheduling policies, and from when the holder
is asked to give way. Pure functions of the queue's state; time is passed in.

The next turn goes to a regular (not backfill) waiter before any backfill
one; then to the eligible waiter with the highest effective priority;
among equals, with ordering "fair", to the one whose job has used
the least GPU time for its weight (``share_seconds``), else (and then) to the
first that asked. A waiter's effective priority is its job's priority, plus
the group's ``phase_priority`` for the phase it asked for, plus one for every
``aging_seconds`` it has waited. The holder's priority is fixed when its turn
begins: its job's priority plus its phase's bonus, without aging.

Bound on fair shares (the property tests check it): among jobs that always
want the GPU, after every grant each one's share_seconds lies within
``T / w_min`` of every other's, where T is the longest single turn and w_min
the smallest weight: the job granted is always the one furthest behind, and
one turn moves it forward by at most T / w.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping

from timeshare.scheduling import switch_costs
from timeshare.scheduling.rules import Rules
from timeshare.scheduling.state import GroupState, JobEntry, StoredGrant, StoredPolicy, Waiter

# Ages are counted in whole periods; this much slack keeps a deadline computed
# as since + k * aging_seconds from landing a hair before the k-th period.
AGING_SLACK = 1e-9


def aged_periods(waiter: Waiter, policy: StoredPolicy, now: float) -> int:
    if policy.aging_seconds <= 0:
        return 0
    return max(0, math.floor((now - waiter.since) / policy.aging_seconds + AGING_SLACK))


def base_priority(entry: JobEntry, phase: str, policy: StoredPolicy) -> int:
    return entry.priority + policy.phase_priority.get(phase, 0)


def effective_priority(entry: JobEntry, waiter: Waiter, policy: StoredPolicy, now: float) -> int:
    return base_priority(entry, waiter.phase, policy) + aged_periods(waiter, policy, now)


def holder_priority(entry: JobEntry, turn: StoredGrant, policy: StoredPolicy) -> int:
    return base_priority(entry, turn.phase, policy)


def in_grant_order(
    waiters: Iterable[Waiter], jobs: Mapping[str, JobEntry], policy: StoredPolicy, now: float
) -> list[Waiter]:
    """The waiters in the order they would be granted now."""

    def key(waiter: Waiter) -> tuple[bool, int, float, int]:
        entry = jobs[waiter.job]
        share = entry.share_seconds if policy.ordering == "fair" else 0.0
        # Backfill jobs come after every regular one, whatever their priority.
        priority = effective_priority(entry, waiter, policy, now)
        return (entry.backfill, -priority, share, waiter.ticket)

    return sorted(waiters, key=key)


def outranks_holder_from(
    waiter: Waiter, entry: JobEntry, holder: int, policy: StoredPolicy
) -> float | None:
    """When the waiter's effective priority first exceeds the holder's, if ever."""
    base = base_priority(entry, waiter.phase, policy)
    if base > holder:
        return waiter.since
    if policy.aging_seconds > 0:
        return waiter.since + (holder - base + 1) * policy.aging_seconds
    return None


def level_share(shares: Iterable[float]) -> float:
    """Where a newcomer's share starts: level with the least-served member."""
    return min(shares, default=0.0)


def eligible(state: GroupState, now: float) -> list[Waiter]:
    """The waiters that may go next at ``now``: the group is not paused,
    none of their nodes is drained, and (Rules 4) their switches cost less
    than the gap they would fill; in arrival order."""
    if state.paused:
        return []
    drained = set(state.drained)
    waiters = [
        waiter for waiter in state.queue if not drained.intersection(state.jobs[waiter.job].nodes)
    ]
    return switch_costs.may_go(state, waiters, now)


def next_waiter(state: GroupState, now: float) -> Waiter | None:
    """The waiter that goes next: by the group's policy, or in groups from
    before policies, the first eligible one."""
    waiters = eligible(state, now)
    if not waiters:
        return None
    if not Rules.of(state.rules).policies or len(waiters) == 1:
        return waiters[0]
    return in_grant_order(waiters, state.jobs, state.policy, now)[0]
