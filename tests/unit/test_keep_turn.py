"""Job.next_turn_nowait: a holder goes on into its next phase on the GPUs it
holds while the message that says so travels (turns.keep_turn, the
KeepTurn call). It never passes the turn on while the job computes: where a
next_turn would have let others go first, the holder is asked to yield.

Here the tests that start no process; the others are in
tests/integration/test_keep_turn.py."""

from __future__ import annotations

import grpc
import pytest
from temporalio.client import WorkflowUpdateFailedError
from temporalio.exceptions import ApplicationError

from tests.unit.test_prefetch import held, policy_queue
from timeshare._protocol import LeaseClock, Turn, apply_notice, may_keep_turn
from timeshare.errors import Unimplemented, from_rpc_error
from timeshare.refusals import Refusal
from timeshare.scheduling.base import QueueError
from timeshare.v1 import timeshare_pb2 as pb
from timeshare.workers.gateway.errors import unknown_update


def test_with_nobody_waiting_the_turn_goes_on_into_the_next_phase() -> None:
    queue = policy_queue()
    epoch = held(queue, "a", "train", 1.0)
    grants = queue.state.grants
    state = queue.state
    assert queue.keep_turn("a", epoch, "sample", 2.0) == (False, 1.0)
    # Tried on a copy: what the workflow holds of the state stays the state.
    assert queue.state is state
    turn = queue.state.turn
    assert turn is not None and (turn.job, turn.epoch, turn.phase) == ("a", epoch, "sample")
    assert turn.granted_at == 2.0  # the turn limit counts from the new phase
    assert queue.yield_requested_epoch(2.0) == 0
    assert queue.state.grants == grants  # nothing was granted anew
    # The phase that ended is charged and recorded, as after a next_turn.
    assert queue.state.jobs["a"].held_seconds == 1.0
    phases = [(t.epoch, t.phase, t.granted_at, t.released_at) for t in queue.state.recent_turns]
    assert phases[-2:] == [(epoch, "train", 1.0, 2.0), (epoch, "sample", 2.0, 0.0)]
    assert queue.yield_turn("a", epoch, now=2.5) == 0.5
    assert queue.state.recent_turns[-1].released_at == 2.5
    assert queue.state.jobs["a"].last_seen == 2.5  # every message renews the lease


def test_with_someone_waiting_the_holder_keeps_the_turn_and_is_asked_to_yield() -> None:
    queue = policy_queue()
    epoch = held(queue, "a", "train", 1.0)
    assert queue.request("b", "b-1", now=1.5, phase="train") is None
    # A next_turn would have let b go first: a is on the GPUs already, so it
    # keeps them for this phase and is asked to give them back.
    assert queue.keep_turn("a", epoch, "sample", 2.0) == (True, 1.0)
    turn = queue.state.turn
    assert turn is not None and turn.job == "a" and turn.phase == "sample"
    assert [w.job for w in queue.state.queue] == ["b"]
    assert queue.yield_requested_epoch(2.0) == epoch
    assert queue.heartbeat("a", 2.1).should_yield
    queue.yield_turn("a", epoch, now=2.6)
    assert queue.needs_switch()  # b goes next


def test_a_paused_group_asks_the_holder_that_keeps_its_turn_to_yield() -> None:
    queue = policy_queue()
    epoch = held(queue, "a", "train", 1.0)
    queue.pause(True, now=1.5)
    assert queue.keep_turn("a", epoch, "sample", 2.0)[0]
    assert queue.yield_requested_epoch(2.0) == epoch


@pytest.mark.parametrize("who", ["stale epoch", "not the holder", "given back"])
def test_only_the_holder_of_the_epoch_keeps_it(who: str) -> None:
    queue = policy_queue()
    epoch = held(queue, "a", "train", 1.0)
    job = "b" if who == "not the holder" else "a"
    if who == "given back":
        queue.yield_turn("a", epoch, now=1.5)
    before = queue.state.model_dump()
    with pytest.raises(QueueError) as refused:
        queue.keep_turn(job, epoch + 1 if who == "stale epoch" else epoch, "sample", 2.0)
    assert refused.value.code == Refusal.FAILED_PRECONDITION
    assert queue.state.model_dump() == before


@pytest.mark.parametrize(
    ("heard", "waiting", "only_backfill", "asked", "keeps"),
    [(True, 0, False, False, True), (False, 0, False, False, False),
     (True, 1, False, False, False), (True, 0, False, True, False),
     (True, 2, True, False, True), (True, 2, True, True, False)],
)  # fmt: skip
def test_the_client_keeps_a_turn_unanswered_only_where_its_watch_said_nobody_waits(
    heard: bool, waiting: int, only_backfill: bool, asked: bool, keeps: bool
) -> None:
    """Nobody, or backfill jobs alone: they never go before a regular job's next phase."""
    turn = Turn(epoch=3, ticket=3, waited_seconds=0.0, switch_seconds=0.0, granted_at=0.0)
    lease = LeaseClock(30.0, 30.0, now=0.0)
    if heard:
        apply_notice(turn, lease, pb.TurnNotice(holding=True, epoch=3, waiting=waiting,
                                                should_yield=asked,
                                                only_backfill_waiting=only_backfill))  # fmt: skip
    assert may_keep_turn(turn, lease, heard) is keeps
    assert not may_keep_turn(None, lease, heard)
    # Others waiting: the lease is renewed at the contended pace all the same.
    assert lease.contended is (heard and waiting > 0)


def test_a_backfill_job_waiting_never_takes_a_regular_holders_next_phase() -> None:
    """What the client's keep without an answer relies on: the group keeps the
    turn for the holder's next phase and does not ask it back."""
    queue = policy_queue()
    queue.join("bf", ["n1"], "hash-bf", now=0.0, backfill=True)
    epoch = held(queue, "a", "train", 1.0)
    assert queue.request("bf", "bf-1", now=1.5, phase="backfill") is None
    assert queue.keep_turn("a", epoch, "sample", 2.0) == (False, 1.0)
    assert queue.yield_requested_epoch(2.0) == 0
    assert [w.job for w in queue.state.queue] == ["bf"]


def test_an_unknown_call_is_reported_as_unimplemented() -> None:
    class OldGateway(grpc.RpcError):
        def code(self) -> grpc.StatusCode:
            return grpc.StatusCode.UNIMPLEMENTED

        def details(self) -> str:
            return "Method not found!"

    assert isinstance(from_rpc_error(OldGateway(), "localhost:1"), Unimplemented)
    refused = WorkflowUpdateFailedError(
        ApplicationError(
            "Update handler for 'keep_turn' expected but not found, and there is no dynamic "
            "handler. known updates: [acquire yield]"
        )
    )
    assert unknown_update(refused)
    assert not unknown_update(WorkflowUpdateFailedError(ApplicationError("stale epoch 3")))
