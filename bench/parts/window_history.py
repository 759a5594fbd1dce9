"""What the groups' histories gained during a load's measured window, per
hand-over: how many workflow tasks, updates, activities, timers and upserts a
hand-over costs Temporal and the scheduler, to set beside the floor's three
workflow tasks (a trivial update, and an update awaiting one activity)."""

from __future__ import annotations

import asyncio
from collections import Counter

from temporalio.api.enums.v1 import EventType
from temporalio.api.history.v1 import HistoryEvent
from temporalio.client import Client

from bench.parts.scale_load import LoadResult
from timeshare.names import group_workflow_id

# Histories read at once.
CONCURRENT_READS = 8


def event_name(event: HistoryEvent) -> str:
    """The event's type; an accepted update's also names the update, a
    scheduled activity's its type."""
    name = EventType.Name(event.event_type).removeprefix("EVENT_TYPE_")
    if event.HasField("workflow_execution_update_accepted_event_attributes"):
        accepted = event.workflow_execution_update_accepted_event_attributes
        name += f" ({accepted.accepted_request.input.name})"
    elif event.HasField("activity_task_scheduled_event_attributes"):
        name += f" ({event.activity_task_scheduled_event_attributes.activity_type.name})"
    return name


async def window_events(client: Client, result: LoadResult) -> Counter[str]:
    """Events the load's groups wrote between the window's start and end."""
    start, end = result.window
    gate = asyncio.Semaphore(CONCURRENT_READS)

    async def one(group: str) -> Counter[str]:
        async with gate:
            handle = client.get_workflow_handle(group_workflow_id(group))
            return Counter(
                [
                    event_name(event)
                    async for event in handle.fetch_history_events()
                    if start <= event.event_time.ToMicroseconds() / 1e6 <= end
                ]
            )

    counts: Counter[str] = Counter()
    for group_counts in await asyncio.gather(*(one(g) for g in result.group_names)):
        counts.update(group_counts)
    return counts


def workflow_tasks(counts: Counter[str]) -> int:
    return counts["WORKFLOW_TASK_COMPLETED"]
