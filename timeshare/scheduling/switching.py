"""Starting the switch to the next waiter (moves.py plans what moves), and
its end: done, given up or set aside."""

from __future__ import annotations

from timeshare.history import HISTORY_SWITCHES
from timeshare.refusals import Refusal
from timeshare.scheduling import membership, moves, ordering, switch_costs, turns
from timeshare.scheduling.base import (
    Group,
    QueueError,
    remember,
)
from timeshare.scheduling.state import (
    GroupState,
    StoredGrant,
    StoredSwitch,
    SwitchAbort,
    SwitchPlan,
)


def begin_switch(group: Group, now: float) -> SwitchPlan:
    """Plan the switch to the next waiter."""
    state = group.state
    group.tell(now)
    waiter = ordering.next_waiter(state, now)
    if not moves.needs_switch(state, now) or waiter is None:
        raise QueueError(Refusal.FAILED_PRECONDITION, "no switch is due")
    return moves.plan_switch(state, waiter, now, prefetch=False)


def switch_target_waits(state: GroupState) -> bool:
    plan = state.switching
    return plan is not None and switch_target_waits_for(state, plan)


def abort_switch(group: Group, reason: str, now: float, abort: SwitchAbort | None = None) -> None:
    """Give up on the switch: its waiter (if still there) is told ``reason``
    (and ``abort``, for its typed error). A preempted turn that cannot come
    back ends its job: it is evicted. A run of failures ends only where the
    waiter was told: a plan dropped because nobody waits any more leaves
    it to the next one."""
    state = group.state
    plan = moves.current_plan(state)
    state.switching = None
    state.degraded_cause = ""
    state.since = now
    if reason:
        state.failing = None
    if switch_target_waits_for(state, plan):
        if plan.waiter.resumes_epoch:
            membership.evict(
                group, plan.waiter.job, f"its preempted turn could not resume: {reason}", now
            )
            return
        state.queue = [w for w in state.queue if w.ticket != plan.waiter.ticket]
        remember(state.aborted_requests, plan.waiter.request_id, reason)
        if abort is not None:
            remember(state.switch_aborts, plan.waiter.request_id, abort)
    turns.grant_ready(group, now)


def set_switch_aside(group: Group, now: float) -> None:
    """Stop a switch that keeps failing without dropping its waiter: the next
    plan starts from what each node reported. The group stays degraded."""
    state = group.state
    moves.current_plan(state)
    state.switching = None
    turns.grant_ready(group, now)


def switch_plan_stands(state: GroupState, now: float) -> bool:
    """The switch's waiter would still go next (the group is not paused, its
    nodes are not drained), and no node the plan only evicts from has been
    drained since (its agent may be down: the next plan leaves it alone)."""
    plan = state.switching
    waiter = ordering.next_waiter(state, now)
    drained = set(state.drained)
    return (
        plan is not None
        and waiter is not None
        and waiter.ticket == plan.waiter.ticket
        and not any(not move.admit and move.node in drained for move in plan.moves)
    )


def switch_target_waits_for(state: GroupState, plan: SwitchPlan) -> bool:
    return any(w.ticket == plan.waiter.ticket for w in state.queue)


def finish_switch(group: Group, now: float, restored: bool = False) -> StoredGrant | None:
    """Every node reported: record the new residency and grant the waiter.
    ``restored``: some node brought the job's state back from host memory."""
    state = group.state
    plan = moves.current_plan(state)
    for move in plan.moves:
        moves.now_resident(state, move)
    prefetched = state.jobs.get(plan.waiter.job) if plan.prefetch else None
    if prefetched is not None and restored:
        prefetched.restored_ahead = True
    state.switching = None
    state.degraded_cause = ""
    state.failing = None
    state.switches += 1
    state.since = now
    seconds = max(0.0, now - plan.started_at)
    state.switch_seconds_total += seconds
    turns.grant_ready(group, now, switched=(plan.waiter.ticket, seconds, restored))
    turn = state.turn
    return turn if turn is not None and turn.ticket == plan.waiter.ticket else None


def record_switches(state: GroupState, records: list[StoredSwitch]) -> None:
    state.recent_switches.extend(records)
    switch_costs.learn(state.jobs, records)
    del state.recent_switches[:-HISTORY_SWITCHES]


def switches_are_quick(state: GroupState, seconds: float) -> bool:
    """Whether the group's last switch went well within ``seconds`` on
    every node it moved (False before any switch)."""
    switches = state.recent_switches
    if not switches:
        return False
    last = switches[-1].epoch
    return all(s.ok and s.finished_at - s.started_at < seconds for s in switches if s.epoch == last)
