"""GPU claims at join: a GPU belongs to one group at a time.

A join claims, in the node registry, the GPUs its group's policy names (all
of them when it names none) on each of the job's nodes. Another group's claim
on one of them refuses the join with FAILED_PRECONDITION, unless that claim is
stale: its group no longer runs, or no longer has that job on that node (a
group that was terminated, an agent that was down when the job left). A claim
younger than CLAIM_GRACE_SECONDS always counts: its join may still be under
way. Stale claims are dropped and the claim made again.

A claim lapses when its job leaves or its lease runs out (the scheduler evicts
it, and the agents that release it drop the claim), so the refusal says when
that will be unless the holder's jobs are heard from again: llm-d's jobs never
leave, and their leases are how their GPUs come back."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable

import grpc
from temporalio.client import Client, WithStartWorkflowOperation
from temporalio.common import WorkflowIDConflictPolicy

from timeshare.models import GroupPolicy, GroupStatus, JoinOutput
from timeshare.names import NODE_REGISTRY_WORKFLOW_ID, SCHEDULER_TASK_QUEUE
from timeshare.scheduling import events as ev
from timeshare.workers.gateway.errors import MESSAGE_SECONDS, AccessDenied, within
from timeshare.workers.gateway.group_client import group_handle, group_running, join_group
from timeshare.workflows.group import GroupWorkflow
from timeshare.workflows.registry import (
    REGISTRY_DETAILS,
    Claim,
    ClaimInput,
    ClaimOutput,
    NodeRegistryInput,
    NodeRegistryWorkflow,
    UnclaimInput,
)
from timeshare.workflows.ui_text import REGISTRY_SUMMARY

CLAIM_GRACE_SECONDS = 10.0


async def group_gpus(client: Client, group: str, requested: GroupPolicy | None) -> list[int]:
    """The GPUs the group claims: its own policy's if it runs (a policy is
    fixed when the group is created), else the one this join creates it with."""
    if await group_running(client, group):
        status = await group_handle(client, group).query(GroupWorkflow.status)
        return list(status.policy.gpus)
    return list((requested or GroupPolicy()).gpus)


async def join_claiming_gpus(
    client: Client,
    group: str,
    message: ev.Join,
    policy: GroupPolicy | None,
    remedy: str = "",
    clock: Callable[[], float] = time.time,
) -> JoinOutput:
    """Claim the GPUs the job's group uses on its nodes, then join it; a
    join that fails drops the claim. Refused as claim_gpus says. ``clock``:
    the registry's time as the gateway reads it (server_clock.py): claims
    lapse by it."""
    gpus = await within(MESSAGE_SECONDS, group_gpus(client, group, policy))
    claim = ClaimInput(group=group, job=message.job, nodes=message.nodes, gpus=gpus)
    await within(MESSAGE_SECONDS, claim_gpus(client, claim, clock(), remedy))
    try:
        return await within(MESSAGE_SECONDS, join_group(client, group, message, policy))
    except BaseException:
        with contextlib.suppress(Exception):
            await unclaim(client, UnclaimInput(group=group, job=message.job))
        raise


async def claim_gpus(client: Client, claim: ClaimInput, now: float, remedy: str = "") -> None:
    """Claim the GPUs, or AccessDenied(FAILED_PRECONDITION) naming the group
    that holds them and when its claim lapses (``remedy``: what the caller
    can do instead, if not the native API's advice)."""
    for _ in range(2):
        output = await _claim(client, claim)
        if not output.conflicts:
            return
        live: dict[tuple[str, str, str], float | None] = {}
        for held in output.conflicts:
            alive, lapse = await _liveness(client, held, now)
            if alive:
                live[(held.group, held.job, held.node)] = lapse
        if live:
            claims = [c for c in output.conflicts if (c.group, c.job, c.node) in live]
            holder = [live[(c.group, c.job, c.node)] for c in claims if c.group == claims[0].group]
            lapse_at = None if None in holder else max(a for a in holder if a is not None)
            message = refusal(claim, claims, lapse_at, now, remedy)
            raise AccessDenied(grpc.StatusCode.FAILED_PRECONDITION, message)
        for stale in output.conflicts:
            await unclaim(client, UnclaimInput(group=stale.group, job=stale.job, node=stale.node))
    raise AccessDenied(
        grpc.StatusCode.FAILED_PRECONDITION,
        f"nodes {claim.nodes}: their GPUs are being claimed by other groups; join again",
    )


async def unclaim(client: Client, claim: UnclaimInput) -> None:
    handle = client.get_workflow_handle_for(NodeRegistryWorkflow.run, NODE_REGISTRY_WORKFLOW_ID)
    await handle.signal(NodeRegistryWorkflow.unclaim, claim)


def refusal(
    claim: ClaimInput, held: list[Claim], lapse_at: float | None, now: float, remedy: str = ""
) -> str:
    """Who holds the GPUs, until when at the latest, and what to do."""
    first = held[0]
    gpus = f"GPUs {first.gpus}" if first.gpus else "all GPUs"
    jobs = sorted({c.job for c in held if c.group == first.group})
    return (
        f"node {first.node}: {gpus} are claimed by group {first.group!r} (jobs "
        f"{', '.join(jobs)}), and a GPU belongs to one group at a time; "
        f"{lapse_text(lapse_at, now)}; "
        + (remedy or "join that group, give this group other GPUs of the node "
           "(policy gpus=[...]) or use another node")
    )  # fmt: skip


def lapse_text(lapse_at: float | None, now: float) -> str:
    if lapse_at is None:
        return "its claim lapses when its jobs leave or their leases run out"
    when = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(lapse_at))
    return (
        f"its claim lapses when its jobs leave or their leases run out, by {when} "
        f"(in {max(0.0, lapse_at - now):.0f} s) unless they call again"
    )


async def _claim(client: Client, claim: ClaimInput) -> ClaimOutput:
    start = WithStartWorkflowOperation(
        NodeRegistryWorkflow.run,
        NodeRegistryInput(),
        id=NODE_REGISTRY_WORKFLOW_ID,
        id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
        task_queue=SCHEDULER_TASK_QUEUE,
        static_summary=REGISTRY_SUMMARY,
        static_details=REGISTRY_DETAILS,
    )
    return await client.execute_update_with_start_workflow(
        NodeRegistryWorkflow.claim, claim, start_workflow_operation=start
    )


async def _liveness(client: Client, claim: Claim, now: float) -> tuple[bool, float | None]:
    """Whether the claim still counts, and when its job's lease runs out
    (None: not known yet)."""
    young = now - claim.at < CLAIM_GRACE_SECONDS
    if not await group_running(client, claim.group):
        return young, None
    status = await group_handle(client, claim.group).query(GroupWorkflow.status)
    lapse = lease_deadline(status, claim)
    return young or lapse is not None, lapse


def lease_deadline(status: GroupStatus, claim: Claim) -> float | None:
    """When the claim's job runs out of lease unless it is heard from (the
    idle lease, the longest a member can stay silent); None: not a member there."""
    for job in status.jobs:
        if job.job == claim.job and claim.node in job.nodes:
            return job.last_seen + max(status.policy.idle_lease_seconds,
                                       status.policy.lease_seconds)  # fmt: skip
    return None
