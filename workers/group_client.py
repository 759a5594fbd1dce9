"""How a process outside the workflow talks to a group: join (starting the
group's workflow on first use) and acquire (asking again while the bounded
waits of the workflow return "still waiting"). Used by the gateway and tests."""

from __future__ import annotations

import asyncio

from temporalio.client import (
    Client,
    WithStartWorkflowOperation,
    WorkflowHandle,
    WorkflowUpdateFailedError,
)
from temporalio.common import WorkflowIDConflictPolicy
from temporalio.exceptions import ApplicationError

from timeshare.models import AcquireInput, Grant, GroupPolicy, JoinInput, JoinOutput
from timeshare.names import SCHEDULER_TASK_QUEUE, group_workflow_id
from workflows.group import GroupInput, GroupWorkflow

GroupHandle = WorkflowHandle[GroupWorkflow, None]
# Temporal fails an accepted update whose run ended first; the request keeps
# its place in the carried-over state, so it is simply sent again.
RUN_ENDED_FAILURE = "AcceptedUpdateCompletedWorkflow"


def group_handle(client: Client, group: str) -> GroupHandle:
    # No run id: every message goes to the group's current run.
    return client.get_workflow_handle_for(GroupWorkflow.run, group_workflow_id(group))


async def join_group(
    client: Client, group: str, message: JoinInput, policy: GroupPolicy | None = None
) -> JoinOutput:
    """Join a job to its group's workflow, starting the workflow on first use."""
    start = WithStartWorkflowOperation(
        GroupWorkflow.run,
        GroupInput(group=group, policy=policy),
        id=group_workflow_id(group),
        id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
        task_queue=SCHEDULER_TASK_QUEUE,
    )
    return await client.execute_update_with_start_workflow(
        GroupWorkflow.join, message, start_workflow_operation=start
    )


async def acquire_turn(handle: GroupHandle, message: AcquireInput) -> Grant:
    """Wait for the turn, sending the same request again after every bounded wait."""
    clock = asyncio.get_running_loop().time
    deadline = clock() + message.timeout_seconds if message.timeout_seconds > 0 else None
    attempt = 0
    while True:
        remaining = 0.0 if deadline is None else max(0.001, deadline - clock())
        try:
            result = await handle.execute_update(
                GroupWorkflow.acquire,
                message.model_copy(update={"timeout_seconds": remaining}),
                id=f"acquire/{message.job}/{message.request_id}/{attempt}",
            )
        except WorkflowUpdateFailedError as failure:
            cause = failure.cause
            if not (isinstance(cause, ApplicationError) and cause.type == RUN_ENDED_FAILURE):
                raise
            result = None
        if result is not None and result.grant is not None:
            return result.grant
        attempt += 1
