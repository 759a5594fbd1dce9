"""The ``switch`` activity: one node's part of a hand-over."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import defaultdict
from collections.abc import AsyncIterator, Awaitable

from opentelemetry import propagate, trace
from temporalio import activity
from temporalio.exceptions import ApplicationError

from activities.backend import Backend, BackendError
from activities.processes import ProcessTable
from timeshare.instruments import record_switch
from timeshare.models import (
    CHECKPOINT_FAILED,
    RESTORE_FAILED,
    BackendAction,
    SwitchInput,
    SwitchOutput,
)

HEARTBEAT_SECONDS = 1.0
log = logging.getLogger("timeshare.agent")
tracer = trace.get_tracer("timeshare.agent")
PHASE_OF_FAILURE = {CHECKPOINT_FAILED: "checkpoint", RESTORE_FAILED: "restore"}


class SwitchActivities:
    def __init__(self, node: str, backend: Backend, processes: ProcessTable | None = None) -> None:
        self.node = node
        self.backend = backend
        self.processes = processes or ProcessTable()
        # The job each group last admitted here: a process of any other job of
        # the group that registers meanwhile is checkpointed at once.
        self._admitted: dict[str, str] = {}
        self._background: set[asyncio.Task[None]] = set()
        self.processes.on_register.append(self._registered)
        # One switch per group at a time, and never one older than the last:
        # an attempt Temporal already gave up on must not move state after
        # the next plan has.
        self._locks: defaultdict[str, asyncio.Lock] = defaultdict(asyncio.Lock)
        self._latest_plan: dict[str, int] = {}

    @activity.defn(name="switch")
    async def switch(self, input: SwitchInput) -> SwitchOutput:
        """Checkpoint every other job of the group resident here, then restore the admitted one."""
        move = input.move
        if move.node != self.node:
            raise ApplicationError(
                f"switch for node {move.node!r} reached the agent of node {self.node!r}",
                non_retryable=True,
            )
        async with self._locks[input.group]:
            if input.plan < self._latest_plan.get(input.group, 0):
                raise ApplicationError(
                    f"switch plan {input.plan} of group {input.group!r} was superseded by plan "
                    f"{self._latest_plan[input.group]}",
                    type="Superseded",
                    non_retryable=True,
                )
            self._latest_plan[input.group] = input.plan
            # The span joins the trace of the acquire this switch serves.
            with tracer.start_as_current_span(
                "timeshare.switch",
                context=propagate.extract(input.trace_context),
                attributes={
                    "timeshare.group": input.group,
                    "timeshare.node": self.node,
                    "timeshare.epoch": input.epoch,
                    "timeshare.admit": move.admit,
                    "timeshare.backend": self.backend.name,
                },
            ):
                output = await self._switch(input)
            record_switch(input.group, output)
            return output

    async def _switch(self, input: SwitchInput) -> SwitchOutput:
        move = input.move
        started = time.monotonic()
        # Evict what the backend itself sees resident too, not only what the
        # scheduler believes: after an agent restart the two can differ.
        seen = await self.backend.resident_jobs(input.group)
        evict = sorted((set(move.evict) | set(seen)) - {move.admit})
        async with _heartbeating():
            actions = [
                await _step(self.backend.checkpoint(input.group, job), CHECKPOINT_FAILED)
                for job in evict
            ]
            actions.append(
                await _step(self.backend.restore(input.group, move.admit), RESTORE_FAILED)
            )
        activity.logger.info(
            "group %s epoch %d: node %s admitted %s (evicted %s)",
            input.group,
            input.epoch,
            self.node,
            move.admit,
            evict or "nothing",
        )
        self._admitted[input.group] = move.admit
        gone = [job for job in [move.admit, *evict] if self.processes.gone(input.group, job)]
        return SwitchOutput(
            node=self.node,
            backend=self.backend.name,
            actions=actions,
            seconds=time.monotonic() - started,
            gone=gone,
        )

    def _registered(self, group: str, job: str) -> None:
        holder = self._admitted.get(group)
        if holder is not None and holder != job:
            task = asyncio.get_running_loop().create_task(self._lock_newcomer(group, job))
            self._background.add(task)
            task.add_done_callback(self._background.discard)

    async def _lock_newcomer(self, group: str, job: str) -> None:
        async with self._locks[group]:
            if self._admitted.get(group) not in (None, job):
                try:
                    await self.backend.checkpoint(group, job)
                except BackendError as error:
                    log.warning("could not lock newcomer %s/%s: %s", group, job, error)


async def _step(action: Awaitable[BackendAction], failure_type: str) -> BackendAction:
    with tracer.start_as_current_span(f"timeshare.{PHASE_OF_FAILURE[failure_type]}") as span:
        try:
            done = await action
        except BackendError as error:
            span.set_status(trace.StatusCode.ERROR, str(error))
            raise ApplicationError(str(error), type=failure_type) from None
        span.set_attributes({"timeshare.job": done.job, "timeshare.bytes": done.bytes})
        return done


@contextlib.asynccontextmanager
async def _heartbeating() -> AsyncIterator[None]:
    """Heartbeat while the backend works, so a dead agent is noticed within
    the heartbeat timeout rather than the activity's whole time limit."""

    async def beat() -> None:
        while True:
            activity.heartbeat()
            await asyncio.sleep(HEARTBEAT_SECONDS)

    task = asyncio.create_task(beat())
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
