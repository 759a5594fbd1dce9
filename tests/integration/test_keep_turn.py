"""Job.next_turn_nowait: a holder goes on into its next phase on the GPUs it
holds while the message that says so travels (turns.keep_turn, the
KeepTurn call). It never passes the turn on while the job computes: where a
next_turn would have let others go first, the holder is asked to yield.

Here the tests that start processes; the others are in
tests/unit/test_keep_turn.py."""

from __future__ import annotations

import asyncio
import time

import grpc
import pytest

import timeshare
import timeshare.aio
from tests.conftest import SimNodes
from tests.integration.test_gateway import queued, two_jobs
from tests.polling import wait_until_async
from timeshare.v1 import timeshare_pb2 as pb
from timeshare.v1 import timeshare_pb2_grpc as pb_grpc


async def _heard(job: timeshare.aio.Job) -> bool:
    return job._heard


async def test_the_blocking_client_keeps_its_turn_without_waiting_when_nobody_waits(
    api: timeshare.aio.Client, gateway: str, sim_nodes: SimNodes, unique: str
) -> None:
    group, node = f"g-{unique}", f"n-{unique}"
    await two_jobs(api, sim_nodes, group, node)

    def take_turns() -> tuple[int, int, str]:
        with timeshare.connect(gateway) as client:
            job = client.join(group, "a", nodes=[node])
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


async def test_a_regular_holder_keeps_its_turn_unanswered_while_only_a_backfill_job_waits(
    api: timeshare.aio.Client, sim_nodes: SimNodes, unique: str
) -> None:
    """A backfill job waits through every regular turn: were it counted as
    someone waiting, each next phase of a regular job would wait for an answer."""
    group, node = f"g-{unique}", f"n-{unique}"
    a, _ = await two_jobs(api, sim_nodes, group, node)
    backfill = await api.join(group, "bf", nodes=[node], backfill=True)
    first = await a.acquire(phase="train")
    waiting = asyncio.create_task(backfill.acquire(phase="backfill"))
    await queued(api, group, ["bf"])

    async def only_backfill_heard() -> bool:
        return a._heard and first._only_backfill_waiting

    await wait_until_async(only_backfill_heard, "a's watch to say only bf waits", every=0.05)
    kept = await a.next_turn_nowait(phase="sample")
    assert kept is first and kept.phase == "sample"
    await a.yield_()
    assert (await waiting).epoch == first.epoch + 1
    await backfill.yield_()
