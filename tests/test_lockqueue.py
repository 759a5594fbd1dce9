"""The pure lock queue: rules, refusals, and invariants under random traffic."""

from __future__ import annotations

import contextlib
from collections.abc import Callable

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from workflows.lockqueue import GroupState, LockQueue, QueueError


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
    queue.release("a", 1, now=1.0)
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
    queue.release("a", 1, now=2.0)
    assert queue.state.turn is None
    plan = queue.begin_switch(now=2.0)
    assert [(m.node, m.admit, m.evict) for m in plan.moves] == [("n1", "b", ["a"])]
    assert queue.status().state == "switching"
    grant = queue.finish_switch(now=2.5)
    assert grant is not None and grant.job == "b" and grant.waited_seconds == 1.5


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
        queue.release(grant.job, epoch, now=0.0)
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
        (lambda: queue.release("b", 1, now=1.0), "FAILED_PRECONDITION"),
        (lambda: queue.release("a", 7, now=1.0), "FAILED_PRECONDITION"),
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


class LockQueueMachine(RuleBasedStateMachine):
    """Random joins, acquires, yields, leaves, cancels and switches: the
    invariants of DESIGN.md must hold after every step."""

    def __init__(self) -> None:
        super().__init__()
        self.queue = LockQueue(GroupState(group="g"))
        self.now = 0.0
        self.grants: list[tuple[int, int]] = []  # (epoch, ticket)
        self.requests = 0

    jobs = st.sampled_from(["a", "b", "c", "d"])
    node_sets = st.sampled_from([["n1"], ["n2"], ["n1", "n2"]])

    def tick(self) -> float:
        self.now += 1.0
        return self.now

    def record(self) -> None:
        turn = self.queue.state.turn
        if turn is not None and (not self.grants or self.grants[-1][0] != turn.epoch):
            self.grants.append((turn.epoch, turn.ticket))

    @rule(job=jobs, nodes=node_sets)
    def join(self, job: str, nodes: list[str]) -> None:
        with contextlib.suppress(QueueError):
            self.queue.join(job, nodes, "h", self.tick())

    @rule(job=jobs)
    def acquire(self, job: str) -> None:
        if job not in self.queue.state.jobs:
            return
        self.requests += 1
        try:
            self.queue.request(job, f"r{self.requests}", self.tick())
        except QueueError as refusal:
            assert refusal.code == "FAILED_PRECONDITION"
        self.record()

    @rule()
    def yield_turn(self) -> None:
        turn = self.queue.state.turn
        if turn is not None:
            self.queue.release(turn.job, turn.epoch, self.tick())
            self.record()

    @rule(job=jobs)
    def leave(self, job: str) -> None:
        self.queue.leave(job, self.tick())
        self.record()

    @rule(data=st.data())
    def cancel(self, data: st.DataObject) -> None:
        if self.queue.state.queue:
            waiter = data.draw(st.sampled_from(self.queue.state.queue))
            self.queue.cancel(waiter.job, waiter.request_id, self.tick())
            self.record()

    @precondition(lambda self: self.queue.needs_switch())
    @rule()
    def switch(self) -> None:
        plan = self.queue.begin_switch(self.tick())
        for move in plan.moves:
            # The node's state must leave before the next job's arrives.
            assert move.admit not in move.evict
        self.queue.finish_switch(self.tick())
        self.record()

    @invariant()
    def one_holder_whose_state_is_alone_on_its_nodes(self) -> None:
        state = self.queue.state
        turn = state.turn
        if turn is not None:
            assert turn.job in state.jobs
            for node in state.jobs[turn.job].nodes:
                assert state.resident.get(node) == turn.job
            assert all(w.job != turn.job for w in state.queue)

    @invariant()
    def grants_follow_ticket_order(self) -> None:
        tickets = [ticket for _, ticket in self.grants]
        assert tickets == sorted(tickets)
        epochs = [epoch for epoch, _ in self.grants]
        assert epochs == sorted(set(epochs))

    @invariant()
    def each_job_waits_at_most_once(self) -> None:
        waiting = [w.job for w in self.queue.state.queue]
        assert len(waiting) == len(set(waiting))


TestLockQueueMachine = LockQueueMachine.TestCase
TestLockQueueMachine.settings = settings(max_examples=150, stateful_step_count=40)
