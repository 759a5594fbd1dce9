"""The pure lock queue: rules, refusals, and invariants under random traffic."""

from __future__ import annotations

import contextlib
from collections.abc import Callable

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from timeshare.models import GroupPolicy
from timeshare.scheduling.base import QueueError
from timeshare.scheduling.queue import LockQueue
from timeshare.scheduling.state import (
    GroupState,
    StoredMove,
    StoredPolicy,
    StoredSwitch,
    SwitchPlan,
)
from timeshare.scheduling.switch_failures import FailedMove

# Short, so that random traffic reaches the give-up of failing switches.
GIVE_UP_SECONDS = 5.0


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


def handed_from_a_to_b(queue: LockQueue) -> SwitchPlan:
    """a holds its nodes and yields; b waits: the plan that follows."""
    queue.request("a", "ra", now=0.0)
    queue.begin_switch(now=0.0)
    queue.finish_switch(now=0.0)
    queue.request("b", "rb", now=1.0)
    queue.release("a", 1, now=2.0)
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
    queue.release("b", 2, now=3.0)
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
    queue.release("a", 1, now=2.0)
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
    assert queue.state.turn is None and queue.state.released == {"a": 1}
    with pytest.raises(QueueError) as late:
        queue.request("a", "ra", now=3.0)  # a late duplicate is not queued again
    assert late.value.code == "FAILED_PRECONDITION"


