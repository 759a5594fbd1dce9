"""What a switch costs, and the turns worth that cost (Rules 4).

Every switch's node reports how long each checkpoint and restore took
(BackendAction.seconds); the group keeps, per job and node, a smoothed
estimate of both (JobEntry.checkpoint_seconds, JobEntry.restore_seconds).
From them, under Rules 4 with the policy's ``switch_cost_aware``:

- a backfill waiter is held back while the gap it would fill is no longer
  than its switches there and back would take. The gap ends at the earliest
  predicted request of a regular member that neither holds nor waits (its
  last yield plus how long it took to ask again after that phase before,
  as for prefetch); a member past its predicted request, or never measured,
  bounds nothing. The switches are the resident job's checkpoint and the
  backfill job's restore (where it is not resident already), then the
  backfill job's checkpoint and the returning job's restore; the slowest of
  its nodes counts. Unmeasured costs count 0, so a first turn is granted
  and measured;
- a backfill holder is asked to yield one switch ahead of that request, and
  earlier by how long it has taken to yield once asked (its lag: hearing of
  the request, then finishing its step; measured on every yield it was asked
  for, JobEntry.yield_lag_seconds), so the regular job's state can be back by
  the time it asks; a gap no longer than the switches and that lag is not
  worth a backfill turn;
- prefetch brings a regular job back past backfill jobs, and a backfill
  job only into a gap worth its switches;
- fair share's anticipation holds the turn open no longer than switching to
  the first waiter would take, where that is measured.

The policy's ``switch_cost_seconds``, where set, is every switch's cost on
every node instead of the measurements. Pure functions of the state; time is
passed in."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from timeshare.models import BackendAction
from timeshare.scheduling.rules import Rules
from timeshare.scheduling.state import GroupState, JobEntry, StoredGrant, StoredSwitch, Waiter

# The newest measurement's weight in a job's smoothed switch costs: recent
# switches count most (a job's state grows and shrinks with its phase).
COST_SMOOTHING = 0.5
# A restore quicker than this brought nothing back (the job had never been
# checkpointed there): it says nothing about what bringing it back costs.
RESTORE_MEASURED_FROM_SECONDS = 0.001
# Rules 5: a regular job's predicted request still holds a backfill waiter
# back once due, for this share of its gap (its requests come a little late
# as often as early: a backfill turn granted into that moment is cut short at
# once, and the switches there and back are lost).
OVERDUE_SHARE = 0.05


def measured(actions: Iterable[BackendAction], admitted: str) -> tuple[dict[str, float], float]:
    """What one node's switch took: seconds per job checkpointed, and the
    admitted job's restore."""
    actions = list(actions)
    checkpoints = {a.job: a.seconds for a in actions if a.action == "checkpoint"}
    restore = sum(a.seconds for a in actions if a.action == "restore" and a.job == admitted)
    return checkpoints, restore


def learn(jobs: Mapping[str, JobEntry], records: Iterable[StoredSwitch]) -> None:
    """Fold the switches' measured seconds into each job's estimates."""
    for record in records:
        if not record.ok:
            continue
        for job, seconds in record.checkpoint_seconds.items():
            if job in jobs:
                _smooth(jobs[job].checkpoint_seconds, record.node, seconds)
        admitted = jobs.get(record.admitted)
        if admitted is not None and record.restore_seconds >= RESTORE_MEASURED_FROM_SECONDS:
            _smooth(admitted.restore_seconds, record.node, record.restore_seconds)


def _smooth(estimates: dict[str, float], node: str, seconds: float) -> None:
    before = estimates.get(node)
    estimates[node] = seconds if before is None else before + COST_SMOOTHING * (seconds - before)


def weighed(state: GroupState) -> bool:
    return Rules.of(state.rules).switch_costs and state.policy.switch_cost_aware


def learns_yield_lag(state: GroupState, job: str) -> bool:
    entry = state.jobs.get(job)
    return entry is not None and entry.backfill and weighed(state)


def learn_yield_lag(state: GroupState, job: str, seconds: float) -> None:
    """A backfill job gave its turn back ``seconds`` after it was asked to."""
    if not learns_yield_lag(state, job) or seconds < 0:
        return
    entry = state.jobs[job]
    before = entry.yield_lag_seconds
    entry.yield_lag_seconds = before + COST_SMOOTHING * (seconds - before) if before else seconds


def switch_seconds(state: GroupState, node: str, leaving: str, coming: str) -> float | None:
    """One switch on ``node`` from ``leaving`` to ``coming`` (either may be
    "": nothing of the group's there, or nobody comes back): the operator's
    figure, else the measured checkpoint plus restore; None where neither
    is measured."""
    if state.policy.switch_cost_seconds is not None:
        return state.policy.switch_cost_seconds
    parts = [
        state.jobs[leaving].checkpoint_seconds.get(node) if leaving in state.jobs else None,
        state.jobs[coming].restore_seconds.get(node) if coming in state.jobs else None,
    ]
    known = [seconds for seconds in parts if seconds is not None]
    return sum(known) if known else None


