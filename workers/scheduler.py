"""The scheduler worker: runs GroupWorkflow and the node registry. Stateless."""

from __future__ import annotations

import asyncio
from datetime import timedelta

from temporalio.worker import Worker

from timeshare.names import SCHEDULER_TASK_QUEUE
from workers.service import connect_temporal, ready
from workers.temporal_settings import TemporalSettings
from workflows.group import GroupWorkflow
from workflows.registry import NodeRegistryWorkflow

STICKY_TIMEOUT = timedelta(seconds=2)


async def serve_scheduler(stop: asyncio.Event, temporal: TemporalSettings) -> None:
    client = await connect_temporal(temporal)
    worker = Worker(
        client,
        task_queue=SCHEDULER_TASK_QUEUE,
        workflows=[GroupWorkflow, NodeRegistryWorkflow],
        # A group's next task waits this long for a worker that died holding
        # its cached history before any other replica takes it (default 10 s).
        sticky_queue_schedule_to_start_timeout=STICKY_TIMEOUT,
    )
    async with worker:
        ready("scheduler", f"task queue {SCHEDULER_TASK_QUEUE} on {temporal.describe()}")
        await stop.wait()
