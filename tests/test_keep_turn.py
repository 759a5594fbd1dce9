"""Job.next_turn_nowait: a holder goes on into its next phase on the GPUs it
holds while the message that says so travels (LockQueue.keep_turn, the
KeepTurn call). It never passes the turn on while the job computes: where a
next_turn would have let others go first, the holder is asked to yield."""

from __future__ import annotations

import asyncio
import time

import grpc
import pytest
from temporalio.client import WorkflowUpdateFailedError
from temporalio.exceptions import ApplicationError

import timeshare
import timeshare.aio
from tests.conftest import SimNodes
from tests.polling import wait_until_async
from tests.test_gateway import queued, two_jobs
from tests.test_prefetch import held, policy_queue
from timeshare._protocol import LeaseClock, Turn, apply_notice, may_keep_turn
from timeshare.errors import Unimplemented, from_rpc_error
from timeshare.refusals import Refusal
from timeshare.scheduling.base import QueueError
from timeshare.v1 import timeshare_pb2 as pb
from timeshare.v1 import timeshare_pb2_grpc as pb_grpc
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
    assert queue.release("a", epoch, now=2.5) == 0.5
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
    queue.release("a", epoch, now=2.6)
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
        queue.release("a", epoch, now=1.5)
    before = queue.snapshot()
    with pytest.raises(QueueError) as refused:
        queue.keep_turn(job, epoch + 1 if who == "stale epoch" else epoch, "sample", 2.0)
    assert refused.value.code == Refusal.FAILED_PRECONDITION
    assert not queue.changed_since(before)


async def test_the_blocking_client_keeps_its_turn_without_waiting_when_nobody_waits(
    api: timeshare.aio.Client, gateway: str, sim_nodes: SimNodes, unique: str
) -> None:
    group, node = f"g-{unique}", f"n-{unique}"
    await two_jobs(api, sim_nodes, group, node)

    def take_turns() -> tuple[int, int, str]:
        with timeshare.connect(gateway) as client:
            job = client.join(group, "a", [node])
            first = job.acquire(phase="train")
            watch = job._watch
            assert watch is not None
            # The watch must have spoken before a turn is kept unanswered.
            for _ in range(400):
                if watch.heard:
                    break
                time.sleep(0.05)
            kept = job.next_turn_nowait(phase="sample")
            assert job._keeping is not None  # kept, its answer not waited for
            job.finish_yield()  # settles the keep too
            phase = client.get_group(group).holder_phase
            job.yield_()
            job.leave()
            return first.epoch, kept.epoch, phase

    first, kept, phase = await asyncio.to_thread(take_turns)
    assert kept == first and phase == "sample"


async def test_keep_turn_through_the_gateway_asks_the_holder_to_yield_when_others_wait(
    api: timeshare.aio.Client, gateway: str, sim_nodes: SimNodes, unique: str
) -> None:
    group, node = f"g-{unique}", f"n-{unique}"
    a, b = await two_jobs(api, sim_nodes, group, node)
    turn = await a.acquire(phase="train")
    waiting = asyncio.create_task(b.acquire(phase="train"))
    await queued(api, group, ["b"])
    async with grpc.aio.insecure_channel(gateway) as channel:
        stub = pb_grpc.TimeSlicerStub(channel)
        request = pb.KeepTurnRequest(
            group=group, job="a", job_token=a.ref.token, epoch=turn.epoch, phase="sample"
        )
        kept = await stub.KeepTurn(request)
        assert kept.epoch == turn.epoch and kept.asked_to_yield and kept.phase == "sample"
        status = await api.get_group(group)
        assert (status.holder, status.holder_phase, status.queue) == ("a", "sample", ["b"])
        assert (await a.heartbeat()).should_yield
        assert not waiting.done()
        stale = pb.KeepTurnRequest(group=group, job="b", job_token=b.ref.token, epoch=turn.epoch)
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await stub.KeepTurn(stale)
        assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    await a.yield_()
    assert (await waiting).epoch == turn.epoch + 1


async def test_the_asyncio_client_keeps_its_turn_and_the_next_waiter_goes_after_it(
    api: timeshare.aio.Client, sim_nodes: SimNodes, unique: str
) -> None:
    group, node = f"g-{unique}", f"n-{unique}"
    a, b = await two_jobs(api, sim_nodes, group, node)
    first = await a.acquire(phase="train")
    await wait_until_async(lambda: _heard(a), "a's watch to speak", every=0.05)
    kept = await a.next_turn_nowait(phase="sample")
    assert kept is first and kept.phase == "sample"
    # b asks while the keep travels or just after: either way a keeps the
    # turn for this phase and b goes next.
    waiting = asyncio.create_task(b.acquire(phase="train"))
    await queued(api, group, ["b"])
    await a.yield_()
    assert (await waiting).epoch == first.epoch + 1
    await b.yield_()


async def _heard(job: timeshare.aio.Job) -> bool:
    return job._heard


@pytest.mark.parametrize(
    ("heard", "waiting", "asked", "keeps"),
    [(True, 0, False, True), (False, 0, False, False), (True, 1, False, False),
     (True, 0, True, False)],
)  # fmt: skip
def test_the_client_keeps_a_turn_unanswered_only_where_its_watch_said_nobody_waits(
    heard: bool, waiting: int, asked: bool, keeps: bool
) -> None:
    turn = Turn(epoch=3, ticket=3, waited_seconds=0.0, switch_seconds=0.0, granted_at=0.0)
    lease = LeaseClock(30.0, 30.0, now=0.0)
    if heard:
        apply_notice(turn, lease, pb.TurnNotice(holding=True, epoch=3, waiting=waiting,
                                                should_yield=asked))  # fmt: skip
    assert may_keep_turn(turn, lease, heard) is keeps
    assert not may_keep_turn(None, lease, heard)


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
