"""GPUs and host memory are a node's, not a group's: a GPU belongs to one group
at a time (a join that would share one is refused, clearly), and the simulated
node models GPUs and host memory that several groups share, so that contention
is seen where it happens."""

from __future__ import annotations

from functools import partial

import pytest
from temporalio.client import Client
from temporalio.testing import ActivityEnvironment
from temporalio.worker import Worker

import timeshare.aio
from tests.conftest import SimNodes
from tests.polling import wait_until_async
from timeshare import errors
from timeshare.activities.backends.base import BackendConfig, BackendError
from timeshare.activities.backends.sim import SimBackend
from timeshare.activities.switch import SwitchActivities
from timeshare.models import GroupPolicy, NodeMove, SwitchInput
from timeshare.names import NODE_REGISTRY_WORKFLOW_ID, node_task_queue
from timeshare.testing import overlaps
from timeshare.workers.agent.serve import drop_claim
from timeshare.workflows.registry import Claim, NodeRegistryWorkflow

STATE = 2**20


async def claims(client: Client) -> list[Claim]:
    handle = client.get_workflow_handle_for(NodeRegistryWorkflow.run, NODE_REGISTRY_WORKFLOW_ID)
    return await handle.query(NodeRegistryWorkflow.claims)


async def test_two_groups_that_claim_one_gpu_are_told_at_join(
    gateway: str, sim_nodes: SimNodes, unique: str
) -> None:
    node, other = f"n-{unique}", f"m-{unique}"
    await sim_nodes.start(node)
    await sim_nodes.start(other)
    api = timeshare.aio.connect(gateway)
    try:
        first = await api.join(f"g1-{unique}", "a", nodes=[node])
        await api.join(f"g1-{unique}", "b", nodes=[node])  # its own group: fine
        for policy in (None, GroupPolicy(gpus=[1])):  # all of them, or one of them
            with pytest.raises(errors.FailedPrecondition) as refused:
                await api.join(f"g2-{unique}", "x", nodes=[node], policy=policy)
            message = refused.value.message
            assert f"claimed by group 'g1-{unique}'" in message and "one group at a time" in message
        assert (await api.get_group(f"g1-{unique}")).jobs[0].job == "a"  # nothing changed
        # Disjoint GPUs of one node: two groups side by side.
        await api.join(f"g3-{unique}", "p", nodes=[other], policy=GroupPolicy(gpus=[0]))
        await api.join(f"g4-{unique}", "q", nodes=[other], policy=GroupPolicy(gpus=[1, 2]))
        with pytest.raises(errors.FailedPrecondition, match="GPUs \\[1, 2\\]"):
            await api.join(f"g5-{unique}", "r", nodes=[other], policy=GroupPolicy(gpus=[2]))
        # Once the group's jobs there have left, the node is free for another.
        await first.leave()
        await (await api.join(f"g1-{unique}", "b", nodes=[node])).leave()
        joined = await api.join(f"g2-{unique}", "x", nodes=[node])
        assert joined.ref.nodes == [node]
    finally:
        await api.close()


async def test_an_agent_that_releases_a_job_drops_its_claim(
    gateway: str, client: Client, scheduler: Worker, unique: str
) -> None:
    node = f"n-{unique}"
    backend = SimBackend(BackendConfig(node=node, sim_state_bytes=STATE))
    agent = SwitchActivities(node, backend)
    agent.on_release.append(partial(drop_claim, client, node))
    api = timeshare.aio.connect(gateway)
    try:
        async with Worker(
            client, task_queue=node_task_queue(node), activities=[agent.switch, agent.release]
        ):
            await api.join(f"g-{unique}", "a", nodes=[node])
            assert any(c.node == node for c in await claims(client))
            await api.evict(f"g-{unique}", "a", "test")  # no Leave from the job itself

            async def dropped() -> bool:
                return not any(c.node == node for c in await claims(client))

            await wait_until_async(dropped, "the agent to drop the claim")
    finally:
        await api.close()


def switch(group: str, admit: str, plan: int, evict: list[str], gpus: list[int]) -> SwitchInput:
    return SwitchInput(
        group=group, epoch=plan, plan=plan, gpus=gpus,
        move=NodeMove(node="n", admit=admit, evict=evict),
    )  # fmt: skip


async def test_the_sim_sees_two_groups_contend_for_one_gpu_and_for_host_memory() -> None:
    config = BackendConfig(
        node="n", sim_state_bytes=STATE, sim_bandwidth_bytes_per_second=1e12, sim_gpus=2,
        sim_host_memory_bytes=STATE,
    )  # fmt: skip
    backend = SimBackend(config)
    agent = SwitchActivities("n", backend)
    run = ActivityEnvironment().run
    # Claims bypassed (this test talks to the agent directly): both groups on GPU 0.
    await run(agent.switch, switch("g1", "a", 1, [], [0]))
    with pytest.raises(Exception, match="cannot admit g2/x while \\['g1/a'\\]"):
        await run(agent.switch, switch("g2", "x", 1, [], [0]))
    assert overlaps(backend.events) == 1
    # On GPUs of their own the two groups never meet.
    await run(agent.switch, switch("g2", "x", 2, [], [1]))
    # Host memory is the node's: g1's parked job leaves no room for g2's.
    await run(agent.switch, switch("g1", "b", 2, ["a"], [0]))
    with pytest.raises(BackendError, match=r"parked: g1/a.*nothing was moved"):
        await backend.checkpoint("g2", "x")
    assert backend.running("g2") == ["x"]


async def test_the_sim_shares_one_gpu_between_groups_by_default(
    client: Client, sim_nodes: SimNodes, unique: str
) -> None:
    """Two groups' jobs on one simulated GPU: the record shows every overlap."""
    backend = await sim_nodes.start(f"n-{unique}", state_bytes=STATE)
    await backend.restore("g1", "a")
    with pytest.raises(BackendError, match="still resident"):
        await backend.restore("g2", "x")
    await backend.checkpoint("g1", "a")
    await backend.restore("g2", "x")
    assert backend.resident("g2") == ["x"] and backend.resident("g1") == []