class LockQueueMachine(RuleBasedStateMachine):
    """Random interleavings of join, acquire, yield, heartbeat, lease expiry,
    turn-limit preemption, leave, eviction, timeout, failed switches and
    prefetches (switches nobody asked for yet).

    Beside the queue, the machine keeps what the nodes really hold, moved only
    by switches as an agent would move it; the invariants are checked against
    that, not against the queue's own belief."""

    def __init__(self) -> None:
        super().__init__()
        policy = GroupPolicy(
            lease_seconds=30, max_turn_seconds=20, preempt_grace_seconds=5,
            switch_give_up_seconds=GIVE_UP_SECONDS,
        )  # fmt: skip
        self.queue = LockQueue(GroupState(group="g", policy=StoredPolicy.stored(policy)))
        self.now = 0.0
        self.grants: list[tuple[int, int]] = []  # (epoch, ticket)
        self.requests = 0
        self.open_requests: set[str] = set()
        self.device: dict[str, set[str]] = {}

    jobs = st.sampled_from(["a", "b", "c", "d"])
    node_sets = st.sampled_from([["n1"], ["n2"], ["n1", "n2"]])

    def tick(self, seconds: float = 1.0) -> float:
        self.now += seconds
        return self.now

    def record(self) -> None:
        turn = self.queue.state.turn
        if turn is not None and (not self.grants or self.grants[-1][0] != turn.epoch):
            self.grants.append((turn.epoch, turn.ticket))
            self.open_requests.discard(turn.request_id)

    @rule(job=jobs, nodes=node_sets)
    def join(self, job: str, nodes: list[str]) -> None:
        with contextlib.suppress(QueueError):
            self.queue.join(job, nodes, "h", self.tick())

    @rule(job=jobs)
    def acquire(self, job: str) -> None:
        if job not in self.queue.state.jobs:
            return
        self.requests += 1
        request_id = f"r{self.requests}"
        try:
            self.queue.request(job, request_id, self.tick())
            self.open_requests.add(request_id)
        except QueueError as refusal:
            assert refusal.code == "FAILED_PRECONDITION"
        self.record()

    @rule()
    def yield_turn(self) -> None:
        turn = self.queue.state.turn
        if turn is not None:
            self.queue.release(turn.job, turn.resumes_epoch or turn.epoch, self.tick())
            self.record()

    @rule(job=jobs)
    def heartbeat(self, job: str) -> None:
        if job in self.queue.state.jobs:
            self.queue.heartbeat(job, self.tick())

    @rule(seconds=st.floats(min_value=0, max_value=40))
    def time_passes(self, seconds: float) -> None:
        self.queue.expire(self.tick(seconds))
        self.record()

    @rule(job=jobs)
    def leave(self, job: str) -> None:
        self.queue.leave(job, self.tick())
        self.record()

    @rule(job=jobs)
    def evict(self, job: str) -> None:
        self.queue.evict(job, "operator", self.tick())
        self.record()

    @rule(data=st.data())
    def time_out(self, data: st.DataObject) -> None:
        if self.queue.state.queue:
            waiter = data.draw(st.sampled_from(self.queue.state.queue))
            self.queue.cancel(waiter.job, waiter.request_id, self.tick())
            self.record()

    @rule()
    def granted_caller_goes_away(self) -> None:
        turn = self.queue.state.turn
        if turn is not None and not turn.resumes_epoch:
            assert self.queue.cancel(turn.job, turn.request_id, self.tick())
            self.record()

    @precondition(lambda self: self.queue.needs_switch())
    @rule(outcome=st.sampled_from(["ok", "checkpoint fails", "restore fails"]), data=st.data())
    def switch(self, outcome: str, data: st.DataObject) -> None:
        plan = self.queue.begin_switch(self.tick())
        nodes = [move.node for move in plan.moves]
        if outcome == "ok":
            self.move_state(plan.moves, nodes)
            self.queue.finish_switch(self.tick())
        else:
            failed = data.draw(st.lists(st.sampled_from(nodes), min_size=1, unique=True))
            done = [node for node in nodes if node not in failed]
            self.move_state(plan.moves, done)
            if outcome == "restore fails":
                for node in failed:  # checkpointed, but nothing came back
                    self.device[node] = set()
            failures = [
                FailedMove(
                    node=move.node,
                    cause=outcome,
                    stuck=move.evict[0] if move.evict and outcome != "restore fails" else "",
                    restore_failed=outcome == "restore fails",
                )
                for move in plan.moves
                if move.node in failed
            ]
            verdict = self.queue.switch_failed(failures, done, failed, self.tick())
            # A failed restore ends the request at once; other failures only
            # once the run of failures has lasted the give-up time, and then
            # always: nobody waits on a failing switch for ever.
            assert verdict.given_up or outcome != "restore fails"
            assert verdict.given_up == (self.queue.state.switching is None)
            run = self.queue.state.failing
            if not verdict.given_up and not verdict.evicted:
                assert run is not None and self.now - run.since < GIVE_UP_SECONDS
                assert 0 < verdict.pause <= self.now - run.since + GIVE_UP_SECONDS
        self.record()

    @precondition(lambda self: self.queue.state.switching is not None)
    @rule()
    def retry_switch(self) -> None:
        plan = self.queue.state.switching
        assert plan is not None
        if not self.queue.switch_target_waits():
            self.queue.abort_switch("", self.tick())
        else:
            self.move_state(plan.moves, [move.node for move in plan.moves])
            self.queue.finish_switch(self.tick())
        self.record()

    @rule(job=jobs)
    def prefetch(self, job: str) -> None:
        """Any job may be brought in ahead of its request while the group is
        idle (which one is worth it is LockQueue.prefetch_target's guess)."""
        with contextlib.suppress(QueueError):
            self.queue.begin_prefetch(job, self.tick())

    @precondition(
        lambda self: self.queue.state.switching is not None and self.queue.state.switching.prefetch
    )
    @rule(ok=st.booleans(), data=st.data())
    def end_prefetch(self, ok: bool, data: st.DataObject) -> None:
        plan = self.queue.state.switching
        assert plan is not None
        nodes = [move.node for move in plan.moves]
        if ok:
            self.move_state(plan.moves, nodes)
            self.queue.finish_switch(self.tick(), restored=True)
        else:
            failed = data.draw(st.lists(st.sampled_from(nodes), min_size=1, unique=True))
            done = [node for node in nodes if node not in failed]
            self.move_state(plan.moves, done)
            failures = [FailedMove(node=node, cause="checkpoint fails") for node in failed]
            verdict = self.queue.switch_failed(failures, done, failed, self.tick())
            assert not verdict.given_up and not verdict.evicted  # nobody waits for a prefetch
            self.queue.abort_switch("", self.tick())
        self.record()

    def move_state(self, moves: list[StoredMove], nodes: list[str]) -> None:
        for move in moves:
            if move.node in nodes:
                self.device[move.node] = {move.admit} if move.admit else set()

    @invariant()
    def one_holder_whose_state_is_alone_on_its_nodes(self) -> None:
        state = self.queue.state
        turn = state.turn
        if turn is not None:
            assert turn.job in state.jobs
            for node in state.jobs[turn.job].nodes:
                assert self.device.get(node) == {turn.job}, (node, self.device)
            assert all(w.job != turn.job for w in state.queue)

    @invariant()
    def grants_follow_ticket_order(self) -> None:
        tickets = [ticket for _, ticket in self.grants]
        assert tickets == sorted(tickets)
        epochs = [epoch for epoch, _ in self.grants]
        assert epochs == sorted(set(epochs))

    @invariant()
    def each_waiter_is_a_member_waiting_once(self) -> None:
        waiting = [w.job for w in self.queue.state.queue]
        assert len(waiting) == len(set(waiting))
        assert set(waiting) <= set(self.queue.state.jobs)

    def teardown(self) -> None:
        """Every request still open is either granted in the end or was ended
        (timed out, left, evicted, aborted): none waits forever."""
        for _ in range(100):
            if self.queue.state.switching is not None:
                self.retry_switch()
            elif self.queue.state.turn is not None:
                self.yield_turn()
            elif self.queue.needs_switch():
                self.switch("ok", None)
            else:
                break
        else:
            raise AssertionError(f"the queue never settled: {self.queue.state}")
        assert not self.queue.state.queue, f"requests wait forever: {self.queue.state.queue}"


TestLockQueueMachine = LockQueueMachine.TestCase
TestLockQueueMachine.settings = settings(max_examples=500, stateful_step_count=50, deadline=None)


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
