"""A backfill holder hears its group's ask pushed (workers/gateway/turn_push.py):
its watch waits in a ``watch_turn`` update, which the group completes in the
workflow task that takes the regular job's request. A gateway that polled
instead would leave no such update in the history; a group that said it
later would complete it in another task."""

from __future__ import annotations

import asyncio
from typing import Any

from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowHandle

import timeshare.aio
from tests.conftest import SimNodes
from tests.integration.test_backfill import group_on_a_sim_node
from tests.polling import wait_until_async
from timeshare.models import GroupPolicy
from timeshare.names import group_workflow_id

Update = tuple[str, str]  # (accepted or completed, the update's name)


async def updates_by_task(handle: WorkflowHandle[Any, Any]) -> list[list[Update]]:
    """The updates each workflow task accepted or completed, task by task."""
    names: dict[str, str] = {}
    tasks: list[list[Update]] = [[]]
    async for event in handle.fetch_history_events():
        if event.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED:
            tasks.append([])
        elif event.HasField("workflow_execution_update_accepted_event_attributes"):
            accepted = event.workflow_execution_update_accepted_event_attributes
            names[accepted.protocol_instance_id] = accepted.accepted_request.input.name
            tasks[-1].append(("accepted", accepted.accepted_request.input.name))
        elif event.HasField("workflow_execution_update_completed_event_attributes"):
            completed = event.workflow_execution_update_completed_event_attributes
            tasks[-1].append(("completed", names.get(completed.meta.update_id, "")))
    return tasks


async def test_a_backfill_holder_hears_the_ask_from_the_task_that_made_it(
    api: timeshare.aio.Client, client: Client, sim_nodes: SimNodes, unique: str
) -> None:
    group, node = await group_on_a_sim_node(sim_nodes, unique)
    backfill = await api.join(group, "bf", nodes=[node], backfill=True)
    regular = await api.join(group, "a", nodes=[node])
    await backfill.acquire()
    handle = client.get_workflow_handle(group_workflow_id(group))

    async def watch_waits() -> bool:
        updates = [u for task in await updates_by_task(handle) for u in task]
        return ("accepted", "watch_turn") in updates

    await wait_until_async(watch_waits, "the holder's watch to wait in the group", every=0.1)
    asking = asyncio.create_task(regular.acquire())
    await asyncio.wait_for(backfill.yield_requested.wait(), 60)
    tasks = await updates_by_task(handle)
    deciding = [task for task in tasks if ("accepted", "acquire") in task][-1]
    assert ("completed", "watch_turn") in deciding, tasks
    await backfill.yield_()
    granted = await asyncio.wait_for(asking, 60)
    await regular.yield_()
    assert granted.epoch > 0
    for job in (backfill, regular):
        await job.leave()


async def test_a_holder_whose_group_can_ask_hears_the_ask_from_the_task_that_made_it(
    api: timeshare.aio.Client, client: Client, sim_nodes: SimNodes, unique: str
) -> None:
    """A turn limit: the waiter asks as soon as the holder is granted; the
    group asks the holder to yield when the limit passes, in a workflow task
    of its own (a timer's), and the holder's watch hears it from that task."""
    group, node = await group_on_a_sim_node(sim_nodes, unique)
    holder = await api.join(group, "a", nodes=[node], policy=GroupPolicy(max_turn_seconds=3))
    waiter = await api.join(group, "b", nodes=[node])
    await holder.acquire()
    asking = asyncio.create_task(waiter.acquire())
    await asyncio.wait_for(holder.yield_requested.wait(), 60)
    handle = client.get_workflow_handle(group_workflow_id(group))
    tasks = await updates_by_task(handle)
    took_request = [n for n, task in enumerate(tasks) if ("accepted", "acquire") in task][-1]
    later = tasks[took_request + 1 :]
    assert any(("completed", "watch_turn") in task for task in later), tasks
    await holder.yield_()
    await asyncio.wait_for(asking, 60)
    await waiter.yield_()
    for job in (holder, waiter):
        await job.leave()
