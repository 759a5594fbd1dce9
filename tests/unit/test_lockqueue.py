"""The pure lock queue: rules and refusals, case by case (the invariants under
random traffic are checked through GroupCore's door: test_group_machine.py)."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from tests.lock_queue import LockQueue
from timeshare.models import GroupPolicy
from timeshare.scheduling.base import QueueError
from timeshare.scheduling.state import (
    GroupState,
    StoredPolicy,
    StoredSwitch,
    SwitchPlan,
)


def queue_with(*jobs: tuple[str, list[str]]) -> LockQueue:
    queue = LockQueue(GroupState(group="g"))
    for job, nodes in jobs:
        queue.join(job, nodes, f"hash-{job}", now=0.0)
    return queue


def test_first_grant_admits_the_job_on_its_nodes() -> None:
    queue = queue_with(("a", ["n1", "n2"]))
    assert queue.request("a", "r1", now=1.0) is None
    assert queue.needs_switch()
    plan = queue.begin_switch(now=1.0)
    assert [(m.node, m.admit, m.evict) for m in plan.moves] == [
        ("n1", "a", []),
        ("n2", "a", []),
    ]
    grant = queue.finish_switch(now=1.5)
    assert grant is not None
    assert (grant.job, grant.epoch, grant.ticket, grant.switch_seconds) == ("a", 1, 1, 0.5)
    assert queue.state.resident == {"n1": "a", "n2": "a"}


def test_reacquire_with_nobody_waiting_moves_nothing() -> None:
    queue = queue_with(("a", ["n1"]))
    queue.request("a", "r1", now=0.0)
    queue.begin_switch(now=0.0)
    queue.finish_switch(now=0.1)
    queue.yield_turn("a", 1, now=1.0)
    grant = queue.request("a", "r2", now=2.0)
    assert grant is not None and grant.epoch == 2 and grant.switch_seconds == 0.0
    assert not queue.needs_switch()
    assert queue.state.switches == 1


def test_handover_evicts_the_resident_job_before_granting() -> None:
    queue = queue_with(("a", ["n1"]), ("b", ["n1"]))
    queue.request("a", "ra", now=0.0)
    queue.begin_switch(now=0.0)
    queue.finish_switch(now=0.0)
    assert queue.request("b", "rb", now=1.0) is None
    assert not queue.needs_switch()  # a still holds the turn
    queue.yield_turn("a", 1, now=2.0)
    assert queue.state.turn is None
    plan = queue.begin_switch(now=2.0)
    assert [(m.node, m.admit, m.evict) for m in plan.moves] == [("n1", "b", ["a"])]
    assert queue.status().state == "switching"
    grant = queue.finish_switch(now=2.5)
    assert grant is not None and grant.job == "b" and grant.waited_seconds == 1.5


def handed_from_a_to_b(queue: LockQueue) -> SwitchPlan:
    """a holds its nodes and yields; b waits: the plan that follows."""
    queue.request("a", "ra", now=0.0)
    queue.begin_switch(now=0.0)
    queue.finish_switch(now=0.0)
    queue.request("b", "rb", now=1.0)
    queue.yield_turn("a", 1, now=2.0)
    return queue.begin_switch(now=2.0)


def test_a_job_leaves_every_node_stopped_everywhere_first() -> None:
    queue = queue_with(("a", ["n1", "n2", "n3"]), ("b", ["n2"]))
    plan = handed_from_a_to_b(queue)
    assert [(m.node, m.admit, m.evict) for m in plan.moves] == [
        ("n2", "b", ["a"]),
        ("n1", "", ["a"]),  # b does not need n1 or n3: a leaves them all the same
        ("n3", "", ["a"]),
    ]
    assert [(m.node, m.evict) for m in plan.quiesce_moves()] == [
        ("n2", ["a"]), ("n1", ["a"]), ("n3", ["a"])]  # fmt: skip
    queue.finish_switch(now=2.5)
    assert queue.state.resident == {"n2": "b"}
    queue.yield_turn("b", 2, now=3.0)
    queue.request("a", "ra2", now=3.0)
    again = queue.begin_switch(now=3.0)
    assert [(m.node, m.admit, m.evict) for m in again.moves] == [
        ("n1", "a", []), ("n2", "a", ["b"]), ("n3", "a", [])]  # fmt: skip
    assert again.quiesce_moves() == []  # b leaves one node only


def test_a_leaving_job_stays_on_a_drained_node() -> None:
    queue = queue_with(("a", ["n1", "n2"]), ("b", ["n2"]))
    queue.drain("n1", drained=True, now=0.0)
    queue.request("a", "ra", now=0.0)
    assert not queue.needs_switch()  # a needs the drained node: passed over
    queue.drain("n1", drained=False, now=0.5)
    queue.begin_switch(now=0.5)
    queue.finish_switch(now=0.5)
    queue.drain("n1", drained=True, now=0.6)
    queue.request("b", "rb", now=1.0)
    queue.yield_turn("a", 1, now=2.0)
    plan = queue.begin_switch(now=2.0)
    assert [(m.node, m.admit, m.evict) for m in plan.moves] == [("n2", "b", ["a"])]
    queue.finish_switch(now=2.5)
    assert queue.state.resident == {"n1": "a", "n2": "b"}


def test_a_job_on_one_node_needs_no_quiesce() -> None:
    plan = handed_from_a_to_b(queue_with(("a", ["n1"]), ("b", ["n1", "n2"])))
    assert [(m.node, m.admit, m.evict) for m in plan.moves] == [
        ("n1", "b", ["a"]), ("n2", "b", [])]  # fmt: skip
    assert plan.quiesce_moves() == []


def test_grants_follow_arrival_order() -> None:
    queue = queue_with(("a", ["n"]), ("b", ["n"]), ("c", ["n"]))
    for job in ("a", "c", "b"):
        queue.request(job, f"r{job}", now=0.0)
    order = []
    for epoch in range(1, 4):
        queue.begin_switch(now=0.0)
        grant = queue.finish_switch(now=0.0)
        assert grant is not None
        order.append(grant.job)
        queue.yield_turn(grant.job, epoch, now=0.0)
    assert order == ["a", "c", "b"]


def test_same_request_id_keeps_one_place() -> None:
    queue = queue_with(("a", ["n"]), ("b", ["n"]))
    queue.request("a", "ra", now=0.0)
    queue.request("b", "rb", now=0.0)
    queue.request("b", "rb", now=1.0)
    assert [w.job for w in queue.state.queue] == ["a", "b"]


def test_refusals_leave_the_state_unchanged() -> None:
    queue = queue_with(("a", ["n"]), ("b", ["n"]))
    queue.request("a", "ra", now=0.0)
    queue.begin_switch(now=0.0)
    queue.finish_switch(now=0.0)
    before = queue.state.model_copy(deep=True)
    refusals: list[tuple[Callable[[], object], str]] = [
        (lambda: queue.yield_turn("b", 1, now=1.0), "FAILED_PRECONDITION"),
        (lambda: queue.yield_turn("a", 7, now=1.0), "FAILED_PRECONDITION"),
        (lambda: queue.request("a", "other", now=1.0), "FAILED_PRECONDITION"),
        (lambda: queue.authenticate("a", "wrong"), "UNAUTHENTICATED"),
        (lambda: queue.authenticate("zz", "hash-zz"), "NOT_FOUND"),
        (lambda: queue.join("c", [], "h", now=1.0), "INVALID_ARGUMENT"),
        (lambda: queue.join("c", ["x", "x"], "h", now=1.0), "INVALID_ARGUMENT"),
        (lambda: queue.join("a", ["other"], "h", now=1.0), "FAILED_PRECONDITION"),
    ]
    for call, code in refusals:
        with pytest.raises(QueueError) as refused:
            call()
        assert refused.value.code == code
        assert queue.state == before


def test_a_full_group_refuses_another_job() -> None:
    queue = queue_with(*((f"j{i}", ["n"]) for i in range(64)))
    with pytest.raises(QueueError) as refused:
        queue.join("one-too-many", ["n"], "h", now=0.0)
    assert refused.value.code == "RESOURCE_EXHAUSTED"


def test_leaving_holder_passes_the_turn_on() -> None:
    queue = queue_with(("a", ["n"]), ("b", ["n"]))
    queue.request("a", "ra", now=0.0)
    queue.begin_switch(now=0.0)
    queue.finish_switch(now=0.0)
    queue.request("b", "rb", now=0.0)
    queue.leave("a", now=1.0)
    assert "a" not in queue.state.jobs
    plan = queue.begin_switch(now=1.0)
    assert plan.moves[0].evict == ["a"]


def test_cancelling_the_waiter_being_switched_in_grants_nobody() -> None:
    queue = queue_with(("a", ["n"]), ("b", ["n"]), ("c", ["n"]))
    queue.request("a", "ra", now=0.0)
    queue.request("b", "rb", now=0.0)
    queue.request("c", "rc", now=0.0)
    queue.begin_switch(now=0.0)
    assert queue.cancel("c", "rc", now=0.0)
    assert queue.cancel("a", "ra", now=0.0)
    assert queue.finish_switch(now=1.0) is None
    assert queue.state.turn is None and queue.state.resident == {"n": "a"}
    assert queue.needs_switch()  # b is next, and a's state is on the node
    assert queue.begin_switch(now=1.0).moves[0].evict == ["a"]


def test_a_holder_gets_its_grace_from_when_it_was_first_asked() -> None:
    policy = GroupPolicy(max_turn_seconds=60, preempt_grace_seconds=10)
    queue = LockQueue(GroupState(group="g", policy=StoredPolicy.stored(policy)))
    for job in ("a", "b"):
        queue.join(job, ["n"], "h", now=0.0)
    queue.request("a", "ra", now=0.0)
    queue.begin_switch(now=0.0)
    queue.finish_switch(now=0.0)
    queue.request("b", "rb", now=300.0)  # a held alone for 5 minutes: fine
    assert queue.heartbeat("a", now=300.0).should_yield
    assert queue.expire(now=305.0) == [] and queue.state.turn is not None
    assert queue.next_deadline() == 310.0
    assert queue.expire(now=310.0) == ["preempted a after 310 s"]


def test_a_turn_granted_as_its_caller_left_is_given_back() -> None:
    queue = queue_with(("a", ["n"]), ("b", ["n"]))
    queue.request("a", "ra", now=0.0, call_id="call-1")
    queue.request("a", "ra", now=0.5, call_id="call-2")  # a retry takes the request over
    queue.begin_switch(now=1.0)
    queue.finish_switch(now=1.0)
    assert not queue.cancel("a", "ra", now=2.0, call_id="call-1")  # the old call's withdrawal
    assert queue.state.turn is not None
    assert queue.cancel("a", "ra", now=2.0, call_id="call-2")
    assert queue.state.turn is None and queue.state.yielded == {"a": 1}
    with pytest.raises(QueueError) as late:
        queue.request("a", "ra", now=3.0)  # a late duplicate is not queued again
    assert late.value.code == "FAILED_PRECONDITION"


def test_a_switch_is_quick_when_the_last_one_went_well_on_every_node_in_time() -> None:
    queue = queue_with(("a", ["n1", "n2"]))
    assert not queue.switches_are_quick(1.0)  # nothing to tell by yet

    def switched(epoch: int, node: str, seconds: float, ok: bool = True) -> StoredSwitch:
        return StoredSwitch(
            node=node, epoch=epoch, started_at=10.0, finished_at=10.0 + seconds, ok=ok
        )

    queue.record_switches([switched(1, "n1", 0.2), switched(1, "n2", 0.3)])
    assert queue.switches_are_quick(1.0)
    # One slow node makes the whole switch slow; only the last switch counts.
    queue.record_switches([switched(2, "n1", 0.2), switched(2, "n2", 4.0)])
    assert not queue.switches_are_quick(1.0)
    queue.record_switches([switched(3, "n1", 0.1)])
    assert queue.switches_are_quick(1.0)
    queue.record_switches([switched(4, "n1", 0.1, ok=False)])
    assert not queue.switches_are_quick(1.0)
