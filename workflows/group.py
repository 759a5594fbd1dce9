"""GroupWorkflow: one durable lock queue per group of jobs sharing GPUs.

A thin shell around workflows.lockqueue: handlers feed it messages stamped
with workflow time, the main loop carries out the switches it plans as one
``switch`` activity per node, in parallel, on each node's task queue.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta

from pydantic import BaseModel
from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError, ApplicationError

with workflow.unsafe.imports_passed_through():
    from timeshare.models import (
        AcquireInput,
        Grant,
        GroupStatus,
        HeartbeatOutput,
        JobInput,
        JoinInput,
        JoinOutput,
        NodeMove,
        SwitchInput,
        SwitchOutput,
        YieldInput,
        YieldOutput,
    )
    from timeshare.names import node_task_queue
    from workflows.lockqueue import GroupState, LockQueue, QueueError, SwitchPlan

# A node agent that does not pick a switch up within this time is treated as
# down: the group turns degraded and the switch is tried again later.
SWITCH_SCHEDULE_TO_START = timedelta(seconds=30)
SWITCH_START_TO_CLOSE = timedelta(minutes=5)
SWITCH_RETRY = RetryPolicy(
    initial_interval=timedelta(milliseconds=500),
    backoff_coefficient=2.0,
    maximum_interval=timedelta(seconds=10),
    maximum_attempts=3,
)
SWITCH_RETRY_PAUSE_MAX_SECONDS = 60.0


class GroupInput(BaseModel):
    group: str
    # Set when the workflow continues as new; a new group starts empty.
    state: GroupState | None = None


class CancelAcquireInput(BaseModel):
    job: str
    token_hash: str
    request_id: str


@contextmanager
def _refusals() -> Iterator[None]:
    """Report a queue refusal to the caller as a typed, non-retryable failure."""
    try:
        yield
    except QueueError as refusal:
        raise ApplicationError(refusal.message, type=refusal.code, non_retryable=True) from None


@workflow.defn(name="GroupWorkflow")
class GroupWorkflow:
    @workflow.init
    def __init__(self, input: GroupInput) -> None:
        self._queue = LockQueue(input.state or GroupState(group=input.group))

    @workflow.run
    async def run(self, input: GroupInput) -> None:
        while True:
            await workflow.wait_condition(
                lambda: self._queue.needs_switch() or self._continue_as_new_due()
            )
            if self._queue.needs_switch():
                await self._switch()
                continue
            workflow.continue_as_new(GroupInput(group=input.group, state=self._queue.state))

    def _continue_as_new_due(self) -> bool:
        # Only when nobody waits: a waiting acquire lives in an update handler,
        # and continuing as new would fail it.
        return (
            workflow.info().is_continue_as_new_suggested()
            and not self._queue.state.queue
            and self._queue.state.switching is None
            and workflow.all_handlers_finished()
        )

    def _now(self) -> float:
        return workflow.now().timestamp()

    # -- messages -------------------------------------------------------------

    @workflow.update
    def join(self, input: JoinInput) -> JoinOutput:
        with _refusals():
            created = self._queue.join(input.job, input.nodes, input.token_hash, self._now())
        return JoinOutput(created=created, nodes=input.nodes)

    @workflow.update
    async def acquire(self, input: AcquireInput) -> Grant:
        job, request_id = input.job, input.request_id
        with _refusals():
            grant = self._queue.request(job, request_id, self._now())
        if grant is not None:
            return grant
        timeout = timedelta(seconds=input.timeout_seconds) if input.timeout_seconds > 0 else None
        try:
            await workflow.wait_condition(
                lambda: not self._queue.is_waiting(job, request_id), timeout=timeout
            )
        except TimeoutError:
            if self._queue.cancel(job, request_id, self._now()):
                raise ApplicationError(
                    f"job {job!r} was not granted within {input.timeout_seconds:g} s",
                    type="DEADLINE_EXCEEDED",
                    non_retryable=True,
                ) from None
            # Its switch is already under way: the grant is moments away.
            await workflow.wait_condition(lambda: not self._queue.is_waiting(job, request_id))
        grant = self._queue.grant_for(job, request_id)
        if grant is None:
            raise ApplicationError(
                f"job {job!r} left the group before its turn came",
                type="ABORTED",
                non_retryable=True,
            )
        return grant

    @acquire.validator
    def _check_acquire(self, input: AcquireInput) -> None:
        with _refusals():
            self._queue.authenticate(input.job, input.token_hash)
            self._queue.check_acquire(input.job, input.request_id)

    @workflow.update
    def cancel_acquire(self, input: CancelAcquireInput) -> bool:
        return self._queue.cancel(input.job, input.request_id, self._now())

    @cancel_acquire.validator
    def _check_cancel(self, input: CancelAcquireInput) -> None:
        with _refusals():
            self._queue.authenticate(input.job, input.token_hash)

    @workflow.update(name="yield")
    def yield_turn(self, input: YieldInput) -> YieldOutput:
        with _refusals():
            held = self._queue.release(input.job, input.epoch, self._now())
        return YieldOutput(held_seconds=held)

    @yield_turn.validator
    def _check_yield(self, input: YieldInput) -> None:
        with _refusals():
            self._queue.authenticate(input.job, input.token_hash)
            self._queue.check_release(input.job, input.epoch)

    @workflow.update
    def heartbeat(self, input: JobInput) -> HeartbeatOutput:
        return self._queue.heartbeat(input.job, self._now())

    @heartbeat.validator
    def _check_heartbeat(self, input: JobInput) -> None:
        with _refusals():
            self._queue.authenticate(input.job, input.token_hash)

    @workflow.update
    def leave(self, input: JobInput) -> None:
        self._queue.leave(input.job, self._now())

    @leave.validator
    def _check_leave(self, input: JobInput) -> None:
        with _refusals():
            self._queue.authenticate(input.job, input.token_hash)

    @workflow.query
    def status(self) -> GroupStatus:
        return self._queue.status()

    # -- switches -------------------------------------------------------------

    async def _switch(self) -> None:
        plan = self._queue.begin_switch(self._now())
        attempt = 0
        while True:
            causes = await asyncio.gather(*(self._move(plan, move) for move in plan.moves))
            failed = [cause for cause in causes if cause]
            if not failed:
                break
            # The backends are idempotent, so the whole switch is simply tried
            # again; no grant is made while any node may still hold other state.
            self._queue.switch_failed("; ".join(failed))
            attempt += 1
            await workflow.sleep(min(SWITCH_RETRY_PAUSE_MAX_SECONDS, 2.0**attempt))
        self._queue.finish_switch(self._now())

    async def _move(self, plan: SwitchPlan, move: NodeMove) -> str:
        """Run one node's part of a switch; return why it failed, or ''."""
        try:
            await workflow.execute_activity(
                "switch",
                SwitchInput(group=self._queue.state.group, epoch=plan.epoch, move=move),
                result_type=SwitchOutput,
                task_queue=node_task_queue(move.node),
                schedule_to_start_timeout=SWITCH_SCHEDULE_TO_START,
                start_to_close_timeout=SWITCH_START_TO_CLOSE,
                retry_policy=SWITCH_RETRY,
            )
        except ActivityError as failure:
            reason = failure.cause if failure.cause is not None else failure
            return f"node {move.node}: {reason}"
        return ""
