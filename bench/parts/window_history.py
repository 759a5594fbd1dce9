"""What the groups' histories hold, counted: per hand-over in a load's
measured window, how many workflow tasks, updates, activities, timers and
upserts a hand-over costs Temporal and the scheduler (to set beside the
floor's three workflow tasks: a trivial update, and an update awaiting one
activity), what woke each workflow task and what was written to the
visibility store (bench.parts.handover_kinds); and which worker completed
each workflow task."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

from temporalio.api.enums.v1 import EventType
from temporalio.api.history.v1 import HistoryEvent
from temporalio.client import Client

from bench.parts.handover_kinds import task_causes, visibility_writes
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


def recorded_at(event: HistoryEvent) -> float:
    """When Temporal recorded the event, Unix seconds."""
    return event.event_time.ToMicroseconds() / 1e6


async def histories(client: Client, groups: list[str]) -> list[list[HistoryEvent]]:
    """Each group's history, in the order of ``groups``."""

    async def one(group: str) -> list[HistoryEvent]:
        handle = client.get_workflow_handle(group_workflow_id(group))
        return [event async for event in handle.fetch_history_events()]

    return await bounded([partial(one, group) for group in groups])


async def count_events(
    client: Client,
    groups: list[str],
    key: Callable[[HistoryEvent], str | None],
    window: tuple[float, float] = (0.0, float("inf")),
) -> Counter[str]:
    """The groups' events between the window's start and end (Unix
    seconds), counted by ``key`` (None: not counted)."""
    start, end = window
    return Counter(
        counted
        for events in await histories(client, groups)
        for event in events
        if start <= recorded_at(event) <= end and (counted := key(event)) is not None
    )


@dataclass
class WindowCounts:
    """What the load's groups wrote between the window's start and end: events
    by type, workflow tasks by cause, visibility writes by kind."""

    events: Counter[str]
    causes: Counter[str]
    visibility: Counter[str]


async def window_counts(client: Client, result: LoadResult) -> WindowCounts:
    start, end = result.window
    counts = WindowCounts(Counter(), Counter(), Counter())
    for events in await histories(client, result.group_names):
        counts.events.update(event_name(e) for e in events if start <= recorded_at(e) <= end)
        counts.causes.update(task_causes(events, start, end))
        counts.visibility.update(visibility_writes(events, start, end))
    return counts
