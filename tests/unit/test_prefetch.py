"""Prefetch: while a group's GPUs sit idle, the job expected to ask next is
brought onto them before it asks, so that its acquire is granted at once.

Here the tests that start no process; the others are in
tests/integration/test_prefetch.py."""

from __future__ import annotations

import pytest

from tests.lock_queue import LockQueue
from timeshare.models import GroupPolicy
from timeshare.scheduling.base import QueueError
from timeshare.scheduling.prefetch import PrefetchChoice
from timeshare.scheduling.rules import RULES_POLICIES
from timeshare.scheduling.state import GroupState, StoredPolicy
from timeshare.scheduling.switch_failures import FailedMove
from timeshare.scheduling.versions import PREFETCH_GUESS, PREFETCH_PAST_DEPARTED

# A GRPO-like job: sampling, the reward on the CPU, then training and at once
# the next iteration's sampling; two such jobs take turns.
REWARD_SECONDS = 1.5


def policy_queue(prefetch: str = "auto", rules: int = RULES_POLICIES) -> LockQueue:
    policy = StoredPolicy.stored(GroupPolicy(prefetch=prefetch))  # type: ignore[arg-type]
    queue = LockQueue(GroupState(group="g", rules=rules, policy=policy))
    for job in ("a", "b"):
        queue.join(job, ["n1"], f"hash-{job}", now=0.0)
    return queue


def held(queue: LockQueue, job: str, phase: str, at: float) -> int:
    """The job asks at ``at`` and is switched in if it must be; returns the
    epoch it holds."""
    queue.request(job, f"{job}-{phase}-{at}", now=at, phase=phase)
    if queue.needs_switch():
        queue.begin_switch(now=at)
        queue.finish_switch(now=at, restored=True)
    granted = queue.state.turn
    assert granted is not None and granted.job == job
    return granted.epoch


def turn(queue: LockQueue, job: str, phase: str, at: float, hold: float = 0.5) -> float:
    """The job asks at ``at``, is switched in if it must be, holds, yields;
    returns when it yielded."""
    queue.yield_turn(job, held(queue, job, phase, at), now=at + hold)
    return at + hold


def block(queue: LockQueue, job: str, at: float) -> float:
    """Training, then at once sampling: returns when the job yielded."""
    return turn(queue, job, "sample", turn(queue, job, "train", at))


def learned(queue: LockQueue) -> float:
    """Both jobs have shown their pattern: each asks for training 1.5 s
    after it yields sampling, and for sampling as soon as it yields training.
    b yielded sampling just now (4.5, returned); a is due at 5.0, b at 6.0."""
    a_done = block(queue, "a", 0.0)  # a: 0.0 - 1.0
    b_done = block(queue, "b", a_done)  # b: 1.0 - 2.0
    a_done = block(queue, "a", a_done + REWARD_SECONDS)  # a: 2.5 - 3.5
    return block(queue, "b", b_done + REWARD_SECONDS)  # b: 3.5 - 4.5


def test_an_idle_gpu_takes_in_the_job_expected_to_ask_next() -> None:
    queue = policy_queue()
    now = learned(queue)
    assert now == pytest.approx(4.5)
    assert queue.expected_ask("a", now) == pytest.approx(5.0)
    assert queue.expected_ask("b", now) == pytest.approx(6.0)
    assert queue.prefetch_target(now) == "a"
    plan = queue.begin_prefetch("a", now)
    assert plan.prefetch and [(m.node, m.admit, m.evict) for m in plan.moves] == [
        ("n1", "a", ["b"])
    ]
    assert queue.status(now).state == "switching"
    assert queue.finish_switch(now + 0.1, restored=True) is None
    assert queue.state.turn is None and queue.state.resident == {"n1": "a"}
    assert queue.prefetch_target(now + 0.1) is None  # a is there already
    grant = queue.request("a", "a-train", now=5.0, phase="train")
    assert grant is not None and grant.switch_seconds == 0.0
    # Its state did come back from host memory, ahead of the request.
    assert grant.context_restored


def test_no_prefetch_while_the_yielder_is_expected_back_first() -> None:
    queue = policy_queue()
    now = learned(queue)
    # a trains and yields: it is expected to ask for sampling at once.
    yielded = turn(queue, "a", "train", now + 0.5)
    assert queue.expected_ask("a", yielded) == pytest.approx(yielded)
    assert queue.prefetch_target(yielded) is None


def test_a_job_that_asks_during_a_prefetch_waits_and_is_switched_back() -> None:
    queue = policy_queue()
    now = learned(queue)
    queue.begin_prefetch("a", now)
    assert queue.request("b", "b-early", now=now + 0.05, phase="train") is None
    assert not queue.needs_switch()  # the prefetch completes first
    assert queue.finish_switch(now + 0.1) is None
    assert queue.needs_switch()
    plan = queue.begin_switch(now + 0.1)
    assert [(m.node, m.admit, m.evict) for m in plan.moves] == [("n1", "b", ["a"])]
    grant = queue.finish_switch(now + 0.2)
    assert grant is not None and grant.job == "b"


def test_the_prefetched_job_asking_meanwhile_is_granted_when_it_ends() -> None:
    queue = policy_queue()
    now = learned(queue)
    queue.begin_prefetch("a", now)
    assert queue.request("a", "a-early", now=now + 0.05, phase="train") is None
    grant = queue.finish_switch(now + 0.1, restored=True)
    # Not the prefetch's grant: a's own request, granted once a was there.
    assert grant is None
    turn_now = queue.state.turn
    assert turn_now is not None and turn_now.job == "a" and turn_now.context_restored


