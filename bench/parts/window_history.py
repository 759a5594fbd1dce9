"""What the groups' histories hold, counted: per hand-over in a load's
measured window, how many workflow tasks, updates, activities, timers and
upserts a hand-over costs Temporal and the scheduler (to set beside the
floor's three workflow tasks: a trivial update, and an update awaiting one
activity); and which worker completed each workflow task."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from functools import partial

from temporalio.api.enums.v1 import EventType
from temporalio.api.history.v1 import HistoryEvent
from temporalio.client import Client

from bench.parts.scale_load import LoadResult, bounded
from timeshare.names import group_workflow_id


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


def task_worker(event: HistoryEvent) -> str | None:
    """The identity of the worker that completed a workflow task."""
    if event.event_type != EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED:
        return None
    return event.workflow_task_completed_event_attributes.identity


async def count_events(
    client: Client,
    groups: list[str],
    key: Callable[[HistoryEvent], str | None],
    window: tuple[float, float] = (0.0, float("inf")),
) -> Counter[str]:
    """The groups' events between the window's start and end (Unix
    seconds), counted by ``key`` (None: not counted)."""
    start, end = window

    async def one(group: str) -> Counter[str]:
        handle = client.get_workflow_handle(group_workflow_id(group))
        return Counter(
            [
                counted
                async for event in handle.fetch_history_events()
                if start <= event.event_time.ToMicroseconds() / 1e6 <= end
                and (counted := key(event)) is not None
            ]
        )

    counts: Counter[str] = Counter()
    for group_counts in await bounded([partial(one, group) for group in groups]):
        counts.update(group_counts)
    return counts


async def window_events(client: Client, result: LoadResult) -> Counter[str]:
    """Events the load's groups wrote between the window's start and end."""
    return await count_events(client, result.group_names, event_name, result.window)
