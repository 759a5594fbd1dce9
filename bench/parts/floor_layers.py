"""The floors' workflows: what Temporal itself costs, and what one hand-over
costs the workflow worker, layer by layer, from the protocol's bare shape up
to timeshare's own GroupWorkflow. Each layer runs on a task queue of its own
(its worker a ``python -m bench floors worker`` process), so that side by
side each worker's CPU is its own layer's.

- ``pair``: no hand-over: a trivial update (as a waiter's acquire arrives)
  and an update awaiting one activity on another task queue (what a
  one-node switch costs at least); with ``publishes`` also the search
  attribute upserts a hand-over makes for the turn watch.
- ``shape``: the switch protocol (docs/guide/taking-turns.md) and nothing else,
  strings in and out: the waiter's acquire stays open until its grant, the
  holder's yield returns at once, then one activity (the switch) and the
  grant, in that same workflow task.
- ``messages``: the same with the scheduler's pydantic messages on every
  boundary; ``published``: and the two upserts the turn watch reads.
- ``group``: GroupWorkflow itself, sent the same updates directly (no
  gateway), its switch a no-op activity, its worker on the scheduler's
  settings (``--settings scheduler``); the others keep the SDK's defaults.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Literal

from temporalio import activity, workflow
from temporalio.client import Client, WorkflowHandle
from temporalio.worker import Worker

with workflow.unsafe.imports_passed_through():
    from timeshare.models import (
        AcquireResult,
        BackendAction,
        Grant,
        GroupPolicy,
        NodeMove,
        ReleaseInput,
        ReleaseOutput,
        SwitchInput,
        SwitchOutput,
        YieldOutput,
    )
    from timeshare.names import group_workflow_id, node_task_queue
    from timeshare.scheduling import events as ev
    from timeshare.scheduling.watch import MEMO_KEY, WatchRecord
    from timeshare.workflows.group import GroupInput, GroupWorkflow
    from timeshare.workflows.visibility import HOLDER, QUEUE_DEPTH

# A group's jobs take turns in this order, as bench.parts.scale_load's do.
JOBS = ("job-0", "job-1", "job-2")
TOKEN_HASH = hashlib.sha256(b"bench-handover-floors").hexdigest()
SWITCH_TIMEOUT = timedelta(seconds=30)


def activity_queue(workflow_queue: str) -> str:
    """Each layer's switch runs on a queue of its own, named after its workflows'."""
    return f"{workflow_queue}.activity"


@activity.defn(name="floor_noop")
async def floor_noop() -> None:
    return None


@activity.defn
async def switch(input: SwitchInput) -> SwitchOutput:
    """The switch of the typed layers and of the group's node: nothing moves,
    and the answer has the shape of the sim backend's for a zero-byte switch
    (activities/backends/sim.py: a checkpoint per job evicted, a restore of
    the one admitted), so that the workflow decodes and records as much."""
    move = input.move
    actions = [BackendAction(job=job, action="checkpoint") for job in move.evict]
    if move.admit:
        actions.append(BackendAction(job=move.admit, action="restore"))
    return SwitchOutput(node=move.node, backend="none", actions=actions)


@activity.defn
async def release(input: ReleaseInput) -> ReleaseOutput:
    return ReleaseOutput(node="", job=input.job)


@workflow.defn(name="FloorWorkflow")
class FloorWorkflow:
    """The ``pair`` layer."""

    @workflow.init
    def __init__(self, publishes: bool = False) -> None:
        self._done = False
        self._publishes = publishes
        self._grants = 0

    @workflow.run
    async def run(self, publishes: bool = False) -> None:
        await workflow.wait_condition(lambda: self._done)

    @workflow.update
    def ping(self) -> None:
        if self._publishes:  # as a waiter's acquire: one more job waits
            workflow.upsert_search_attributes([QUEUE_DEPTH.value_set(1)])

    @workflow.update
    async def via_activity(self) -> None:
        await workflow.execute_activity(
            "floor_noop",
            task_queue=activity_queue(workflow.info().task_queue),
            start_to_close_timeout=SWITCH_TIMEOUT,
        )
        if self._publishes:  # as the grant after a switch: a new holder, nobody waits
            self._grants += 1
            holder = HOLDER.value_set(f"job-{self._grants % 3}")
            workflow.upsert_search_attributes([holder, QUEUE_DEPTH.value_set(0)])

    @workflow.signal
    def finish(self) -> None:
        self._done = True


# The pair's two updates, each a floor of its own.
FLOORS = (("update", FloorWorkflow.ping), ("update+activity", FloorWorkflow.via_activity))


async def start_floor(
    client: Client, task_queue: str, publishes: bool = False
) -> WorkflowHandle[FloorWorkflow, None]:
    return await client.start_workflow(
        FloorWorkflow.run, publishes, id=f"floor-{uuid.uuid4().hex[:8]}", task_queue=task_queue
    )


@workflow.defn(name="HandOverFloorWorkflow")
class HandOverFloorWorkflow:
    """The ``shape`` layer (strings in and out), with ``typed`` the
    ``messages`` one, and with ``publishes`` too the ``published`` one."""

    @workflow.init
    def __init__(self, typed: bool = False, publishes: bool = False) -> None:
        self._publishes = publishes
        self._holder = ""
        self._last_holder = ""
        self._waiting: list[ev.Acquire | str] = []
        self._grants: dict[str, Grant] = {}
        self._epoch = 0
        self._done = False

    @workflow.run
    async def run(self, typed: bool = False, publishes: bool = False) -> None:
        while True:
            await workflow.wait_condition(
                lambda: self._done or (not self._holder and bool(self._waiting))
            )
            if self._done:
                return
            request = self._waiting[0]
            queue = activity_queue(workflow.info().task_queue)
            if isinstance(request, str):
                await workflow.execute_activity(
                    "floor_noop", task_queue=queue, start_to_close_timeout=SWITCH_TIMEOUT
                )
                self._holder = request
                self._waiting.pop(0)
                continue
            # As a group's one-job GPU: the last holder leaves it.
            evict = [self._last_holder] if self._last_holder else []
            move = NodeMove(node="floor-node", admit=request.job, evict=evict)
            output = await workflow.execute_activity(
                switch,
                SwitchInput(group=workflow.info().workflow_id, epoch=self._epoch + 1, move=move),
                task_queue=queue, start_to_close_timeout=SWITCH_TIMEOUT,
            )  # fmt: skip
            self._waiting.pop(0)
            self._epoch += 1
            self._holder = self._last_holder = request.job
            self._grants[request.job] = Grant(
                job=request.job, request_id=request.request_id, epoch=self._epoch,
                ticket=self._epoch, granted_at=workflow.time(), waited_seconds=0.0,
                switch_seconds=output.seconds,
            )  # fmt: skip
            if self._publishes:
                depth = QUEUE_DEPTH.value_set(len(self._waiting))
                workflow.upsert_search_attributes([HOLDER.value_set(request.job), depth])

    @workflow.update
    async def acquire(self, input: ev.Acquire | str) -> AcquireResult | None:
        self._waiting.append(input)
        if self._publishes:
            workflow.upsert_search_attributes([QUEUE_DEPTH.value_set(len(self._waiting))])
        job = input if isinstance(input, str) else input.job
        await workflow.wait_condition(lambda: self._holder == job)
        return None if isinstance(input, str) else AcquireResult(grant=self._grants[job])

    @workflow.update(name="yield")
    def yield_turn(self, input: ev.Yield | str) -> YieldOutput | None:
        if self._holder == (input if isinstance(input, str) else input.job):
            self._holder = ""
        return None if isinstance(input, str) else YieldOutput(held_seconds=0.0)

    @workflow.signal
    def finish(self) -> None:
        self._done = True


@dataclass(frozen=True)
class Held:
    """The turn a job holds: what its yield names."""

    job: str
    epoch: int = 0


async def _typed_acquire(handle: WorkflowHandle[Any, Any], job: str) -> Grant:
    while True:  # a GroupWorkflow answers "still waiting" after each wait slice
        request = ev.Acquire(job=job, token_hash=TOKEN_HASH, request_id=uuid.uuid4().hex)
        result: AcquireResult = await handle.execute_update(
            "acquire", request, result_type=AcquireResult
        )
        if result.grant is not None:
            if result.grant.job != job:
                raise RuntimeError(f"{job} asked and {result.grant.job} was granted")
            return result.grant


@dataclass(frozen=True)
class Layer:
    """How the benchmark starts, drives and ends one layer's workflows."""

    name: str
    kind: Literal["pair", "shape", "messages", "group"]
    publishes: bool = False

    @property
    def typed(self) -> bool:
        return self.kind in ("messages", "group")

    @property
    def task_queue(self) -> str:
        return f"floor-{self.name}"

    @property
    def node(self) -> str:
        """The group layer's one node, whose agent the benchmark plays."""
        return f"bench-floor-{self.name}"

    def activity_worker(self, client: Client, concurrency: int) -> Worker:
        if self.kind == "group":
            activities: list[Callable[..., Any]] = [switch, release]
            queue = node_task_queue(self.node)
        else:
            activities = [switch] if self.typed else [floor_noop]
            queue = activity_queue(self.task_queue)
        return Worker(
            client, task_queue=queue, activities=activities, max_concurrent_activities=concurrency
        )

    async def start(self, client: Client) -> WorkflowHandle[Any, Any]:
        name = f"floor-{self.name}-{uuid.uuid4().hex[:8]}"
        if self.kind == "pair":
            return await start_floor(client, self.task_queue, self.publishes)
        if self.kind != "group":
            return await client.start_workflow(
                HandOverFloorWorkflow.run, args=[self.typed, self.publishes], id=name,
                task_queue=self.task_queue,
            )  # fmt: skip
        policy = GroupPolicy(gpus=[0])
        handle = await client.start_workflow(
            GroupWorkflow.run,
            GroupInput(group=name, policy=policy),
            id=group_workflow_id(name),
            task_queue=self.task_queue,
            memo={MEMO_KEY: WatchRecord.for_policy(policy)},
        )
        for job in JOBS:
            join = ev.Join(job=job, nodes=[self.node], token_hash=TOKEN_HASH)
            await handle.execute_update(GroupWorkflow.join, join)
        return handle

    async def hand_over(
        self, handle: WorkflowHandle[Any, Any], holder: Held | None, waiter: str,
        ask_at: float, yield_at: float,
    ) -> Held:  # fmt: skip
        """One hand-over, timed as bench.parts.scale_load times a group's: the
        waiter asks at ``ask_at``, the holder yields at ``yield_at``
        (time.monotonic()); returns once the waiter is granted. The pair
        sends its trivial update at ``ask_at``, the one awaiting the
        activity at ``yield_at``."""
        await asyncio.sleep(max(0.0, ask_at - time.monotonic()))
        if self.kind == "pair":
            await handle.execute_update(FloorWorkflow.ping)
            await asyncio.sleep(max(0.0, yield_at - time.monotonic()))
            await handle.execute_update(FloorWorkflow.via_activity)
            return Held(waiter)
        granted: asyncio.Future[Grant | None] = asyncio.ensure_future(
            _typed_acquire(handle, waiter)
            if self.typed
            else handle.execute_update("acquire", waiter, result_type=type(None))
        )
        try:
            await asyncio.sleep(max(0.0, yield_at - time.monotonic()))
            if holder is not None:
                given_back: object = (
                    ev.Yield(job=holder.job, token_hash=TOKEN_HASH, epoch=holder.epoch)
                    if self.typed
                    else holder.job
                )
                await handle.execute_update("yield", given_back)
            grant = await granted
        finally:
            # A hand-over cut short by the window's end leaves no call waiting
            # (the client raises its own error for the cancelled call: taken here).
            granted.cancel()
            await asyncio.gather(granted, return_exceptions=True)
        return Held(waiter, grant.epoch if grant is not None else 0)

    async def finish(self, handle: WorkflowHandle[Any, Any]) -> None:
        """End the workflow: a group never ends by itself, so it is terminated."""
        if self.kind == "group":
            await handle.terminate("the benchmark is over")
            return
        await handle.signal("finish")
        await handle.result()


PAIR = Layer("pair", "pair")
# The hand-over-shaped layers.
LAYERS = {
    layer.name: layer
    for layer in (
        Layer("shape", "shape"),
        Layer("messages", "messages"),
        Layer("published", "messages", publishes=True),
        Layer("group", "group"),
    )
}
WORKFLOWS = [FloorWorkflow, HandOverFloorWorkflow, GroupWorkflow]
