"""Temporal's own floors on the same server, for comparison with timeshare's
hand-over: a trivial update round trip, and an update whose handler awaits one
activity on another task queue (what a one-node switch costs at least)."""

from __future__ import annotations

import time
import uuid
from datetime import timedelta

from temporalio import activity, workflow
from temporalio.client import Client
from temporalio.worker import Worker

WORKFLOW_QUEUE = "bench.floor"
ACTIVITY_QUEUE = "bench.floor.activity"


@activity.defn(name="floor_noop")
async def floor_noop() -> None:
    return None


@workflow.defn(name="FloorWorkflow", sandboxed=False)
class FloorWorkflow:
    def __init__(self) -> None:
        self._done = False

    @workflow.run
    async def run(self) -> None:
        await workflow.wait_condition(lambda: self._done)

    @workflow.update
    def ping(self) -> None:
        return None

    @workflow.update
    async def via_activity(self) -> None:
        await workflow.execute_activity(
            "floor_noop", task_queue=ACTIVITY_QUEUE, start_to_close_timeout=timedelta(seconds=30)
        )

    @workflow.signal
    def finish(self) -> None:
        self._done = True


async def measure_floors(client: Client, iterations: int) -> dict[str, list[float]]:
    """Milliseconds per round trip of each floor."""
    timings: dict[str, list[float]] = {"update": [], "update+activity": []}
    async with (
        Worker(client, task_queue=WORKFLOW_QUEUE, workflows=[FloorWorkflow]),
        Worker(client, task_queue=ACTIVITY_QUEUE, activities=[floor_noop]),
    ):
        handle = await client.start_workflow(
            FloorWorkflow.run, id=f"floor-{uuid.uuid4().hex[:8]}", task_queue=WORKFLOW_QUEUE
        )
        for name, update in (
            ("update", FloorWorkflow.ping),
            ("update+activity", FloorWorkflow.via_activity),
        ):
            await handle.execute_update(update)  # warm up
            for _ in range(iterations):
                start = time.perf_counter()
                await handle.execute_update(update)
                timings[name].append((time.perf_counter() - start) * 1000)
        await handle.signal(FloorWorkflow.finish)
        await handle.result()
    return timings
