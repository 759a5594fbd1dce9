"""Prefetch: while a group's GPUs sit idle, the job expected to ask next is
brought onto them before it asks, so that its acquire is granted at once.

Here the tests that start processes; the others are in
tests/unit/test_prefetch.py."""

from __future__ import annotations

import asyncio
import time

from temporalio.client import Client

from tests.conftest import SimNodes
from tests.groups import Handle, acquire, eventually, group_on_one_node, yield_turn
from tests.unit.test_prefetch import REWARD_SECONDS
from timeshare.activities.backends.sim import SimBackend
from timeshare.scheduling import events as ev
from timeshare.workflows.group import GroupWorkflow

# How long each turn of the live test is held.
HOLD_SECONDS = 0.3


async def granted_restored_ahead(handle: Handle, backend: SimBackend, job: str, phase: str) -> None:
    """The job's acquire is granted with no switch: its state was restored
    before it asked."""
    asked = time.time()
    grant = await acquire(handle, job, phase=phase)
    assert grant.switch_seconds == 0.0 and grant.context_restored
    restores = [e for e in backend.events if e["event"] == "restore" and e["job"] == job]
    assert restores[-1]["end"] <= asked


async def test_the_workflow_brings_the_next_job_in_before_it_asks(
    client: Client, sim_nodes: SimNodes, unique: str
) -> None:
    """a and b take turns, each asking again as soon as the other yields; when
    b yields, a is expected first, so a's state comes back before a asks,
    and a's acquire is granted with no switch."""
    handle, backend = await group_on_one_node(client, sim_nodes, unique)
    holder = "a"
    grant = await acquire(handle, holder, phase="rollout")
    for _ in range(3):
        await asyncio.sleep(HOLD_SECONDS)
        await yield_turn(handle, holder, grant.epoch)
        holder = "b" if holder == "a" else "a"
        grant = await acquire(handle, holder, phase="rollout")
    assert holder == "b"
    await asyncio.sleep(HOLD_SECONDS)
    await yield_turn(handle, "b", grant.epoch)
    status = await eventually(
        handle, lambda s: s.resident.get(f"n-{unique}") == "a" and s.state == "idle"
    )
    assert status.holder == "" and status.queue == []
    await granted_restored_ahead(handle, backend, "a", "rollout")


async def test_the_workflow_brings_the_next_job_in_when_the_holder_leaves(
    client: Client, sim_nodes: SimNodes, unique: str
) -> None:
    """a trains and would sample at once, so its state stays while it is
    expected back; when a leaves instead, b's state comes back before b asks."""
    handle, backend = await group_on_one_node(client, sim_nodes, unique)
    grant = await acquire(handle, "b", phase="sample")
    await yield_turn(handle, "b", grant.epoch)
    for phase in ("train", "sample"):
        grant = await acquire(handle, "a", phase=phase)
        await yield_turn(handle, "a", grant.epoch)
    # b asks again a long reward phase after its last yield: a gap it will
    # repeat, long enough that b is still expected when a leaves on a slow host.
    await asyncio.sleep(2 * REWARD_SECONDS)
    grant = await acquire(handle, "b", phase="sample")
    await yield_turn(handle, "b", grant.epoch)
    grant = await acquire(handle, "a", phase="train")
    await yield_turn(handle, "a", grant.epoch)
    node = f"n-{unique}"
    assert (await handle.query(GroupWorkflow.status)).resident.get(node) == "a"
    await handle.execute_update(GroupWorkflow.leave, ev.Leave(job="a", token_hash="hash-a"))
    await eventually(handle, lambda s: s.resident.get(node) == "b" and s.state == "idle")
    await granted_restored_ahead(handle, backend, "b", "sample")


async def test_the_workflow_brings_back_the_job_away_longest_in_the_first_iteration(
    client: Client, sim_nodes: SimNodes, unique: str
) -> None:
    """b samples, then a: nobody has asked twice yet, so when a yields, b
    (away the longest) is brought back before it asks for training."""
    handle, backend = await group_on_one_node(client, sim_nodes, unique)
    node = f"n-{unique}"
    for job in ("b", "a"):
        grant = await acquire(handle, job, phase="sample")
        await yield_turn(handle, job, grant.epoch)
    await eventually(handle, lambda s: s.resident.get(node) == "b" and s.state == "idle")
    await granted_restored_ahead(handle, backend, "b", "train")
