"""Job.next_turn: give the turn back and ask for the next in one message,
through the gateway, against the real scheduler and a sim node."""

from __future__ import annotations

import asyncio

import pytest
from temporalio.client import Client, WorkflowUpdateFailedError

import timeshare.aio
from tests.conftest import SimNodes
from tests.groups import acquire, group_on_one_node, refusal_type
from tests.integration.test_gateway import queued, two_jobs
from timeshare import errors
from timeshare.names import group_workflow_id
from timeshare.scheduling import events as ev
from timeshare.workers.common.service import connect_temporal
from timeshare.workflows.group import GroupWorkflow


async def updates_named(temporal_address: str, group: str) -> list[str]:
    client = await connect_temporal(temporal_address, "default")
    handle = client.get_workflow_handle(group_workflow_id(group))
    return [
        event.workflow_execution_update_accepted_event_attributes.accepted_request.input.name
        async for event in handle.fetch_history_events()
        if event.HasField("workflow_execution_update_accepted_event_attributes")
    ]


async def test_with_nobody_waiting_the_job_keeps_its_gpus_in_one_message(
    api: timeshare.aio.Client, sim_nodes: SimNodes, unique: str, temporal_address: str
) -> None:
    group, node = f"g-{unique}", f"n-{unique}"
    a, _ = await two_jobs(api, sim_nodes, group, node)
    first = await a.acquire(phase="train")
    before = await updates_named(temporal_address, group)
    second = await a.next_turn(phase="rollout")
    assert second.epoch == first.epoch + 1 and second.switch_seconds == 0.0
    assert second.phase == "rollout"
    # One update for the yield and the acquire, not two.
    assert (await updates_named(temporal_address, group))[len(before) :] == ["acquire"]
    status = await api.get_group(group)
    assert (status.holder, status.switches, status.resident) == ("a", 1, {node: "a"})
    history = await api.group_history(group)
    assert [(t.phase, t.ended_by) for t in history.turns[-2:]] == [("train", ""), ("rollout", "")]
    assert history.turns[-2].released_at > 0
    await a.yield_()


async def test_a_waiting_job_goes_first(
    api: timeshare.aio.Client, sim_nodes: SimNodes, unique: str
) -> None:
    group, node = f"g-{unique}", f"n-{unique}"
    a, b = await two_jobs(api, sim_nodes, group, node)
    await a.acquire()
    waiting = asyncio.create_task(b.acquire())
    await queued(api, group, ["b"])
    again = asyncio.create_task(a.next_turn())
    b_turn = await waiting
    await queued(api, group, ["a"])
    assert not again.done() and b_turn.switch_seconds > 0
    await b.yield_()
    a_turn = await again
    assert a_turn.epoch == b_turn.epoch + 1 and a_turn.switch_seconds > 0
    await a.yield_()


async def test_a_refused_next_turn_changes_nothing(
    api: timeshare.aio.Client, sim_nodes: SimNodes, unique: str
) -> None:
    group, node = f"g-{unique}", f"n-{unique}"
    a, _ = await two_jobs(api, sim_nodes, group, node)
    with pytest.raises(errors.FailedPrecondition, match="does not hold the turn"):
        await a.next_turn()  # nothing to give back: refused before sending
    turn = await a.acquire()
    with pytest.raises(errors.InvalidArgument):
        await a.next_turn(phase="bad\nphase")
    status = await api.get_group(group)
    assert status.holder == "a" and status.epoch == turn.epoch
    # The job still holds its turn, and can give it back as usual.
    await a.yield_()
    assert (await api.get_group(group)).holder == ""


async def test_the_scheduler_refuses_to_give_back_a_turn_not_held(
    client: Client, sim_nodes: SimNodes, unique: str
) -> None:
    handle, _ = await group_on_one_node(client, sim_nodes, unique)
    held = await acquire(handle, "a")
    stale = ev.Acquire(job="a", token_hash="hash-a", request_id="next", yield_epoch=held.epoch + 7)
    with pytest.raises(WorkflowUpdateFailedError) as refused:
        await handle.execute_update(GroupWorkflow.acquire, stale)
    assert refusal_type(refused.value) == "FAILED_PRECONDITION"
    status = await handle.query(GroupWorkflow.status)
    assert (status.holder, status.epoch, status.queue) == ("a", held.epoch, [])
