"""Who is in the group: joining, job tokens, leaving and eviction."""

from __future__ import annotations

import hmac

from timeshare.refusals import Refusal
from timeshare.scheduling import ordering, turns
from timeshare.scheduling.base import (
    MAX_JOBS_PER_GROUP,
    MAX_NODES_PER_JOB,
    Group,
    QueueError,
    decides_by_policies,
    remember,
    rules_of,
)
from timeshare.scheduling.state import GroupState, JobEntry


def check_join(state: GroupState, job: str, nodes: list[str], backfill: bool = False) -> None:
    if backfill and not decides_by_policies(state):
        raise QueueError(
            Refusal.FAILED_PRECONDITION,
            f"group {state.group!r} was created before scheduling policies: "
            "it takes no backfill jobs",
        )
    if not nodes:
        raise QueueError(Refusal.INVALID_ARGUMENT, f"job {job!r} names no nodes")
    if len(nodes) > MAX_NODES_PER_JOB:
        raise QueueError(
            Refusal.INVALID_ARGUMENT,
            f"nodes: at most {MAX_NODES_PER_JOB} per job, got {len(nodes)}",
        )
    if len(set(nodes)) != len(nodes):
        raise QueueError(Refusal.INVALID_ARGUMENT, f"nodes: {nodes} names a node twice")
    entry = state.jobs.get(job)
    if entry is None and len(state.jobs) >= MAX_JOBS_PER_GROUP:
        raise QueueError(
            Refusal.RESOURCE_EXHAUSTED,
            f"group {state.group!r} already has {MAX_JOBS_PER_GROUP} jobs",
        )
    if entry is not None and sorted(entry.nodes) != sorted(nodes) and _is_active(state, job):
        raise QueueError(
            Refusal.FAILED_PRECONDITION,
            f"job {job!r} holds or waits for the turn; yield before changing its nodes",
        )


def join(
    group: Group,
    job: str,
    nodes: list[str],
    token_hash: str,
    now: float,
    weight: float = 1.0,
    priority: int = 0,
    backfill: bool = False,
) -> bool:
    """Add or refresh a job; returns True when the job is new. A newcomer's
    share starts level with the least-served member's, so that it cannot
    take the GPU for as long as the others have had it."""
    state = group.state
    check_join(state, job, nodes, backfill)
    group.clock = now
    state.evicted_jobs.pop(job, None)
    # Back before its agents let its processes go: they need not.
    state.releasing.pop(job, None)
    state.releasing_incarnation.pop(job, None)
    entry = state.jobs.get(job)
    if entry is None:
        state.incarnations += 1
        state.jobs[job] = JobEntry(
            incarnation=state.incarnations,
            nodes=list(nodes),
            token_hash=token_hash,
            joined_at=now,
            last_seen=now,
            weight=weight,
            priority=priority,
            backfill=backfill,
            share_seconds=ordering.level_share(e.share_seconds for e in state.jobs.values()),
        )
        return True
    if entry.backfill and not backfill and rules_of(state).steady_deadlines:
        # Its share counted turns no regular job contended for: it starts
        # level, as a newcomer does.
        regular = (e.share_seconds for j, e in state.jobs.items() if j != job and not e.backfill)
        entry.share_seconds = ordering.level_share(regular)
    entry.nodes = list(nodes)
    entry.token_hash = token_hash
    entry.last_seen = now
    entry.weight, entry.priority, entry.backfill = weight, priority, backfill
    return False


def authenticate(state: GroupState, job: str, token_hash: str) -> JobEntry:
    entry = state.jobs.get(job)
    if entry is None:
        reason = state.evicted_jobs.get(job)
        if reason is not None:
            raise QueueError(Refusal.ABORTED, f"job {job!r} was evicted: {reason}; join again")
        raise QueueError(
            Refusal.NOT_FOUND, f"job {job!r} is not in group {state.group!r}; Join first"
        )
    if hmac.compare_digest(entry.token_hash, token_hash):
        return entry
    owner = _token_owner(state, token_hash)
    if owner is not None:
        raise QueueError(
            Refusal.PERMISSION_DENIED,
            f"the job token given belongs to job {owner!r}, not {job!r}; "
            "each job acts only with the token its own Join returned",
        )
    raise QueueError(
        Refusal.UNAUTHENTICATED,
        f"wrong or missing job token for job {job!r}; Join again for one",
    )


def _token_owner(state: GroupState, token_hash: str) -> str | None:
    for name, entry in state.jobs.items():
        if hmac.compare_digest(entry.token_hash, token_hash):
            return name
    return None


def leave(group: Group, job: str, now: float) -> None:
    _remove(group, job, now, reason="")


def evict(group: Group, job: str, reason: str, now: float) -> bool:
    """Take a job out of its group; its waiting requests are told ``reason``."""
    state = group.state
    if job not in state.jobs:
        return False
    _remove(group, job, now, reason)
    state.evictions += 1
    return True


def evict_failed(group: Group, job: str, reason: str, now: float) -> None:
    """A job whose state is lost for good (a process's CUDA state FAILED):
    evicted, and left out of the switch under way, so that its retry does
    not act on it again (its agents release what is left of it)."""
    state = group.state
    evict(group, job, reason, now)
    plan = state.switching
    if plan is not None:
        for move in plan.moves:
            move.evict = [j for j in move.evict if j != job]


def release_done(state: GroupState, job: str, node: str, incarnation: int = 0) -> None:
    """The node's agent released the job's processes (or could not be
    reached). The end of an earlier incarnation's release changes nothing:
    the job joined and left again since, and that release is its own."""
    if state.releasing_incarnation.get(job, 0) != incarnation:
        return
    nodes = [n for n in state.releasing.get(job, []) if n != node]
    if nodes:
        state.releasing[job] = nodes
    else:
        state.releasing.pop(job, None)
        state.releasing_incarnation.pop(job, None)


def _remove(group: Group, job: str, now: float, reason: str) -> None:
    state = group.state
    if job not in state.jobs:
        return
    turn = state.turn
    if turn is not None and turn.job == job:
        turns.charge(state, job, turn, now)
        turns.end_turn(state, turn, now, "evicted" if reason else "left")
        state.turn = None
        state.since = now
    if reason:
        for waiter in state.queue:
            if waiter.job == job:
                remember(state.aborted_requests, waiter.request_id, reason)
        remember(state.evicted_jobs, job, reason)
    state.queue = [w for w in state.queue if w.job != job]
    state.yielded.pop(job, None)
    state.served_requests.pop(job, None)
    where = set(state.jobs[job].nodes)
    where |= {node for node, resident in state.resident.items() if resident == job}
    state.releasing[job] = sorted(where)
    state.releasing_incarnation[job] = state.jobs[job].incarnation
    del state.jobs[job]
    turns.grant_ready(group, now)


def _is_active(state: GroupState, job: str) -> bool:
    turn = state.turn
    return (turn is not None and turn.job == job) or any(w.job == job for w in state.queue)