def predicted_asks(state: GroupState, after: float, overdue: float = 0.0) -> dict[str, float]:
    """When each regular member that neither holds nor waits is expected to
    ask again, where that is later than ``after`` (or than ``after`` less
    ``overdue`` of its gap: a request a little late)."""
    busy = {w.job for w in state.queue} | ({state.turn.job} if state.turn is not None else set())
    asks = {}
    for job, entry in state.jobs.items():
        gap = entry.ask_gaps.get(entry.yielded_phase)
        if entry.backfill or job in busy or not entry.yielded_at or gap is None:
            continue
        if entry.yielded_at + gap * (1 + overdue) > after:
            asks[job] = entry.yielded_at + gap
    return asks


def _overdue_seconds(state: GroupState, job: str) -> float:
    entry = state.jobs[job]
    return entry.ask_gaps.get(entry.yielded_phase, 0.0) * OVERDUE_SHARE


def _first_ask(state: GroupState, after: float, overdue: float = 0.0) -> tuple[str, float] | None:
    asks = predicted_asks(state, after, overdue)
    if not asks:
        return None
    job = min(asks, key=lambda j: (asks[j], j))
    return job, asks[job]


def _back_seconds(state: GroupState, job: str, returning: str) -> float:
    """The switches that hand the GPUs back from ``job`` to ``returning``
    (and, where ``job`` is not resident, first to ``job``): the slowest node."""
    per_node = []
    for node in state.jobs[job].nodes:
        resident = state.resident.get(node, "")
        coming_back = returning if node in state.jobs[returning].nodes else ""
        switches = [switch_seconds(state, node, job, coming_back)]
        if resident != job:
            switches.append(switch_seconds(state, node, resident, job))
        per_node.append(sum(seconds or 0.0 for seconds in switches))
    return max(per_node, default=0.0)


def held_back_until(state: GroupState, job: str, now: float) -> float | None:
    """Until when a backfill waiter is held back because the gap it would fill
    is no longer than its switches; None: it may go. (Rules 5: a request
    due a little while ago, OVERDUE_SHARE of its gap, is still expected.)"""
    if not weighed(state) or not state.jobs[job].backfill:
        return None
    overdue = Rules.of(state.rules).overdue_asks
    first = _first_ask(state, now, OVERDUE_SHARE if overdue else 0.0)
    if first is None:
        return None
    returning, ask = first
    worth = _back_seconds(state, job, returning) + state.jobs[job].yield_lag_seconds
    if ask - now > worth:
        return None
    return ask + _overdue_seconds(state, returning) if overdue else ask


def may_go(state: GroupState, waiters: list[Waiter], now: float) -> list[Waiter]:
    """The waiters not held back by what their switches would cost."""
    if not weighed(state):
        return waiters
    return [w for w in waiters if held_back_until(state, w.job, now) is None]


def recheck_at(state: GroupState, now: float) -> float | None:
    """When a backfill waiter held back may go: its gap's prediction runs out
    (Rules 4 and 5: asked only while nobody holds the turn)."""
    idle = state.turn is None and state.switching is None and not state.paused
    if not idle:
        return None
    return next_release(state, now)


def next_release(state: GroupState, now: float) -> float | None:
    """When the first waiter held back by switch costs may go: a grant may
    follow, and so may a holder's turn limit, which counts only while
    someone who may go waits."""
    if not weighed(state):
        return None
    times = [held_back_until(state, w.job, now) for w in state.queue]
    return min((t for t in times if t is not None), default=None)


def making_way(state: GroupState, target: str) -> set[str]:
    """The jobs that bringing ``target`` in ahead of its request may push
    out whenever they expect to ask: for a regular job, where costs are
    weighed, the backfill jobs (a regular request goes before theirs, and
    one held back waits for the regular job anyway)."""
    if not weighed(state) or state.jobs[target].backfill:
        return set()
    return {job for job, entry in state.jobs.items() if entry.backfill}


def yield_ahead_at(state: GroupState, turn: StoredGrant) -> float | None:
    """When a backfill holder is asked to yield so that the regular job
    expected to ask first finds its state back: one switch ahead of that
    request (predicted when the turn was granted)."""
    if not weighed(state) or turn.job not in state.jobs or not state.jobs[turn.job].backfill:
        return None
    first = _first_ask(state, turn.granted_at)
    if first is None:
        return None
    returning, ask = first
    back = [
        switch_seconds(state, node, turn.job, returning) or 0.0
        for node in state.jobs[turn.job].nodes
        if node in state.jobs[returning].nodes
    ]
    return ask - max(back, default=0.0) - state.jobs[turn.job].yield_lag_seconds


def anticipation_cap(state: GroupState, first: str) -> float | None:
    """How long holding the turn open for a yielder may last at most: what
    switching to ``first`` would take, on its slowest node; None where that
    is not weighed or not measured."""
    if not weighed(state):
        return None
    costs = [
        switch_seconds(state, node, state.resident.get(node, ""), first)
        for node in state.jobs[first].nodes
        if state.resident.get(node) != first
    ]
    known = [seconds for seconds in costs if seconds is not None]
    return max(known) if known else None
