"""Backfill jobs: a class below every regular job (Slurm's backfill, a
Kubernetes priority class below the rest). A backfill job is granted only
while no regular job holds or waits (ordering.in_grant_order puts it after
every regular waiter); a backfill holder is asked to yield as soon as a
regular job waits, and after the group's ``backfill_grace_seconds`` it is
preempted like any holder past its time (deadlines.preempt), or evicted
where its state could be moved only by its own hooks, which would need its
consent. Pure functions of the queue's state; time is passed in."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from timeshare.scheduling.state import JobEntry, StoredGrant, StoredSwitch, Waiter

# The backend that moves a job's state only through the job's own workload
# hooks (activities/backends/app.py): nothing can be checkpointed without them.
HOOKS_ONLY_BACKEND = "app"


def asked_to_yield_from(
    turn: StoredGrant, jobs: Mapping[str, JobEntry], eligible: Iterable[Waiter]
) -> float | None:
    """When a backfill holder was first asked to yield: the moment the first
    regular job still waiting asked (not before its grant); None for a
    regular holder, or while no regular job waits."""
    holder = jobs.get(turn.job)
    if holder is None or not holder.backfill:
        return None
    asks = [w.since for w in eligible if w.job != turn.job and not jobs[w.job].backfill]
    return max(turn.granted_at, min(asks)) if asks else None


def contenders(
    turn: StoredGrant, jobs: Mapping[str, JobEntry], waiters: Iterable[Waiter]
) -> list[Waiter]:
    """The waiters that may ask the holder to give way (a turn limit,
    preemption by priority): a regular holder never gives way to a backfill job."""
    holder = jobs.get(turn.job)
    regular_holder = holder is not None and not holder.backfill
    return [w for w in waiters if not (regular_holder and jobs[w.job].backfill)]


def moved_only_by_hooks(entry: JobEntry, switches: Iterable[StoredSwitch]) -> bool:
    """Whether any of the job's nodes last switched with its workload hooks
    alone (a node never seen switching counts as transparent)."""
    latest: dict[str, str] = {}
    for switch in switches:
        latest[switch.node] = switch.backend
    return any(latest.get(node) == HOOKS_ONLY_BACKEND for node in entry.nodes)


def eviction_reason(grace_seconds: float) -> str:
    return (
        f"it ran as backfill and did not yield within {grace_seconds:g} s of a regular "
        "job's request, and its node's backend (workload hooks alone) cannot "
        "checkpoint it without its consent"
    )


def delay_caused(
    held_from: float, now: float, waiters: Iterable[Waiter], jobs: Mapping[str, JobEntry]
) -> float:
    """Seconds regular jobs waited while a backfill job held the turn from
    ``held_from`` to ``now``: each regular waiter's wait within that time."""
    regular = [w for w in waiters if w.job in jobs and not jobs[w.job].backfill]
    return sum(max(0.0, now - max(held_from, w.since)) for w in regular)
