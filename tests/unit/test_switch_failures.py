"""What the pure queue decides when a switch keeps failing: back off, give
up within the group's give-up time, evict the job whose state cannot move
and try once more, then tell the waiter why (switch_failures.switch_failed)."""

from __future__ import annotations

import pytest

from tests.lock_queue import LockQueue
from timeshare.models import GroupPolicy
from timeshare.scheduling.base import QueueError
from timeshare.scheduling.rules import RULES_POLICIES
from timeshare.scheduling.state import GroupState, StoredPolicy
from timeshare.scheduling.switch_failures import FailedMove, RetryVerdict

GIVE_UP = 120.0
# Far more than the give-up time allows (pauses double up to 30 s).
MAX_ATTEMPTS = 100
NODE = "n1"


def queue_with_b_waiting_behind_a() -> tuple[LockQueue, float]:
    """a held the node and yielded; b waits, and the switch to b is planned."""
    policy = GroupPolicy(switch_give_up_seconds=GIVE_UP, prefetch="off")
    queue = LockQueue(
        GroupState(group="g", policy=StoredPolicy.stored(policy), rules=RULES_POLICIES)
    )
    now = 1000.0
    for job in ("a", "b"):
        queue.join(job, [NODE], f"hash-{job}", now)
    queue.request("a", "a-1", now)
    plan = queue.begin_switch(now)
    queue.finish_switch(now + 0.1)
    assert plan.waiter.job == "a" and queue.state.resident == {NODE: "a"}
    queue.yield_turn("a", queue.state.epoch, now + 1)
    assert queue.request("b", "b-1", now + 2) is None
    queue.begin_switch(now + 2)
    return queue, now + 2


def checkpoint_fails(queue: LockQueue, now: float, stuck: str = "a") -> RetryVerdict:
    cause = "checkpoint of process 7 failed: CUDA_ERROR_UNKNOWN (unknown error)"
    return queue.switch_failed([FailedMove(NODE, cause, stuck=stuck)], [], [NODE], now)


def fail_until_the_verdict_changes(queue: LockQueue, now: float) -> tuple[RetryVerdict, float]:
    """Fail every attempt, waiting each pause as the workflow does (setting the
    plan aside after five attempts and planning afresh, as it does too)."""
    for _ in range(MAX_ATTEMPTS):
        verdict = checkpoint_fails(queue, now)
        if not verdict.pause:
            return verdict, now
        now += verdict.pause + 1.5  # the activity's own retries
        plan = queue.state.switching
        assert plan is not None
        if plan.attempts >= 5:
            queue.set_switch_aside(now)
            queue.begin_switch(now)
    raise AssertionError(f"still retrying after {MAX_ATTEMPTS} attempts")


def test_a_failing_switch_evicts_the_stuck_job_by_the_give_up_time_then_answers_the_waiter() -> (
    None
):
    queue, start = queue_with_b_waiting_behind_a()
    first = checkpoint_fails(queue, start)
    assert first.pause == 2.0 and not first.evicted and not first.given_up
    assert queue.state.degraded_cause == (
        "switch failing: node n1: checkpoint of process 7 failed: CUDA_ERROR_UNKNOWN "
        "(unknown error) (attempt 1)"
    )
    verdict, now = fail_until_the_verdict_changes(queue, start)
    # Given up once the failures have lasted the give-up time, and not later
    # than the last pause's end (pauses are cut short at the give-up time).
    assert verdict.evicted == ("a",) and start + GIVE_UP <= now <= start + GIVE_UP + 1.5
    assert "a" not in queue.state.jobs and queue.state.releasing == {"a": [NODE]}
    assert "CUDA_ERROR_UNKNOWN" in queue.state.evicted_jobs["a"]
    assert queue.is_waiting("b", "b-1") and queue.state.switching is not None

    # Tried once more at once: b's turn where it fits beside a's state; here
    # the node fails again, and b is told why, naming a and the cause.
    final = checkpoint_fails(queue, now + 1)
    assert final.given_up and queue.state.switching is None
    assert not queue.is_waiting("b", "b-1") and queue.state.failing is None
    with pytest.raises(QueueError) as refused:
        queue.raise_if_aborted("b-1")
    assert refused.value.details is not None and refused.value.details["job"] == "a"
    assert "CUDA_ERROR_UNKNOWN" in refused.value.details["cause"]
    assert "the state of job a could not be moved" in refused.value.message
    assert queue.state.degraded_cause == ""


def test_a_node_that_names_no_job_ends_the_wait_naming_the_job_it_was_to_move() -> None:
    queue, start = queue_with_b_waiting_behind_a()
    now = start
    for _ in range(MAX_ATTEMPTS):
        verdict = checkpoint_fails(queue, now, stuck="")
        if verdict.given_up:
            break
        assert not verdict.evicted  # no job to blame: nobody is evicted
        now += verdict.pause
    assert now - start <= GIVE_UP and set(queue.state.jobs) == {"a", "b"}
    with pytest.raises(QueueError) as refused:
        queue.raise_if_aborted("b-1")
    assert refused.value.details is not None and refused.value.details["job"] == "a"


def test_a_switch_that_works_ends_the_run_of_failures() -> None:
    queue, start = queue_with_b_waiting_behind_a()
    for attempt in range(3):
        checkpoint_fails(queue, start + 10 * attempt)
    assert queue.state.failing is not None and queue.state.failing.attempts == 3
    queue.finish_switch(start + 100)
    assert queue.state.failing is None and queue.state.degraded_cause == ""
    # The next failing switch starts its own run: no give-up carried over.
    queue.yield_turn("b", queue.state.epoch, start + 101)
    queue.request("a", "a-2", start + 200)
    queue.begin_switch(start + 200)
    verdict = checkpoint_fails(queue, start + 200, stuck="b")
    assert verdict.pause == 2.0 and queue.state.failing is not None
    assert queue.state.failing.since == start + 200


def test_a_failed_restore_ends_the_wait_at_once_naming_the_waiter() -> None:
    queue, start = queue_with_b_waiting_behind_a()
    failure = FailedMove(NODE, "restore failed: out of memory", restore_failed=True)
    verdict = queue.switch_failed([failure], [], [NODE], start)
    assert verdict.given_up
    with pytest.raises(QueueError) as refused:
        queue.raise_if_aborted("b-1")
    assert refused.value.details == {"job": "b", "cause": "node n1: restore failed: out of memory"}


def test_a_failing_prefetch_evicts_nobody_and_stops_prefetching() -> None:
    policy = GroupPolicy(switch_give_up_seconds=1.0)
    queue = LockQueue(
        GroupState(group="g", policy=StoredPolicy.stored(policy), rules=RULES_POLICIES)
    )
    now = 1000.0
    for job in ("a", "b"):
        queue.join(job, [NODE], f"hash-{job}", now)
    for job in ("a", "b"):  # each holds once, so that the one away longest can be told
        queue.request(job, f"{job}-1", now)
        queue.begin_switch(now)
        queue.finish_switch(now)
        queue.yield_turn(job, queue.state.epoch, now + 1)
        now += 2
    target = queue.prefetch_target(now)
    assert target == "a"
    for attempt in range(3):
        queue.begin_prefetch(target, now + 10 * attempt)
        verdict = checkpoint_fails(queue, now + 10 * attempt, stuck="b")
        assert not verdict.evicted and not verdict.given_up
        queue.abort_switch("", now + 10 * attempt)
    assert set(queue.state.jobs) == {"a", "b"}
    assert queue.prefetch_target(now + 100) is None  # switches fail here: no more guesses