def test_a_failed_prefetch_refuses_nobody_and_leaves_what_the_node_said() -> None:
    queue = policy_queue()
    now = learned(queue)
    queue.begin_prefetch("a", now)
    failure = FailedMove(node="n1", cause="restore failed", restore_failed=True)
    queue.switch_failed([failure], done=[], failed=["n1"], now=now + 0.1)
    assert queue.state.switching is None and not queue.state.aborted_requests
    assert set(queue.state.jobs) == {"a", "b"}
    # The node's state is uncertain: the next grant there switches first.
    grant = queue.request("b", "b-next", now=now + 1.0, phase="train")
    assert grant is None and queue.needs_switch()


@pytest.mark.parametrize(
    ("prefetch", "rules"), [("off", RULES_POLICIES), ("auto", 1)], ids=["off", "legacy group"]
)
def test_groups_without_prefetch_never_plan_one(prefetch: str, rules: int) -> None:
    queue = policy_queue(prefetch, rules)
    now = learned(queue)
    assert queue.prefetch_target(now) is None


def test_a_job_that_left_gives_its_memory_to_the_job_expected_next() -> None:
    queue = policy_queue()
    now = learned(queue)
    # a trains and yields, expected back at once: nothing moves for b ...
    yielded = turn(queue, "a", "train", now + 0.5)
    assert queue.prefetch_target(yielded) is None
    # ... until a leaves: it never asks again, so b comes in before it asks.
    queue.leave("a", yielded)
    assert queue.state.resident == {"n1": "a"}
    # (A job that left held the prefetch up before that change: the rule is named.)
    assert queue.prefetch_choice(yielded) == PrefetchChoice("b", (PREFETCH_PAST_DEPARTED,))
    plan = queue.begin_prefetch("b", yielded)
    assert [(m.node, m.admit, m.evict) for m in plan.moves] == [("n1", "b", ["a"])]


def test_nothing_is_prefetched_for_a_job_that_never_held_a_turn_or_is_overdue() -> None:
    queue = policy_queue()
    turn(queue, "a", "sample", 0.0)
    assert queue.prefetch_target(0.5) is None  # b has never had a turn to come back to
    learned(queue)
    # a was due at 5.0; long after, it is no longer expected.
    assert queue.expected_ask("a", 20.0) is None


def test_with_no_request_known_the_job_away_longest_comes_in() -> None:
    """Each job's first iteration: nobody has shown when it asks again, so the
    job that left the GPUs first is guessed to come back first."""
    queue = policy_queue()
    turn(queue, "b", "sample", 0.0)  # b: 0.0 - 0.5
    now = turn(queue, "a", "sample", 0.6)  # a is switched in: 0.6 - 1.1
    assert queue.expected_ask("a", now) is None and queue.expected_ask("b", now) is None
    assert queue.prefetch_choice(now) == PrefetchChoice("b", (PREFETCH_GUESS,))
    plan = queue.begin_prefetch("b", now)
    assert [(m.node, m.admit, m.evict) for m in plan.moves] == [("n1", "b", ["a"])]
    queue.finish_switch(now + 0.1, restored=True)
    # b is in; a, which left later, does not push it out again.
    assert queue.prefetch_target(now + 0.1) is None


def test_the_guess_follows_the_order_in_which_jobs_left() -> None:
    queue = policy_queue()
    queue.join("c", ["n1"], "hash-c", now=0.0)
    now = 0.0
    for job in ("c", "b", "a"):
        now = turn(queue, job, "sample", now + 0.1)
    assert queue.prefetch_target(now) == "c"  # left first
    queue.begin_prefetch("c", now)
    queue.finish_switch(now + 0.1, restored=True)
    assert queue.prefetch_target(now + 0.1) is None  # b and a left after c
    # Once c has asked again, its next request is known: no more guessing;
    # c, expected back, keeps its state.
    now = turn(queue, "c", "sample", now + 0.2)
    assert queue.expected_ask("c", now) is not None
    assert queue.prefetch_target(now) is None


def test_no_prefetch_while_a_request_waits_or_a_turn_is_held() -> None:
    queue = policy_queue()
    now = learned(queue)
    queue.request("b", "b-held", now=now, phase="train")
    assert queue.state.turn is not None
    assert queue.prefetch_target(now) is None
    with pytest.raises(QueueError, match="no prefetch"):
        queue.begin_prefetch("a", now)


def test_ask_gaps_are_kept_per_phase_and_bounded() -> None:
    queue = policy_queue()
    for index in range(40):
        at = index * 2.0
        turn(queue, "a", f"phase-{index}", at)
    gaps = queue.state.jobs["a"].ask_gaps
    assert len(gaps) == 16 and "phase-38" in gaps and "phase-0" not in gaps
    assert gaps["phase-38"] == pytest.approx(1.5)


def test_a_job_that_stopped_asking_is_not_expected_for_long() -> None:
    queue = policy_queue()
    learned(queue)
    # a is due at 5.0 after a gap of 1.5 s: still expected a little after,
    assert queue.expected_ask("a", 5.2) == pytest.approx(5.0)
    # no longer once it is late by more than a quarter of its gap.
    assert queue.expected_ask("a", 5.5) is None
