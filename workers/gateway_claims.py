"""GPU claims at join: a GPU belongs to one group at a time.

A join claims, in the node registry, the GPUs its group's policy names (all
of them when it names none) on each of the job's nodes. Another group's claim
on one of them refuses the join with FAILED_PRECONDITION, unless that claim is
stale: its group no longer runs, or no longer has that job on that node (a
group that was terminated, an agent that was down when the job left). A claim
younger than CLAIM_GRACE_SECONDS always counts: its join may still be under
way. Stale claims are dropped and the claim made again."""

from __future__ import annotations

import grpc
from temporalio.client import Client, WithStartWorkflowOperation
from temporalio.common import WorkflowIDConflictPolicy

from timeshare.models import GroupPolicy
from timeshare.names import NODE_REGISTRY_WORKFLOW_ID, SCHEDULER_TASK_QUEUE
from timeshare.workers.gateway_errors import AccessDenied
from timeshare.workers.group_client import group_handle, group_running
from timeshare.workflows.group import GroupWorkflow
from timeshare.workflows.registry import (
    Claim,
    ClaimInput,
    ClaimOutput,
    NodeRegistryInput,
    NodeRegistryWorkflow,
    UnclaimInput,
)

CLAIM_GRACE_SECONDS = 10.0


async def group_gpus(client: Client, group: str, requested: GroupPolicy | None) -> list[int]:
    """The GPUs the group claims: its own policy's if it runs (a policy is
    fixed when the group is created), else the one this join creates it with."""
    if await group_running(client, group):
        status = await group_handle(client, group).query(GroupWorkflow.status)
        return list(status.policy.gpus)
    return list((requested or GroupPolicy()).gpus)


async def claim_gpus(client: Client, claim: ClaimInput, now: float) -> None:
    """Claim the GPUs, or AccessDenied(FAILED_PRECONDITION) naming the group
    that holds them."""
    for _ in range(2):
        output = await _claim(client, claim)
        if not output.conflicts:
            return
        live = [c for c in output.conflicts if await _live(client, c, now)]
        if live:
            raise AccessDenied(grpc.StatusCode.FAILED_PRECONDITION, refusal(claim, live))
        for stale in output.conflicts:
            await unclaim(client, UnclaimInput(group=stale.group, job=stale.job, node=stale.node))
    raise AccessDenied(
        grpc.StatusCode.FAILED_PRECONDITION,
        f"nodes {claim.nodes}: their GPUs are being claimed by other groups; join again",
    )


async def unclaim(client: Client, claim: UnclaimInput) -> None:
    handle = client.get_workflow_handle_for(NodeRegistryWorkflow.run, NODE_REGISTRY_WORKFLOW_ID)
    await handle.signal(NodeRegistryWorkflow.unclaim, claim)


def refusal(claim: ClaimInput, held: list[Claim]) -> str:
    first = held[0]
    gpus = f"GPUs {first.gpus}" if first.gpus else "all GPUs"
    jobs = sorted({c.job for c in held if c.group == first.group})
    return (
        f"node {first.node}: {gpus} are claimed by group {first.group!r} (jobs "
        f"{', '.join(jobs)}), and a GPU belongs to one group at a time; join that group, "
        "give this group other GPUs of the node (policy gpus=[...]) or use another node"
    )


async def _claim(client: Client, claim: ClaimInput) -> ClaimOutput:
    start = WithStartWorkflowOperation(
        NodeRegistryWorkflow.run,
        NodeRegistryInput(),
        id=NODE_REGISTRY_WORKFLOW_ID,
        id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
        task_queue=SCHEDULER_TASK_QUEUE,
    )
    return await client.execute_update_with_start_workflow(
        NodeRegistryWorkflow.claim, claim, start_workflow_operation=start
    )


async def _live(client: Client, claim: Claim, now: float) -> bool:
    if now - claim.at < CLAIM_GRACE_SECONDS:
        return True
    if not await group_running(client, claim.group):
        return False
    status = await group_handle(client, claim.group).query(GroupWorkflow.status)
    return any(job.job == claim.job and claim.node in job.nodes for job in status.jobs)
