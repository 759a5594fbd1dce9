"""What time alone decides: leases running out, the turn limit, preemption;
and what a heartbeat is told of them."""

from __future__ import annotations

from timeshare.models import HeartbeatOutput
from timeshare.scheduling import (
    anticipation,
    backfill,
    base,
    membership,
    ordering,
    switch_costs,
    turns,
)
from timeshare.scheduling.base import (
    Group,
    decides_by_policies,
    rules_of,
)
from timeshare.scheduling.state import GroupState, StoredGrant, Waiter

# The kinds of lease a job may run out of (see _lease_deadlines).
LEGACY, IDLE, HELD = "legacy", "idle", "held"


def next_deadline(state: GroupState, now: float) -> float | None:
    """When expire() next has something to do, or the holder is next asked
    to yield, if nothing else happens first."""
    deadlines = [deadline for _, deadline, _ in _lease_deadlines(state)]
    if state.anticipation is not None:
        deadlines.append(state.anticipation.until)
    asked, preempt_at = _yield_times(state, now)
    if preempt_at is not None:
        deadlines.append(preempt_at)
    if decides_by_policies(state) and asked is not None and asked > now:
        deadlines.append(asked)  # the request to yield is published then
    held_back_until = (
        switch_costs.next_release(state, now)
        if rules_of(state).steady_deadlines
        else switch_costs.recheck_at(state, now)
    )
    if held_back_until is not None:
        deadlines.append(held_back_until)
    return min(deadlines) if deadlines else None


def expire(group: Group, now: float) -> list[str]:
    """Evict jobs whose lease ran out and preempt a holder past its time; say what was done."""
    state = group.state
    group.tell(now)
    done = []
    if not decides_by_policies(state):
        lease = state.policy.lease_seconds
        for job, entry in list(state.jobs.items()):
            if now - entry.last_seen >= lease:
                membership.evict(
                    group, job, f"its lease expired (no heartbeat for {lease:g} s)", now
                )
                done.append(f"evicted {job}: lease expired")
    else:
        for job, deadline, kind in _lease_deadlines(state):
            if now >= deadline and job in state.jobs:
                reason = _lease_reason(state, kind)
                membership.evict(group, job, reason, now)
                done.append(f"evicted {job}: {reason}")
    held = state.anticipation
    if held is not None and anticipation.anticipated(state, now) is None:
        done.append(f"held the turn for {held.job} in vain")
        turns.grant_ready(group, now)
    turn = state.turn
    _, preempt_at = _yield_times(state, now)
    if turn is not None and preempt_at is not None and now >= preempt_at:
        entry = state.jobs[turn.job]
        if entry.backfill and backfill.moved_only_by_hooks(entry, state.recent_switches):
            reason = backfill.eviction_reason(state.policy.backfill_grace_seconds)
            membership.evict(group, turn.job, reason, now)
            state.backfill_preemptions += 1
            done.append(f"evicted backfill job {turn.job}: {reason}")
            return done
        preempt(group, turn, now)
        done.append(f"preempted {turn.job} after {now - turn.granted_at:.0f} s")
    return done


def yield_asked_at(state: GroupState, now: float) -> float | None:
    """When the holder was first asked to yield, if it has been by ``now``."""
    asked, _ = _yield_times(state, now)
    return asked if asked is not None and asked <= now else None


def backfill_yield_due(state: GroupState, now: float) -> tuple[int, float] | None:
    """(epoch, when) a backfill holder is to be asked to yield, where that is
    still to come: ahead of a predicted request, its turn's watch may ask it
    at that moment by its own clock instead of after a timer of the
    workflow's (which Temporal may fire late)."""
    turn = state.turn
    if turn is None or turn.job not in state.jobs or not state.jobs[turn.job].backfill:
        return None
    asked, _ = _yield_times(state, now)
    if asked is None or asked <= now:
        return None
    return turn.told_epoch, asked


def yield_requested_epoch(state: GroupState, now: float) -> int:
    """The epoch whose holder is asked to yield now (0: none): others wait
    past its turn limit, or a waiter outranks it."""
    turn = state.turn
    asked, _ = _yield_times(state, now)
    if turn is None or asked is None or now < asked:
        return 0
    return turn.told_epoch


def _lease_deadlines(state: GroupState) -> list[tuple[str, float, str]]:
    """(job, when its lease runs out, why it would be evicted then). A
    holder that others wait for must be heard from within lease_seconds
    of their first request or of its grant, whichever is later; everyone
    else within idle_lease_seconds.
    (Groups from before policies: everyone within lease_seconds.) The
    reason is a kind here (LEGACY, IDLE or HELD), worded at eviction."""
    policy = state.policy
    if not decides_by_policies(state):
        return [(job, e.last_seen + policy.lease_seconds, LEGACY) for job, e in state.jobs.items()]
    turn = state.turn
    idle = policy.idle_lease
    contended: float | None = None
    if turn is not None and turn.job in state.jobs:
        others = [w.since for w in state.queue if w.job != turn.job]
        if others:
            since = max(state.jobs[turn.job].last_seen, min(others))
            # A job granted after a long wait had nothing to say while
            # it waited: it gets the whole lease from its grant.
            since = max(since, turn.granted_at)
            contended = since + policy.lease_seconds
    deadlines = []
    for job, entry in state.jobs.items():
        deadline = entry.last_seen + idle
        if contended is not None and turn is not None and job == turn.job and contended < deadline:
            deadlines.append((job, contended, HELD))
            continue
        deadlines.append((job, deadline, IDLE))
    return deadlines


