"""A group whose workflow task fails on every attempt heals by itself: its
scheduler, upgraded to code that cannot replay the group's history, starts
a new run from what the history recorded, with the same holder, the same
waiter and the same state parked on its node; nothing is granted twice.
The healing core on made-up facts: tests/unit/test_healing.py; on the
history of the SDK bug: tests/unit/test_healing_history.py."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from temporalio.client import Client
from temporalio.service import RPCError
from temporalio.worker import Worker

from tests.conftest import SimNodes
from tests.disagreeing_workflow import DisagreeingGroupWorkflow
from tests.groups import Handle, acquire, yield_turn
from tests.polling import wait_until_async
from timeshare.activities.backends.sim import SimBackend
from timeshare.models import GroupStatus
from timeshare.names import group_workflow_id
from timeshare.scheduling import events as ev
from timeshare.workers.gateway.errors import run_closed_under_update, workflow_task_failed
from timeshare.workers.scheduler.healing.failure_watch import FailureWatch
from timeshare.workers.scheduler.healing.healer import GroupHealer
from timeshare.workflows.group import GroupInput, GroupWorkflow
from timeshare.workflows.sandbox import workflow_runner

# What the issue asks of a stuck group: serving its jobs again within this.
HEALED_WITHIN_SECONDS = 30.0


async def resent(call: Callable[[], Awaitable[None]]) -> None:
    """As the gateway and the client do: a call the stuck group refused, or
    whose run ended under it, is sent again until the group takes it."""

    async def sent() -> bool:
        try:
            await call()
        except RPCError as error:
            if workflow_task_failed(error) or run_closed_under_update(error):
                return False
            raise
        return True

    await wait_until_async(sent, "the group to take the call again", HEALED_WITHIN_SECONDS)


def where(backend: SimBackend, group: str, job: str) -> str:
    return backend.jobs[(group, job)].location


async def test_a_group_that_no_scheduler_can_replay_heals_with_its_holder_and_parked_state(
    client: Client, sim_nodes: SimNodes, unique: str
) -> None:
    group, node, queue = f"g-{unique}", f"n-{unique}", f"scheduler-{unique}"
    backend = await sim_nodes.start(node)
    async with Worker(
        client, task_queue=queue, workflows=[GroupWorkflow], workflow_runner=workflow_runner()
    ):
        await client.start_workflow(
            GroupWorkflow.run, GroupInput(group=group), id=group_workflow_id(group),
            task_queue=queue,
        )  # fmt: skip
        # As the gateway's: no run named, so every message goes to the current run.
        handle: Handle = client.get_workflow_handle_for(GroupWorkflow.run, group_workflow_id(group))
        for job in ("a", "b", "c"):
            joined = ev.Join(job=job, nodes=[node], token_hash=f"hash-{job}")
            await handle.execute_update(GroupWorkflow.join, joined)
        first = await acquire(handle, "a")
        await yield_turn(handle, "a", first.epoch)
        second = await acquire(handle, "b")
        waiting = asyncio.create_task(acquire(handle, "c"))
        await wait_until_async(
            lambda: _status_shows(handle, lambda s: s.queue == ["c"]), "c to wait"
        )
    assert where(backend, group, "a") == "host"
    stuck_run = (await handle.describe()).run_id

    healer = GroupHealer(client, [DisagreeingGroupWorkflow])
    upgraded = FailureWatch(workflow_runner(), healer.heard)
    async with (
        healer.running(),
        Worker(
            client, task_queue=queue, workflows=[DisagreeingGroupWorkflow], workflow_runner=upgraded
        ),
    ):
        # b's yield is the first message the upgraded scheduler meets.
        await resent(lambda: yield_turn(handle, "b", second.epoch))
        third = await asyncio.wait_for(waiting, HEALED_WITHIN_SECONDS)
        healed = await handle.describe()
        status: GroupStatus = await handle.query(GroupWorkflow.status)
    # No worker serves the queue now: a group left running would not answer a listing.
    await handle.terminate("test over")

    assert [e.outcome for e in healer.examined] == ["healed"], healer.examined
    assert healed.run_id != stuck_run and healed.run_id == healer.examined[0].new_run_id
    assert status.heals == 1
    # The same holder (b, until its yield above), the same waiter (c, now
    # granted), never an epoch told twice.
    assert (first.epoch, second.epoch, third.epoch) == (1, 2, 3)
    assert (third.job, status.holder, status.epoch) == ("c", "c", 3)
    # a's state stayed parked in host memory; c came onto the GPU after b left it.
    assert where(backend, group, "a") == "host"
    assert where(backend, group, "c") == "running"
    assert not [event for event in backend.events if event["event"] == "overlap"]


async def _status_shows(handle: Handle, check: Callable[[GroupStatus], bool]) -> bool:
    return check(await handle.query(GroupWorkflow.status))
