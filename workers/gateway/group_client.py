"""How a process outside the workflow talks to a group: join (starting the
group's workflow on first use) and acquire (asking again while the bounded
waits of the workflow return "still waiting"). Used by the gateway and tests."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import uuid
from collections.abc import Callable

from temporalio.client import (
    Client,
    WithStartWorkflowOperation,
    WorkflowExecutionStatus,
    WorkflowHandle,
    WorkflowUpdateFailedError,
    WorkflowUpdateRPCTimeoutOrCancelledError,
)
from temporalio.common import WorkflowIDConflictPolicy
from temporalio.exceptions import ApplicationError
from temporalio.service import RPCError, RPCStatusCode

from timeshare.models import Grant, GroupPolicy, JoinOutput, NodeRecord, PublishedTurn, YieldOutput
from timeshare.names import NODE_REGISTRY_WORKFLOW_ID, SCHEDULER_TASK_QUEUE, group_workflow_id
from timeshare.scheduling import events as ev
from timeshare.scheduling.watch import MEMO_KEY, WatchRecord
from timeshare.workers.gateway.errors import (
    caller_gone,
    run_closed_under_update,
    workflow_task_failed,
)
from timeshare.workflows.group import GroupInput, GroupWorkflow
from timeshare.workflows.registry import NodeRegistryWorkflow
from timeshare.workflows.ui_text import group_details, group_summary

GroupHandle = WorkflowHandle[GroupWorkflow, None]
# Temporal fails an accepted update whose run ended first; the request keeps
# its place in the carried-over state, so it is simply sent again.
RUN_ENDED_FAILURE = "AcceptedUpdateCompletedWorkflow"
WITHDRAW_SECONDS = 30.0
# A join refused while the group's workflow task is retried is sent again for
# this long before the caller is told. In production that is a Temporal
# restart, or a new group's first workflow task that timed out on a busy
# scheduler: Temporal retries it after its task timeout (10 s by default), so
# 15 s covers one timeout and the retry. It stays below the time a caller is
# given a short message (errors.MESSAGE_SECONDS), so that a group that stays
# stuck is named as such rather than timed out.
JOIN_RETRY_SECONDS = 15.0
JOIN_RETRY_PAUSE_SECONDS = 0.5
RESEND_PAUSE_SECONDS = 0.5
RUNNING_GROUPS = "WorkflowType = 'GroupWorkflow' AND ExecutionStatus = 'Running'"
GROUP_ID_PREFIX = group_workflow_id("")


async def running_groups(client: Client) -> list[str]:
    """Names of the groups whose workflows run (by Temporal's visibility, which lags a little)."""
    names = [
        execution.id.removeprefix(GROUP_ID_PREFIX)
        async for execution in client.list_workflows(RUNNING_GROUPS)
        if execution.id.startswith(GROUP_ID_PREFIX)
    ]
    return sorted(names)


async def group_running(client: Client, group: str) -> bool:
    try:
        description = await group_handle(client, group).describe()
    except RPCError as error:
        if error.status == RPCStatusCode.NOT_FOUND:
            return False
        raise
    return description.status == WorkflowExecutionStatus.RUNNING


async def count_running_groups(client: Client) -> int:
    return (await client.count_workflows(RUNNING_GROUPS)).count


async def registered_nodes(client: Client) -> list[NodeRecord]:
    """The node agents the registry knows (none if no agent ever announced itself)."""
    handle = client.get_workflow_handle_for(NodeRegistryWorkflow.run, NODE_REGISTRY_WORKFLOW_ID)
    try:
        nodes: list[NodeRecord] = await handle.query(NodeRegistryWorkflow.nodes)
    except RPCError as error:
        if error.status == RPCStatusCode.NOT_FOUND:
            return []
        raise
    return nodes


def group_handle(client: Client, group: str) -> GroupHandle:
    # No run id: every message goes to the group's current run.
    return client.get_workflow_handle_for(GroupWorkflow.run, group_workflow_id(group))


async def join_group(
    client: Client, group: str, message: ev.Join, policy: GroupPolicy | None = None
) -> JoinOutput:
    """Join a job to its group's workflow, starting the workflow on first use."""
    clock = asyncio.get_running_loop().time
    give_up = clock() + JOIN_RETRY_SECONDS
    # Applies only where this join starts the group, like the policy.
    summary, details = group_summary(group), group_details(group, policy or GroupPolicy())
    while True:
        # One operation per attempt: the SDK's start operation is single-use.
        start = WithStartWorkflowOperation(
            GroupWorkflow.run,
            GroupInput(group=group, policy=policy),
            id=group_workflow_id(group),
            id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
            task_queue=SCHEDULER_TASK_QUEUE,
            # What the group's watches hear first, its pace included (the
            # policy is fixed here): the group writes its record only once
            # it says something else.
            memo={MEMO_KEY: WatchRecord.for_policy(policy or GroupPolicy())},
            static_summary=summary,
            static_details=details,
        )
        try:
            return await client.execute_update_with_start_workflow(
                GroupWorkflow.join, message, start_workflow_operation=start
            )
        except RPCError as error:
            # A join refreshes the job's entry, so sending it again is safe.
            retried = workflow_task_failed(error) or run_closed_under_update(error)
            if not retried or clock() >= give_up:
                raise
        await asyncio.sleep(JOIN_RETRY_PAUSE_SECONDS)


async def acquire_or_withdraw(
    handle: GroupHandle,
    message: ev.Acquire,
    background: set[asyncio.Task[None]],
    on_yielded: Callable[[YieldOutput], None] | None = None,
    on_published: Callable[[Grant, PublishedTurn], None] | None = None,
) -> Grant:
    """acquire_turn for a gRPC caller: if the caller goes away, its place in
    the queue is given back (in a task kept in ``background``)."""
    message = dataclasses.replace(message, call_id=uuid.uuid4().hex)
    try:
        return await acquire_turn(handle, message, on_yielded, on_published)
    except (asyncio.CancelledError, WorkflowUpdateRPCTimeoutOrCancelledError):
        withdrawal = asyncio.get_running_loop().create_task(withdraw(handle, message))
        background.add(withdrawal)
        withdrawal.add_done_callback(background.discard)
        raise asyncio.CancelledError() from None


async def withdraw(handle: GroupHandle, message: ev.Acquire) -> None:
    withdrawal = ev.CancelAcquire(
        job=message.job,
        token_hash=message.token_hash,
        request_id=message.request_id,
        call_id=message.call_id,
    )
    # Best effort: the job's lease is the backstop.
    with contextlib.suppress(Exception):
        await asyncio.wait_for(
            handle.execute_update(GroupWorkflow.cancel_acquire, withdrawal), WITHDRAW_SECONDS
        )


async def acquire_turn(
    handle: GroupHandle,
    message: ev.Acquire,
    on_yielded: Callable[[YieldOutput], None] | None = None,
    on_published: Callable[[Grant, PublishedTurn], None] | None = None,
) -> Grant:
    """Wait for the turn, sending the same request again after every bounded
    wait. ``on_yielded`` hears of the turn the message gave back first, if
    any; ``on_published``, of what the group published with the grant, if it
    said."""
    clock = asyncio.get_running_loop().time
    deadline = clock() + message.timeout_seconds if message.timeout_seconds > 0 else None
    attempt = 0
    while True:
        remaining = 0.0 if deadline is None else max(0.001, deadline - clock())
        try:
            result = await handle.execute_update(
                GroupWorkflow.acquire,
                dataclasses.replace(message, timeout_seconds=remaining),
                # Temporal answers an update id it has seen with the answer it
                # kept: a request sent again (its answer lost in an outage) by
                # a new call must be answered afresh, e.g. "evicted" rather
                # than a grant the scheduler has since taken back.
                id=f"acquire/{message.job}/{message.request_id}/{message.call_id}/{attempt}",
            )
        except WorkflowUpdateFailedError as failure:
            cause = failure.cause
            if not (isinstance(cause, ApplicationError) and cause.type == RUN_ENDED_FAILURE):
                raise
            result = None
        except RPCError as error:
            # Admitted, never handled: the run that was to handle it ended.
            if not run_closed_under_update(error):
                raise
            await asyncio.sleep(RESEND_PAUSE_SECONDS)
            continue
        except WorkflowUpdateRPCTimeoutOrCancelledError:
            if caller_gone():
                raise
            # Temporal's deadline on the call ran out, not the caller's: the
            # same update is asked for again (its id unchanged: the request
            # keeps its place, and an answer already given is given again).
            # Passed on, it read as the caller's own cancellation, which is
            # never answered: a job waited for ever and never heard why.
            await asyncio.sleep(RESEND_PAUSE_SECONDS)
            continue
        if result is not None and result.yielded is not None and on_yielded is not None:
            on_yielded(result.yielded)
        if result is not None and result.grant is not None:
            if result.published is not None and on_published is not None:
                on_published(result.grant, result.published)
            return result.grant
        attempt += 1
