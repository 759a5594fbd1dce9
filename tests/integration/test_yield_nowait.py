"""Job.yield_nowait: the turn given back without waiting for the answer,
through the gateway, against the real scheduler and a sim node; both
clients (asyncio and blocking)."""

from __future__ import annotations

import asyncio

import pytest

import timeshare
import timeshare.aio
from tests.conftest import SimNodes
from tests.integration.test_gateway import queued, two_jobs
from timeshare import errors


async def a_holds(
    api: timeshare.aio.Client, sim_nodes: SimNodes, unique: str
) -> tuple[str, timeshare.aio.Job, timeshare.aio.Job, timeshare.Turn]:
    """A group of jobs a and b on a sim node of their own; a holds the turn."""
    group = f"g-{unique}"
    a, b = await two_jobs(api, sim_nodes, group, f"n-{unique}")
    return group, a, b, await a.acquire()


async def test_the_turn_goes_to_the_waiter_and_the_answer_comes_later(
    api: timeshare.aio.Client, sim_nodes: SimNodes, unique: str
) -> None:
    group, a, b, held = await a_holds(api, sim_nodes, unique)
    waiting = asyncio.create_task(b.acquire())
    await queued(api, group, ["b"])
    await a.yield_nowait()
    assert a.ref.epoch is None  # nothing left to give back on this side
    b_turn = await waiting
    assert b_turn.epoch == held.epoch + 1
    seconds = await a.finish_yield()
    assert seconds is not None and seconds > 0
    assert await a.finish_yield() is None  # nothing pending any more
    await b.yield_()


async def test_the_next_acquire_is_sent_after_the_yield(
    api: timeshare.aio.Client, sim_nodes: SimNodes, unique: str
) -> None:
    """Sent before it, the acquire would be refused: the job still holds."""
    group, a, _, first = await a_holds(api, sim_nodes, unique)
    for round_ in range(1, 4):
        await a.yield_nowait()
        turn = await a.acquire()
        assert turn.epoch == first.epoch + round_
    await a.yield_nowait()
    await a.leave()  # waits for the yield, then leaves
    status = await api.get_group(group)
    assert status.holder == "" and [j.job for j in status.jobs] == ["b"]


async def test_a_refused_yield_is_raised_by_the_next_call_and_the_turn_stays_the_jobs(
    api: timeshare.aio.Client, sim_nodes: SimNodes, unique: str
) -> None:
    group, a, _, held = await a_holds(api, sim_nodes, unique)
    token = a.ref.token
    a.ref.token = "not-the-job-token"
    await a.yield_nowait()
    with pytest.raises(errors.TimeshareError) as refused:
        await a.acquire()
    assert not isinstance(refused.value, errors.Aborted)
    a.ref.token = token
    status = await api.get_group(group)
    assert (status.holder, status.epoch) == ("a", held.epoch)
    # The refused yield left the turn to the job, which gives it back as usual.
    assert a.ref.epoch == held.epoch
    assert await a.yield_() > 0
    assert (await api.get_group(group)).holder == ""


async def test_an_evicted_job_hears_it_at_its_next_call(
    api: timeshare.aio.Client, sim_nodes: SimNodes, unique: str
) -> None:
    group, a, _, _ = await a_holds(api, sim_nodes, unique)
    await api.evict(group, "a", reason="maintenance")
    await a.yield_nowait()
    with pytest.raises(errors.Aborted, match="maintenance"):
        await a.acquire()
    assert a.ref.epoch is None


async def test_the_blocking_client_gives_back_in_a_thread(
    api: timeshare.aio.Client, gateway: str, sim_nodes: SimNodes, unique: str
) -> None:
    group, node = f"g-{unique}", f"n-{unique}"
    await sim_nodes.start(node)

    def scenario() -> None:
        with timeshare.connect(gateway) as client:
            a = client.join(group, "a", nodes=[node])
            b = client.join(group, "b", nodes=[node])
            first = a.acquire()
            a.yield_nowait()
            with pytest.raises(errors.FailedPrecondition, match="does not hold"):
                a.yield_nowait()  # given back already: nothing left to give
            b_turn = b.acquire()
            assert b_turn.epoch == first.epoch + 1
            b.yield_nowait()
            a_turn = a.acquire()  # granted once b's yield is recorded
            assert a_turn.epoch == b_turn.epoch + 1
            assert a.finish_yield() is None  # a's acquire waited for its yield
            assert b.finish_yield() is not None
            # A refused yield: raised by the next call, the turn still the job's.
            token = a.ref.token
            a.ref.token = "not-the-job-token"
            a.yield_nowait()
            with pytest.raises(errors.TimeshareError) as refused:
                a.heartbeat()
            assert not isinstance(refused.value, errors.Aborted)
            a.ref.token = token
            assert a.ref.epoch == a_turn.epoch
            a.yield_nowait()
            a.leave()  # waits for the yield, then leaves
            b.leave()

    await asyncio.to_thread(scenario)
    status = await api.get_group(group)
    assert status.jobs == [] and status.holder == ""
