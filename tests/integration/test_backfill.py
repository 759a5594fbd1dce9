"""Backfill jobs through a real stack (gateway, scheduler, a simulated
node): a backfill job that ignores should_yield is preempted after its
group's grace, and the regular job that asked gets the GPU. The core's
decisions are in tests/unit/test_backfill.py."""

from __future__ import annotations

import asyncio

import timeshare.aio
from tests.conftest import SimNodes
from tests.integration.test_gateway import queued
from tests.polling import wait_until_async
from timeshare.models import GroupPolicy


async def test_a_backfill_job_that_does_not_yield_is_preempted_and_the_regular_job_granted(
    api: timeshare.aio.Client, sim_nodes: SimNodes, unique: str
) -> None:
    group, node = f"g-{unique}", f"n-{unique}"
    await sim_nodes.start(node)
    policy = GroupPolicy(backfill_grace_seconds=1.0, co_residency="off")
    backfill = await api.join(group, "bf", [node], policy=policy, backfill=True)
    regular = await api.join(group, "a", [node])
    status = await api.get_group(group)
    assert {j.job: j.backfill for j in status.jobs} == {"a": False, "bf": True}

    held = await backfill.acquire()
    assert not (await backfill.heartbeat()).should_yield
    asking = asyncio.create_task(regular.acquire())
    await queued(api, group, ["a"])

    async def asked_to_yield() -> bool:
        return (await backfill.heartbeat()).should_yield or asking.done()

    await wait_until_async(asked_to_yield, "the backfill holder to be asked to yield", every=0.05)
    # The backfill job goes on computing, never yielding: after the grace it
    # is preempted and the regular job holds the GPU, its state restored.
    granted = await asyncio.wait_for(asking, timeout=60)
    assert granted.epoch > held.epoch
    status = await api.get_group(group)
    assert status.holder == "a" and status.preemptions == 1
    assert {j.job: j.preempted for j in status.jobs} == {"a": False, "bf": True}
    assert sim_nodes.backends[node].resident(group) == ["a"]
    await regular.yield_()
    await regular.leave()
    await backfill.leave()
