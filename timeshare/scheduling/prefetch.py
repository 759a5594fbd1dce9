"""Bringing the job expected to ask next onto its nodes before it asks."""

from __future__ import annotations

from dataclasses import dataclass

from timeshare.refusals import Refusal
from timeshare.scheduling import moves, switch_costs
from timeshare.scheduling.base import (
    MAX_PHASES_REMEMBERED,
    Group,
    QueueError,
    decides_by_policies,
)
from timeshare.scheduling.state import GroupState, JobEntry, SwitchPlan, Waiter
from timeshare.scheduling.versions import PREFETCH_GUESS, PREFETCH_PAST_DEPARTED

# A request later than expected by more than this share of its usual gap,
# plus this many seconds, is no longer expected: a job that stopped asking
# is not brought in again and again ahead of the job that does ask.
PREFETCH_LATE_SHARE = 0.25
PREFETCH_LATE_SECONDS = 0.05


@dataclass(frozen=True)
class PrefetchChoice:
    """The job to bring in, and the scheduler changes (patches) without which
    it would not have been chosen."""

    job: str
    patches: tuple[str, ...] = ()


def _idle(state: GroupState, now: float) -> bool:
    """Nobody holds, waits (but a backfill job its switches' cost holds
    back) or is being switched in, and the group may grant."""
    s = state
    waiting = switch_costs.may_go(s, s.queue, now)
    return s.turn is None and s.switching is None and not waiting and not s.paused


def expected_ask(state: GroupState, job: str, now: float) -> float | None:
    """When the job is expected to ask again: as long after its last yield
    as it took after its recent turns of the same phase (RL jobs repeat
    their phases); None when unknown, or long overdue."""
    entry = state.jobs[job]
    gap = entry.ask_gaps.get(entry.yielded_phase)
    if not entry.yielded_at or gap is None:
        return None
    expected = entry.yielded_at + gap
    late = PREFETCH_LATE_SHARE * gap + PREFETCH_LATE_SECONDS
    return expected if now <= expected + late else None


def prefetch_target(state: GroupState, now: float) -> str | None:
    choice = prefetch_choice(state, now)
    return choice.job if choice is not None else None


def prefetch_choice(state: GroupState, now: float) -> PrefetchChoice | None:
    """The job worth bringing onto its nodes now, ahead of its request:
    while the group is idle, the job expected to ask first, if it is not
    resident already and every job it would evict is expected later (a
    job that left or was evicted never asks again). Where no job's next
    request can be told yet (each job's first iteration), the guess is
    the job away the longest (see ``_longest_away``)."""
    s = state
    if not decides_by_policies(state) or s.policy.prefetch != "auto" or not _idle(state, now):
        return None
    if s.failing is not None:
        return None  # switches fail here: move nothing on a guess
    expected = {job: expected_ask(state, job, now) for job in s.jobs}
    known = {job: at for job, at in expected.items() if at is not None}
    if not known:
        guess = _longest_away(state)
        return PrefetchChoice(guess, (PREFETCH_GUESS,)) if guess is not None else None
    # Nor a backfill job into a gap shorter than its switches (Rules 4).
    known = {
        job: at for job, at in known.items() if switch_costs.held_back_until(s, job, now) is None
    }
    if not known:
        return None
    target = min(known, key=lambda job: (known[job], job))
    needed = moves.moves_for(state, target)
    if not needed or set(s.drained).intersection(s.jobs[target].nodes):
        return None
    leaving = {
        job for move in needed + moves.leaving_elsewhere(state, needed) for job in move.evict
    }
    in_the_way = leaving & set(s.jobs) - switch_costs.making_way(s, target)
    if any(known.get(job, known[target]) <= known[target] for job in in_the_way):
        return None
    # A job that left would have held the prefetch up before that change.
    departed = leaving - set(s.jobs)
    return PrefetchChoice(target, (PREFETCH_PAST_DEPARTED,) if departed else ())


def _longest_away(state: GroupState) -> str | None:
    """With nobody's next request known: the job that has been away from
    its nodes the longest since its last turn, if everything it would
    evict yielded later than it did. Jobs that take turns in a cycle (two
    RL jobs alternating) come back in the order they left; a job that
    yielded just now is the likeliest to be busy elsewhere for a while. A
    job that has never held a turn, or that holds the memory already, is
    not a candidate."""
    s = state
    away = sorted(
        (entry.yielded_at, job)
        for job, entry in s.jobs.items()
        if entry.yielded_at and not set(s.drained).intersection(entry.nodes)
    )
    for yielded_at, job in away:
        needed = moves.moves_for(state, job)
        if not needed:
            continue
        evicted = {
            j for move in needed + moves.leaving_elsewhere(state, needed) for j in move.evict
        }
        if all(s.jobs[j].yielded_at > yielded_at for j in evicted & set(s.jobs)):
            return job
        return None  # the job away the longest would evict one away longer still
    return None


def begin_prefetch(group: Group, job: str, now: float) -> SwitchPlan:
    """Plan the switch that brings ``job`` onto its nodes before it asks."""
    state = group.state
    group.tell(now)
    if not _idle(state, now) or job not in state.jobs or not moves.moves_for(state, job):
        raise QueueError(Refusal.FAILED_PRECONDITION, f"no prefetch of job {job!r} is due")
    waiter = Waiter(job=job, request_id="", ticket=0, since=now)
    return moves.plan_switch(state, waiter, now, prefetch=True)


def note_ask(entry: JobEntry, now: float) -> None:
    if not entry.yielded_at:
        return
    gap = max(0.0, now - entry.yielded_at)
    before = entry.ask_gaps.pop(entry.yielded_phase, None)
    entry.ask_gaps[entry.yielded_phase] = gap if before is None else (before + gap) / 2
    while len(entry.ask_gaps) > MAX_PHASES_REMEMBERED:
        del entry.ask_gaps[next(iter(entry.ask_gaps))]
    entry.yielded_at = 0.0
