"""The group's durable state: its own schema, decoupled from the public models,
and a failure inside a message handler that rejects that message alone and
leaves the state as it was, instead of wedging the group's workflow."""

from __future__ import annotations

import asyncio
import uuid

import pytest
from pydantic import BaseModel, ValidationError
from temporalio.client import Client, WorkflowUpdateFailedError
from temporalio.worker import Worker

from tests.buggy_workflow import GroupWorkflowWithABug
from tests.conftest import SimNodes
from tests.groups import acquire, eventually, join, refusal_type, release
from timeshare.history import SwitchRecord, TurnRecord
from timeshare.models import Grant, GroupPolicy, JobInput, NodeMove
from timeshare.names import group_workflow_id
from timeshare.refusals import Refusal
from timeshare.scheduling.queue import LockQueue
from timeshare.scheduling.state import (
    LEGACY_DEFAULTS,
    SCHEMA_VERSION,
    GroupState,
    StoredGrant,
    StoredModel,
    StoredMove,
    StoredPolicy,
    StoredSwitch,
    StoredTurn,
)
from timeshare.workflows.group import GroupInput, GroupWorkflow
from timeshare.workflows.sandbox import workflow_runner

TWINS: list[tuple[type[StoredModel], type[BaseModel]]] = [
    (StoredPolicy, GroupPolicy),
    (StoredGrant, Grant),
    (StoredMove, NodeMove),
    (StoredTurn, TurnRecord),
    (StoredSwitch, SwitchRecord),
]


@pytest.mark.parametrize(("stored", "public"), TWINS, ids=lambda kind: kind.__name__)
def test_each_durable_model_has_its_public_twins_fields(
    stored: type[StoredModel], public: type[BaseModel]
) -> None:
    """A field added to a public model alone must be added to the durable one on
    purpose: until then the two differ and crossing between them fails."""
    assert set(stored.model_fields) == set(public.model_fields)
    legacy = LEGACY_DEFAULTS if stored is StoredPolicy else set()
    for name, field in stored.model_fields.items():
        if name not in legacy:  # what a state from before the field meant, on purpose
            assert field.default == public.model_fields[name].default, name


def test_a_field_the_durable_schema_lacks_is_refused_not_dropped() -> None:
    class PolicyWithMore(GroupPolicy):
        new_knob: int = 3

    with pytest.raises(ValidationError, match="new_knob"):
        StoredPolicy.stored(PolicyWithMore())


def test_a_newer_schema_is_refused_with_what_to_do() -> None:
    with pytest.raises(ValidationError, match="upgrade the scheduler"):
        GroupState(group="g", schema_version=SCHEMA_VERSION + 1)


def test_a_snapshot_restores_every_kind_of_change() -> None:
    queue = LockQueue(GroupState(group="g"))
    for job in ("a", "b"):
        queue.join(job, ["n"], f"h-{job}", now=0.0)
    queue.request("a", "r1", now=1.0)
    queue.begin_switch(now=1.0)
    queue.finish_switch(now=1.5)
    before = queue.snapshot()
    expected = queue.state.model_dump()
    assert not queue.changed_since(before)
    queue.request("b", "r2", now=2.0)  # the queue grows
    queue.release("a", 1, now=3.0)  # the last turn record is closed in place
    queue.record_switches([StoredSwitch(node="n", epoch=9, started_at=3.0, finished_at=3.1)])
    queue.state.jobs["a"].turns = 99  # a nested change
    assert queue.changed_since(before)
    queue.restore(before)
    assert queue.state.model_dump() == expected
    assert not queue.changed_since(before)


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
            await release(typed, "buggy", grant.epoch)
        assert refusal_type(refused.value) == Refusal.INTERNAL
        assert "as it was before" in str(refused.value.cause)
        after = await typed.query(GroupWorkflow.status)
        assert not after.paused and after.model_dump() == before.model_dump()
        # The group goes on: the other job queues, and the holder leaves.
        waiting = asyncio.create_task(acquire(typed, "fine"))
        await eventually(typed, lambda s: s.queue == ["fine"])
        await typed.execute_update(
            GroupWorkflow.leave, JobInput(job="buggy", token_hash="hash-buggy")
        )
        assert (await waiting).job == "fine"
        await eventually(typed, lambda s: s.holder == "fine")
        await typed.terminate()
