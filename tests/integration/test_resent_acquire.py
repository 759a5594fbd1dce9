"""An acquire whose answer was lost (a gateway or Temporal outage) is sent
again with the same request id, through a new gateway call. It must get what
the scheduler holds now, not the answer Temporal kept for the first call:
found by bench.chaos, where a job evicted in between was told it held a turn."""

from __future__ import annotations

import uuid

import pytest
from temporalio.client import Client, WorkflowUpdateFailedError

from tests.conftest import SimNodes
from tests.groups import group_on_one_node, refusal_type, yield_turn
from timeshare.scheduling import events as ev
from timeshare.workers.gateway.group_client import acquire_or_withdraw
from timeshare.workflows.group import GroupWorkflow


async def test_an_acquire_sent_again_is_answered_afresh(
    client: Client, sim_nodes: SimNodes, unique: str
) -> None:
    handle, _ = await group_on_one_node(client, sim_nodes, unique)
    request = ev.Acquire(job="a", token_hash="hash-a", request_id=uuid.uuid4().hex)
    granted = await acquire_or_withdraw(handle, request, set())
    # Sent again while the turn is still the job's: the same grant.
    assert (await acquire_or_withdraw(handle, request, set())).epoch == granted.epoch
    evict = ev.Evict(job="a", reason="maintenance")
    assert await handle.execute_update(GroupWorkflow.evict, evict)
    with pytest.raises(WorkflowUpdateFailedError) as failure:
        await acquire_or_withdraw(handle, request, set())
    assert refusal_type(failure.value) == "ABORTED"
    assert "maintenance" in str(failure.value.cause)
    granted_b = await acquire_or_withdraw(
        handle, ev.Acquire(job="b", token_hash="hash-b", request_id="b-1"), set()
    )
    await yield_turn(handle, "b", granted_b.epoch)
