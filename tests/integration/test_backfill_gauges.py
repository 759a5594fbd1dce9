"""The scheduler's backfill gauges, read from the metrics of a scheduler
worker of this test's own (its own task queue): a backfill holder that
overruns its grace shows as a preemption, its GPU time as backfill busy
seconds, and the regular job's wait behind it as backfill delay."""

from __future__ import annotations

import asyncio

from temporalio.client import Client
from temporalio.runtime import MetricBuffer

from tests.conftest import SimNodes
from tests.groups import acquire, metered_group, yield_turn
from timeshare.models import GroupPolicy
from timeshare.scheduling import events as ev
from timeshare.workflows.backfill_gauges import GAUGES
from timeshare.workflows.group import GroupWorkflow

GRACE = 0.5


async def test_a_preempted_backfill_job_shows_in_the_backfill_gauges(
    client: Client, sim_nodes: SimNodes, unique: str
) -> None:
    buffer = MetricBuffer(10_000)
    node, group, queue = f"n-{unique}", f"metered-{unique}", f"scheduler-{unique}"
    await sim_nodes.start(node)
    policy = GroupPolicy(backfill_grace_seconds=GRACE, co_residency="off")
    async with metered_group(client, buffer, group, policy, queue) as handle:
        for job, backfill in (("bf", True), ("a", False)):
            joined = ev.Join(job=job, nodes=[node], token_hash=f"hash-{job}", backfill=backfill)
            await handle.execute_update(GroupWorkflow.join, joined)
        await acquire(handle, "bf")
        # bf never yields: after the grace it is preempted and a granted.
        grant = await asyncio.wait_for(acquire(handle, "a"), timeout=60)
        await yield_turn(handle, "a", grant.epoch)
        status = await handle.query(GroupWorkflow.status)
        assert status.preemptions == 1
    last: dict[str, float] = {}
    for update in buffer.retrieve_updates():
        if update.metric.name in GAUGES and dict(update.attributes).get("group") == group:
            last[update.metric.name] = float(update.value)
    assert last["timeshare.backfill.preemptions"] == 1
    assert last["timeshare.backfill.busy_seconds"] >= GRACE - 1e-6
    assert last["timeshare.backfill.delay_seconds"] >= GRACE - 1e-6
