"""What the group shows: its status, its history and its summary for the UI."""

from __future__ import annotations

from dataclasses import dataclass, field

from timeshare.history import GroupHistory
from timeshare.models import GroupStateName, GroupStatus, JobStatus
from timeshare.scheduling import deadlines, moves, ordering
from timeshare.scheduling.base import decides_by_policies
from timeshare.scheduling.state import GroupState
from timeshare.scheduling.watch import NOT_ASKED, WatchRecord, poll_seconds


@dataclass(frozen=True)
class GroupSummary:
    """What a group shows outside its workflow (workflows/visibility.py)."""

    group: str
    state: GroupStateName
    holder: str
    holder_phase: str
    # The epoch whose holder is asked to yield (0: none; always 0 in groups
    # from before policies).
    yield_epoch: int
    epoch: int
    switches: int
    degraded_cause: str
    queue: tuple[str, ...]
    ordering: str
    phase_priority: tuple[tuple[str, int], ...]
    resident: tuple[tuple[str, str], ...]
    # Attempts of the switch failing now, and their last cause (0: none fails).
    failing_attempts: int = 0
    failing_cause: str = ""
    # The group's backfill jobs, which go only while no regular job holds or waits.
    backfill: tuple[str, ...] = ()
    # The group's backfill totals (GroupState), for the backfill gauges.
    backfill_busy_seconds: float = 0.0
    backfill_preemptions: int = 0
    backfill_delay_seconds: float = 0.0
    # (epoch, when) a backfill holder is to be asked to yield, still to come
    # ((0, 0.0): none).
    backfill_yield_due: tuple[int, float] = (0, 0.0)
    # The epoch of the turn held (0: none held).
    holder_epoch: int = 0
    # What the holder must hear (scheduling/watch.py), published as one record.
    watch: WatchRecord = field(default_factory=WatchRecord)


def history(state: GroupState, now: float) -> GroupHistory:
    return GroupHistory(
        group=state.group,
        captured_at=now,
        turns=[t.as_record() for t in state.recent_turns],
        switches=[s.as_record() for s in state.recent_switches],
    )


def summary(state: GroupState, now: float) -> GroupSummary:
    """What the group shows outside its workflow (the status's fields
    that search attributes and the UI's details show), cheaper to make
    than the whole status and to compare with the last one shown."""
    s = state
    # A turn held open for its last holder shows as still held by it:
    # nothing changes outside for a hold its job ends by asking again.
    holder = s.anticipation.job if s.anticipation is not None else ""
    queue = tuple(_queue_in_grant_order(state, now))
    backfill = tuple(sorted(job for job, entry in s.jobs.items() if entry.backfill))
    yield_epoch = deadlines.yield_requested_epoch(state, now) if decides_by_policies(state) else 0
    backfill_yield_due = deadlines.backfill_yield_due(state, now) or NOT_ASKED
    return GroupSummary(
        group=s.group,
        state=_state_name(state, now),
        holder=s.turn.job if s.turn is not None else holder,
        holder_phase=s.turn.phase if s.turn is not None else "",
        yield_epoch=yield_epoch,
        epoch=s.epoch,
        switches=s.switches,
        degraded_cause=s.degraded_cause,
        queue=queue,
        ordering=s.policy.ordering,
        phase_priority=tuple(sorted(s.policy.phase_priority.items())),
        resident=tuple(sorted(s.resident.items())),
        failing_attempts=s.failing.attempts if s.failing and s.degraded_cause else 0,
        failing_cause=s.failing.cause if s.failing and s.degraded_cause else "",
        backfill=backfill,
        backfill_busy_seconds=s.backfill_busy_seconds,
        backfill_preemptions=s.backfill_preemptions,
        backfill_delay_seconds=s.backfill_delay_seconds,
        backfill_yield_due=backfill_yield_due,
        holder_epoch=s.turn.told_epoch if s.turn is not None else 0,
        watch=WatchRecord(
            yield_asked=(yield_epoch, 0.0) if yield_epoch else backfill_yield_due,
            backfill_waiting=sum(job in backfill for job in queue),
            poll_seconds=poll_seconds(s.policy),
        ),
    )


def _queue_in_grant_order(state: GroupState, now: float) -> list[str]:
    s = state
    if not decides_by_policies(state):
        return [w.job for w in s.queue]
    return [w.job for w in ordering.in_grant_order(s.queue, s.jobs, s.policy, now)]


def _state_name(state: GroupState, now: float) -> GroupStateName:
    s = state
    if s.degraded_cause:
        return "degraded"
    if s.switching is not None or moves.needs_switch(state, now):
        return "switching"
    if s.turn is not None or s.anticipation is not None:
        return "held"
    return "paused" if s.paused else "idle"


def status(state: GroupState, now: float) -> GroupStatus:
    s = state
    return GroupStatus(
        group=s.group,
        state=_state_name(state, now),
        holder=s.turn.job if s.turn is not None else "",
        epoch=s.epoch,
        queue=_queue_in_grant_order(state, now),
        jobs=[
            JobStatus(
                job=name,
                nodes=entry.nodes,
                turns=entry.turns,
                waited_seconds=entry.waited_seconds,
                held_seconds=entry.held_seconds,
                preempted=entry.preempted,
                last_seen=entry.last_seen,
                weight=entry.weight,
                priority=entry.priority,
                share_seconds=entry.share_seconds,
                backfill=entry.backfill,
            )
            for name, entry in sorted(s.jobs.items())
        ],
        resident=dict(sorted(s.resident.items())),
        switches=s.switches,
        grants=s.grants,
        switch_seconds_total=s.switch_seconds_total,
        degraded_cause=s.degraded_cause,
        paused=s.paused,
        drained=list(s.drained),
        policy=s.policy.as_policy(),
        preemptions=s.preemptions,
        evictions=s.evictions,
        runs=s.runs,
        heals=s.heals,
        state_since=s.since,
        switching_to=s.switching.waiter.job if s.switching is not None else "",
        holder_phase=s.turn.phase if s.turn is not None else "",
        yield_requested=decides_by_policies(state)
        and deadlines.yield_requested_epoch(state, now) != 0,
    )
