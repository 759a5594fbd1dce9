"""What follows a failed switch attempt: back off, give up, evict, answer."""

from __future__ import annotations

from dataclasses import dataclass

from timeshare.scheduling import membership, moves, switching
from timeshare.scheduling.base import (
    UNKNOWN_RESIDENT,
    Group,
)
from timeshare.scheduling.state import SwitchAbort, SwitchFailing

# The longest pause between two attempts of a failing switch.
SWITCH_RETRY_PAUSE_MAX_SECONDS = 30.0
# A failure this long after the last one starts a new run of failures: the
# longest pause between attempts, and then some.
SWITCH_RUN_GAP_SECONDS = 2 * SWITCH_RETRY_PAUSE_MAX_SECONDS


@dataclass(frozen=True)
class FailedMove:
    """What a node said when its part of a switch failed: ``stuck``, the job
    whose state it could not move off (a checkpoint or a lock failed)."""

    node: str
    cause: str
    stuck: str = ""
    # The admitted job's state could not come back there.
    restore_failed: bool = False


@dataclass(frozen=True)
class RetryVerdict:
    """What follows a failed switch attempt (switch_failed):
    try again after ``pause`` seconds; or at once, the jobs in ``evicted``
    having been evicted because their state could not be moved; or nothing,
    ``given_up``: the waiter was told why (or nobody waits any more)."""

    pause: float = 0.0
    evicted: tuple[str, ...] = ()
    given_up: bool = False


def switch_failed(
    group: Group,
    failures: list[FailedMove],
    done: list[str],
    failed: list[str],
    now: float,
) -> RetryVerdict:
    """Record an attempt that some nodes could not complete (the nodes
    that finished hold the admitted job now; the others are uncertain)
    and decide what follows. Attempts fail in a run that lasts until one
    succeeds; the run is given up after the policy's
    switch_give_up_seconds. Then the jobs whose state could not be moved
    are evicted and the switch tried once more, at once: the waiter gets
    the GPUs if it fits beside what is left there. If that fails too, or
    no node named a job to blame, the waiter is told why (SwitchAbort)."""
    state = group.state
    plan = moves.current_plan(state)
    plan.attempts += 1
    for move in plan.moves:
        if move.node in done:
            moves.now_resident(state, move)
        elif move.node in failed:
            state.resident[move.node] = UNKNOWN_RESIDENT
    cause = "; ".join(f"node {f.node}: {f.cause}" for f in failures)
    if failures and all(f.restore_failed for f in failures):
        # Every other job's state is off these nodes, but this job's
        # state could not come back: it cannot have its turn.
        switching.abort_switch(
            group,
            f"its state could not be restored: {cause}",
            now,
            SwitchAbort(job=plan.waiter.job, cause=cause),
        )
        return RetryVerdict(given_up=True)
    run = state.failing
    give_up = state.policy.switch_give_up_seconds
    if run is None or now - run.last_at > SWITCH_RUN_GAP_SECONDS:
        run = state.failing = SwitchFailing(since=now)
    run.attempts += 1
    run.last_at = now
    run.cause = cause
    for failure in failures:
        if failure.stuck and failure.stuck != plan.waiter.job:
            run.stuck[failure.stuck] = f"node {failure.node}: {failure.cause}"
    state.degraded_cause = f"switch failing: {cause} (attempt {run.attempts})"
    if plan.prefetch:
        # Nobody waits: nothing to give up on, and nobody to evict for.
        return RetryVerdict(pause=min(SWITCH_RETRY_PAUSE_MAX_SECONDS, 2.0**plan.attempts))
    given_up_at = run.since + give_up
    if now < given_up_at:
        pause = min(SWITCH_RETRY_PAUSE_MAX_SECONDS, 2.0**plan.attempts, given_up_at - now)
        return RetryVerdict(pause=max(0.0, pause))
    stuck = sorted(job for job in run.stuck if job in state.jobs)
    if stuck and not run.stuck_evicted:
        run.stuck_evicted = True
        for job in stuck:
            membership.evict_failed(
                group,
                job,
                f"its state could not be moved off the GPU for {give_up:g} s "
                f"({run.stuck[job]}); its processes run again",
                now,
            )
        return RetryVerdict(evicted=tuple(stuck))
    # Where no node named a job (its agent did not answer, say): the jobs
    # those nodes were to move off, else the waiter's own.
    suspects = {job for m in plan.moves if m.node in failed for job in m.evict}
    blamed = sorted(run.stuck) or sorted(suspects) or [plan.waiter.job]
    abort = SwitchAbort(job=", ".join(blamed), cause=cause)
    switching.abort_switch(
        group,
        f"the switch to job {plan.waiter.job!r} failed for {now - run.since:.0f} s "
        f"(attempt {run.attempts}), the state of job {abort.job} could not be moved: "
        f"{cause}; see `timeshare status {state.group}`, mend the cause and acquire again",
        now,
        abort,
    )
    return RetryVerdict(given_up=True)
