"""Helpers for tests that talk to GroupWorkflow directly, as the gateway does.
Job tokens here are simply "hash-<job>"."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import AsyncIterator, Callable

from temporalio.client import Client, WorkflowHandle, WorkflowUpdateFailedError
from temporalio.exceptions import ApplicationError
from temporalio.runtime import MetricBuffer, Runtime, TelemetryConfig
from temporalio.worker import Worker

from tests.conftest import SimNodes
from tests.polling import wait_until_async
from timeshare.activities.backends.sim import SimBackend
from timeshare.models import Grant, GroupPolicy, GroupStatus, HeartbeatOutput
from timeshare.names import group_workflow_id
from timeshare.scheduling import events as ev
from timeshare.workers.gateway.group_client import acquire_turn, join_group
from timeshare.workers.scheduler.data_converter import DATA_CONVERTER
from timeshare.workflows.group import GroupInput, GroupWorkflow
from timeshare.workflows.sandbox import workflow_runner

Handle = WorkflowHandle[GroupWorkflow, None]


async def join(
    client: Client,
    group: str,
    job: str,
    nodes: list[str],
    policy: GroupPolicy | None = None,
    priority: int = 0,
    token_hash: str | None = None,
) -> Handle:
    """``token_hash``: a real token's (timeshare.credentials.token_hash), for
    tests of the agent's check; the helpers below then cannot act for the job."""
    digest = token_hash or f"hash-{job}"
    message = ev.Join(job=job, nodes=nodes, token_hash=digest, priority=priority)
    await join_group(client, group, message, policy)
    return client.get_workflow_handle_for(GroupWorkflow.run, group_workflow_id(group))


async def group_on_one_node(
    client: Client,
    sim_nodes: SimNodes,
    unique: str,
    jobs: tuple[str, ...] = ("a", "b"),
    policy: GroupPolicy | None = None,
) -> tuple[Handle, SimBackend]:
    """A new group g-<unique> whose jobs all use one new sim node, n-<unique>."""
    node = f"n-{unique}"
    backend = await sim_nodes.start(node)
    for job in jobs:
        handle = await join(client, f"g-{unique}", job, [node], policy)
    return handle, backend


async def acquire(handle: Handle, job: str, timeout: float = 0.0, phase: str = "") -> Grant:
    return await acquire_turn(
        handle,
        ev.Acquire(
            job=job,
            token_hash=f"hash-{job}",
            request_id=uuid.uuid4().hex,
            timeout_seconds=timeout,
            phase=phase,
        ),
    )


async def yield_turn(handle: Handle, job: str, epoch: int) -> None:
    await handle.execute_update(
        GroupWorkflow.yield_turn, ev.Yield(job=job, token_hash=f"hash-{job}", epoch=epoch)
    )


def refusal_type(error: WorkflowUpdateFailedError) -> str | None:
    assert isinstance(error.cause, ApplicationError)
    return error.cause.type


async def heartbeat(handle: Handle, job: str) -> HeartbeatOutput:
    return await handle.execute_update(
        GroupWorkflow.heartbeat, ev.Heartbeat(job=job, token_hash=f"hash-{job}")
    )


async def eventually(
    handle: Handle, check: Callable[[GroupStatus], bool], seconds: float = 20
) -> GroupStatus:
    """Poll the group's status until ``check`` holds (bounded)."""

    async def holding() -> GroupStatus | None:
        status = await handle.query(GroupWorkflow.status)
        return status if check(status) else None

    return await wait_until_async(holding, "the group's status to hold", seconds, every=0.1)


@contextlib.asynccontextmanager
async def metered_group(
    client: Client, buffer: MetricBuffer, group: str, policy: GroupPolicy, queue: str
) -> AsyncIterator[Handle]:
    """A group run by a scheduler worker of the test's own (its own task queue
    and runtime), whose metrics land in ``buffer``; terminated at the end."""
    runtime = Runtime(telemetry=TelemetryConfig(metrics=buffer))
    own = await Client.connect(
        client.service_client.config.target_host, data_converter=DATA_CONVERTER, runtime=runtime
    )
    async with Worker(
        own, task_queue=queue, workflows=[GroupWorkflow], workflow_runner=workflow_runner()
    ):
        handle = await own.start_workflow(
            GroupWorkflow.run,
            GroupInput(group=group, policy=policy),
            id=group_workflow_id(group),
            task_queue=queue,
        )
        yield handle
        await handle.terminate()
