"""The group workflow's calls to node agents, by reference to the agent's
activities (activities/switch.py): one switch per node of an attempt, in
parallel, on each node's task queue, reported to the core as one
SwitchAttempted event; and the release of a job that left."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import TypedDict

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError, ApplicationError
from temporalio.exceptions import TimeoutError as ActivityTimeoutError

with workflow.unsafe.imports_passed_through():
    from timeshare.activities.switch import SwitchActivities
    from timeshare.models import (
        FailureKind,
        ReleaseInput,
        SwitchInput,
        SwitchOutput,
        SwitchPhase,
    )
    from timeshare.names import node_task_queue
    from timeshare.scheduling import switch_costs
    from timeshare.scheduling.commands import Release
    from timeshare.scheduling.events import NodeFailed, NodeSwitched, SwitchAttempted
    from timeshare.scheduling.state import GroupState, StoredMove, StoredSwitch, SwitchPlan

# A switch activity is retried by Temporal this often before the workflow
# sees the failure, marks the group degraded and decides what to do.
SWITCH_ATTEMPTS = 3


def _retries() -> RetryPolicy:
    return RetryPolicy(
        initial_interval=timedelta(milliseconds=500),
        backoff_coefficient=2.0,
        maximum_interval=timedelta(seconds=5),
        maximum_attempts=SWITCH_ATTEMPTS,
    )


class _NodeOptions(TypedDict):
    task_queue: str
    schedule_to_start_timeout: timedelta
    start_to_close_timeout: timedelta
    heartbeat_timeout: timedelta


def _on_node(node: str, agent_timeout: timedelta) -> _NodeOptions:
    """An activity on the node's agent: an agent not polling, or silent while
    it works, is noticed within ``agent_timeout``."""
    return _NodeOptions(
        task_queue=node_task_queue(node),
        schedule_to_start_timeout=agent_timeout,
        start_to_close_timeout=timedelta(minutes=10),
        heartbeat_timeout=agent_timeout,
    )


async def attempt(state: GroupState, plan: SwitchPlan) -> SwitchAttempted:
    """Stop every job that leaves several nodes on all of them first; then
    one move per node, in parallel."""
    quiesce = plan.quiesce_moves()
    if quiesce:
        stopped = await asyncio.gather(*(_move(state, plan, m, "quiesce") for m in quiesce))
        failed = [r for r in stopped if isinstance(r, NodeFailed)]
        if failed:
            return SwitchAttempted(done=[], failed=failed, moved=False)
    results = await asyncio.gather(*(_timed_move(state, plan, move) for move in plan.moves))
    return SwitchAttempted(
        done=[r for r, _ in results if isinstance(r, NodeSwitched)],
        failed=[r for r, _ in results if isinstance(r, NodeFailed)],
        records=[record for _, record in results],
    )


async def _timed_move(
    state: GroupState, plan: SwitchPlan, move: StoredMove
) -> tuple[NodeSwitched | NodeFailed, StoredSwitch]:
    started = workflow.now().timestamp()
    output = await _move(state, plan, move, "switch")
    switched = isinstance(output, SwitchOutput)
    actions = output.actions if isinstance(output, SwitchOutput) else []
    checkpoint_seconds, restore_seconds = switch_costs.measured(actions, move.admit)
    record = StoredSwitch(
        node=move.node,
        epoch=plan.epoch,
        started_at=started,
        finished_at=workflow.now().timestamp(),
        evicted=[a.job for a in actions if a.action == "checkpoint"] or move.evict,
        admitted=move.admit if switched else "",
        bytes_moved=sum(a.bytes for a in actions),
        backend=output.backend if isinstance(output, SwitchOutput) else "",
        ok=switched,
        error=output.cause if isinstance(output, NodeFailed) else "",
        checkpoint_bytes={a.job: a.bytes for a in actions if a.action == "checkpoint"},
        checkpoint_seconds=checkpoint_seconds,
        restore_seconds=restore_seconds,
    )
    if isinstance(output, NodeFailed):
        return output, record
    restored = any(a.action == "restore" and a.bytes > 0 for a in actions)
    return NodeSwitched(node=output.node, gone=output.gone, restored=restored), record


async def _move(
    state: GroupState, plan: SwitchPlan, move: StoredMove, phase: SwitchPhase
) -> SwitchOutput | NodeFailed:
    """One node's part of a switch: what it did, or why it failed."""
    agent_timeout = timedelta(seconds=state.policy.agent_timeout_seconds)
    try:
        output = await workflow.execute_activity_method(
            SwitchActivities.switch,
            SwitchInput(
                group=state.group,
                epoch=plan.epoch,
                move=move.as_move(),
                plan=plan.number,
                trace_context=plan.waiter.trace_context,
                co_residency=state.policy.co_residency,
                phase=phase,
                gpus=state.policy.gpus,
                incarnations=_incarnations(state, move),
            ),
            **_on_node(move.node, agent_timeout),
            retry_policy=_retries(),
        )
    except ActivityError as failure:
        return _failed(move.node, failure, agent_timeout)
    return output


def _failed(node: str, failure: ActivityError, agent_timeout: timedelta) -> NodeFailed:
    cause = failure.cause
    if isinstance(cause, ActivityTimeoutError):
        reason = f"the node agent did not answer within {agent_timeout.seconds} s"
        return NodeFailed(node=node, cause=reason, kind=FailureKind.UNREACHABLE)
    if isinstance(cause, ApplicationError):
        job = str(cause.details[0]) if cause.details else ""
        kind = FailureKind.of(cause.type)
        named = kind != FailureKind.OTHER
        return NodeFailed(node=node, cause=str(cause), kind=kind, job=job if named else "")
    return NodeFailed(node=node, cause=str(cause or failure), kind=FailureKind.OTHER)


def _incarnations(state: GroupState, move: StoredMove) -> dict[str, int]:
    """Of the member jobs the move names, which membership each is."""
    named = [move.admit, *move.evict]
    return {job: state.jobs[job].incarnation for job in named if job in state.jobs}


async def release(state: GroupState, release: Release) -> None:
    """Ask the node's agent to let the job's processes go; a node that is
    down or refuses is logged (`timeshare forget` does the same by hand)."""
    job, node = release.job, release.node
    agent_timeout = timedelta(seconds=state.policy.agent_timeout_seconds)
    try:
        output = await workflow.execute_activity_method(
            SwitchActivities.release,
            ReleaseInput(
                group=state.group,
                job=job,
                reason=state.evicted_jobs.get(job, ""),
                gpus=state.policy.gpus,
                incarnation=release.incarnation,
            ),
            **_on_node(node, agent_timeout),
            retry_policy=_retries(),
        )
        workflow.logger.info("group %s: %s", state.group, output.summary)
    except ActivityError as failure:
        workflow.logger.warning(
            "group %s: the agent of node %s did not release job %s: %s",
            state.group, node, job, failure.cause or failure,
        )  # fmt: skip
