"""Starting a group's healed run in place of its failing one, in one call:
Temporal terminates the failing run and starts the new one atomically, so
no message finds the group without a run (a join in between would start an
empty group). The request id is the failing run's: a second healer that
got there too is answered with the same new run instead of replacing it."""

from __future__ import annotations

import os
import socket

from temporalio.api.common.v1 import Payloads
from temporalio.api.enums.v1 import WorkflowIdConflictPolicy, WorkflowIdReusePolicy
from temporalio.api.history.v1 import HistoryEvent
from temporalio.api.taskqueue.v1 import TaskQueue
from temporalio.api.workflowservice.v1 import StartWorkflowExecutionRequest
from temporalio.client import Client, WorkflowExecutionDescription

from timeshare.workflows.group import GroupInput


def healer_identity() -> str:
    return f"timeshare scheduler {os.getpid()}@{socket.gethostname()} (healing a group)"


async def start_healed_run(
    client: Client, failing: WorkflowExecutionDescription, started: HistoryEvent, input: GroupInput
) -> str:
    """The new run's id. It takes the failing run's type, task queue, memo,
    search attributes and the summary the Temporal UI shows."""
    attributes = started.workflow_execution_started_event_attributes
    info = failing.raw_description.workflow_execution_info
    payloads = client.data_converter.payload_converter.to_payloads([input])
    request = StartWorkflowExecutionRequest(
        namespace=client.namespace,
        workflow_id=failing.id,
        workflow_type=attributes.workflow_type,
        task_queue=TaskQueue(name=attributes.task_queue.name),
        input=Payloads(payloads=payloads),
        workflow_task_timeout=attributes.workflow_task_timeout,
        identity=healer_identity(),
        request_id=f"heal-{failing.run_id}",
        workflow_id_reuse_policy=WorkflowIdReusePolicy.WORKFLOW_ID_REUSE_POLICY_ALLOW_DUPLICATE,
        workflow_id_conflict_policy=(
            WorkflowIdConflictPolicy.WORKFLOW_ID_CONFLICT_POLICY_TERMINATE_EXISTING
        ),
        memo=info.memo,
        search_attributes=info.search_attributes,
        user_metadata=started.user_metadata,
    )
    response = await client.workflow_service.start_workflow_execution(request)
    return response.run_id
