"""The group's durable state: its own schema, decoupled from the public models,
and a failure inside a message handler that rejects that message alone and
leaves the state as it was, instead of wedging the group's workflow.

Here the tests that start processes; the others are in
tests/unit/test_group_state.py."""

from __future__ import annotations

import asyncio
import uuid

import pytest
from temporalio.client import Client, WorkflowUpdateFailedError
from temporalio.worker import Worker

from tests.buggy_workflow import GroupWorkflowWithABug
from tests.conftest import SimNodes
from tests.groups import acquire, eventually, join, refusal_type, yield_turn
from timeshare.names import group_workflow_id
from timeshare.refusals import Refusal
from timeshare.scheduling import events as ev
from timeshare.workflows.group import GroupInput, GroupWorkflow
from timeshare.workflows.sandbox import workflow_runner


async def test_a_failing_handler_rejects_its_message_and_leaves_the_state_as_it_was(
    client: Client, sim_nodes: SimNodes
) -> None:
    unique = uuid.uuid4().hex[:8]
    group, node, queue = f"g-{unique}", f"n-{unique}", f"buggy-{unique}"
    await sim_nodes.start(node)
    async with Worker(
        client,
        task_queue=queue,
        workflows=[GroupWorkflowWithABug],
        workflow_runner=workflow_runner(),
    ):
        handle = await client.start_workflow(
            "GroupWorkflowWithABug",
            GroupInput(group=group),
            id=group_workflow_id(group),
            task_queue=queue,
            result_type=type(None),
        )
        typed = client.get_workflow_handle_for(GroupWorkflow.run, handle.id)
        await join(client, group, "buggy", [node])
        await join(client, group, "fine", [node])
        grant = await acquire(typed, "buggy")
        before = await typed.query(GroupWorkflow.status)
        with pytest.raises(WorkflowUpdateFailedError) as refused:
            await yield_turn(typed, "buggy", grant.epoch)
        assert refusal_type(refused.value) == Refusal.INTERNAL
        assert "as it was before" in str(refused.value.cause)
        after = await typed.query(GroupWorkflow.status)
        assert not after.paused and after.model_dump() == before.model_dump()
        # The group goes on: the other job queues, and the holder leaves.
        waiting = asyncio.create_task(acquire(typed, "fine"))
        await eventually(typed, lambda s: s.queue == ["fine"])
        await typed.execute_update(
            GroupWorkflow.leave, ev.Leave(job="buggy", token_hash="hash-buggy")
        )
        assert (await waiting).job == "fine"
        await eventually(typed, lambda s: s.holder == "fine")
        await typed.terminate()