def _lease_reason(state: GroupState, kind: str) -> str:
    policy = state.policy
    if kind == HELD:
        return (
            f"it held the turn while others waited and sent nothing for {policy.lease_seconds:g} s"
        )
    if kind == IDLE:
        return f"it sent nothing for {policy.idle_lease:g} s"
    return f"its lease expired (no heartbeat for {policy.lease_seconds:g} s)"


def _yield_times(state: GroupState, now: float) -> tuple[float | None, float | None]:
    """When the holder is (or was) asked to yield, and when it is
    preempted: the turn limit with others waiting, or a waiter that
    outranks it (preempt_lower_after_seconds), or a regular job waiting
    for a backfill holder (asked at once; preempted after
    backfill_grace_seconds: scheduling/backfill.py)."""
    turn = state.turn
    if turn is None:
        return None, None
    policy = state.policy
    asked: list[float] = []
    preempt: list[float] = []
    limit_due = _turn_limit_due(state, now)
    if limit_due is not None:
        asked.append(limit_due)
        preempt.append(limit_due + policy.preempt_grace_seconds)
    if turn.kept_past_others_at:
        asked.append(turn.kept_past_others_at)
    if decides_by_policies(state) and policy.preempt_lower_after_seconds > 0:
        outranked = _outranked_from(state, turn, now)
        if outranked is not None:
            asked.append(outranked)
            preempt.append(outranked + policy.preempt_lower_after_seconds)
    regular_asked = backfill.asked_to_yield_from(turn, state.jobs, ordering.eligible(state, now))
    if regular_asked is not None:
        asked.append(regular_asked)
        preempt.append(regular_asked + policy.backfill_grace_seconds)
    ahead = switch_costs.yield_ahead_at(state, turn)
    if ahead is not None:
        asked.append(ahead)  # not preempted for it: no regular job waits yet
    return min(asked, default=None), min(preempt, default=None)


def _outranked_from(state: GroupState, turn: StoredGrant, now: float) -> float | None:
    policy, jobs = state.policy, state.jobs
    holder = ordering.holder_priority(jobs[turn.job], turn, policy)
    times = [
        ordering.outranks_holder_from(waiter, jobs[waiter.job], holder, policy)
        for waiter in backfill.contenders(turn, jobs, ordering.eligible(state, now))
        if waiter.job != turn.job
    ]
    return min((t for t in times if t is not None), default=None)


def _turn_limit_due(state: GroupState, now: float) -> float | None:
    """When the holder was (or will be) first asked to yield for its turn
    limit: past the limit with someone waiting."""
    turn = state.turn
    limit = state.policy.max_turn_seconds
    if turn is None or limit <= 0:
        return None
    eligible = backfill.contenders(turn, state.jobs, ordering.eligible(state, now))
    if not eligible:
        return None
    return max(turn.granted_at + limit, eligible[0].since)


def _yield_due_reached(state: GroupState, now: float) -> bool:
    due = _turn_limit_due(state, now)
    return due is not None and now >= due


def preempt(group: Group, turn: StoredGrant, now: float) -> None:
    """Take the turn back from its holder, transparently to it: it waits
    to resume the turn it was told (its epoch kept)."""
    state = group.state
    entry = state.jobs[turn.job]
    turns.charge(state, turn.job, turn, now)
    entry.preempted = True
    turns.end_turn(state, turn, now, "preempted")
    state.turn = None
    state.since = now
    state.preemptions += 1
    state.backfill_preemptions += entry.backfill
    state.queue.append(
        Waiter(
            job=turn.job,
            request_id=f"{turn.request_id}/resume-{turn.epoch}",
            ticket=state.next_ticket,
            since=now,
            resumes_epoch=turn.told_epoch,
            phase=turn.phase,
        )
    )
    state.next_ticket += 1
    turns.grant_ready(group, now)


def heartbeat(state: GroupState, job: str, now: float) -> HeartbeatOutput:
    """Renew the job's lease; whether it holds, and whether it is asked to yield."""
    base.touch(state, job, now)
    turn = state.turn
    entry = state.jobs[job]
    holding = (turn is not None and turn.job == job) or entry.preempted
    asked = yield_requested_epoch(state, now)
    return HeartbeatOutput(
        holding=holding,
        epoch=turns.epoch_known_to(state, job),
        waiting=len(state.queue),
        should_yield=(asked != 0 and turn is not None and turn.job == job)
        if decides_by_policies(state)
        else _yield_due_reached(state, now),
        preempted=entry.preempted,
        lease_seconds=state.policy.lease_seconds,
    )
