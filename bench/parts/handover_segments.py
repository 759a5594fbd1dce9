"""Where a hand-over's time goes: the group's history timestamps between A's
yield call and waiting B's acquire returning, cut into the hops Temporal
makes. The server stamps each event when it records it, on the same clock as
the benchmark's (one machine), so a hop is the gap between two stamps.

A hand-over on one node is, in order:
    yield call ........ WORKFLOW_TASK_STARTED           client, gateway, Temporal, dispatch
    the yield's task .. WORKFLOW_TASK_COMPLETED         the scheduler plans the switch
    ACTIVITY_TASK_SCHEDULED .. ACTIVITY_TASK_STARTED    dispatch to the node's agent
    .. ACTIVITY_TASK_COMPLETED                          the agent's switch, SDK included
    .. WORKFLOW_TASK_STARTED                            dispatch back to the scheduler
    .. WORKFLOW_TASK_COMPLETED                          the grant
    .. B's acquire returns                              commit, gateway, client
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from temporalio.api.enums.v1 import EventType
from temporalio.client import WorkflowHandle

SEGMENTS = (
    "yield call to the scheduler's task",
    "scheduler: the yield's workflow task",
    "switch activity dispatched to the agent",
    "agent: the switch activity",
    "workflow task dispatched to the scheduler",
    "scheduler: the grant's workflow task",
    "grant delivered to B",
)


@dataclass(frozen=True)
class Event:
    """One history event: when the server recorded it (epoch seconds), its
    type without the EVENT_TYPE_ prefix, and an activity's type if any."""

    at: float
    kind: str
    activity: str = ""


async def history_events(handle: WorkflowHandle[Any, Any]) -> list[Event]:
    return [
        Event(
            event.event_time.ToMicroseconds() / 1e6,
            EventType.Name(event.event_type).removeprefix("EVENT_TYPE_"),
            event.activity_task_scheduled_event_attributes.activity_type.name,
        )
        async for event in handle.fetch_history_events()
    ]


class IncompleteHandover(ValueError):
    pass


def segments(events: Sequence[Event], yielded_at: float, granted_at: float) -> list[float]:
    """Milliseconds of each of SEGMENTS in the hand-over between the two
    wall-clock times; the events in history order."""
    within = [e for e in events if yielded_at <= e.at <= granted_at]
    cursor = 0

    def next_of(kind: str, activity: str = "") -> float:
        nonlocal cursor
        for index in range(cursor, len(within)):
            event = within[index]
            if event.kind == kind and (not activity or event.activity == activity):
                cursor = index + 1
                return event.at
        raise IncompleteHandover(f"no {kind} between the yield and the grant")

    task_started = next_of("WORKFLOW_TASK_STARTED")
    task_completed = next_of("WORKFLOW_TASK_COMPLETED")
    switch_scheduled = next_of("ACTIVITY_TASK_SCHEDULED", "switch")
    switch_started = next_of("ACTIVITY_TASK_STARTED")
    switch_completed = next_of("ACTIVITY_TASK_COMPLETED")
    grant_started = next_of("WORKFLOW_TASK_STARTED")
    grant_completed = next_of("WORKFLOW_TASK_COMPLETED")
    spans = [
        (yielded_at, task_started),
        (task_started, task_completed),
        (switch_scheduled, switch_started),
        (switch_started, switch_completed),
        (switch_completed, grant_started),
        (grant_started, grant_completed),
        (grant_completed, granted_at),
    ]
    return [(end - start) * 1000 for start, end in spans]


# The hops of SEGMENTS an update awaiting an activity has too (the floor):
# every one but the first and the last, which pass through the gateway.
FLOOR_SEGMENTS = SEGMENTS[1:-1]
# What follows an activity's scheduling, in order, to its result's task.
_ACTIVITY_RUN = (
    "ACTIVITY_TASK_STARTED",
    "ACTIVITY_TASK_COMPLETED",
    "WORKFLOW_TASK_STARTED",
    "WORKFLOW_TASK_COMPLETED",
)


def floor_segments(events: Sequence[Event]) -> list[list[float]]:
    """Milliseconds of each of FLOOR_SEGMENTS in each activity of a floor
    workflow's history: the task that scheduled it, its dispatch and run, the
    dispatch of the task its result makes, and that task."""
    found = []
    for index, event in enumerate(events):
        if event.kind != "ACTIVITY_TASK_SCHEDULED":
            continue
        before = events[:index]
        started = next((e for e in reversed(before) if e.kind == "WORKFLOW_TASK_STARTED"), None)
        completed = next((e for e in reversed(before) if e.kind == "WORKFLOW_TASK_COMPLETED"), None)
        run, cursor = [], index + 1
        for kind in _ACTIVITY_RUN:
            cursor = next((i for i in range(cursor, len(events)) if events[i].kind == kind), -1)
            if cursor < 0:
                break
            run.append(events[cursor].at)
        if started is None or completed is None or len(run) < len(_ACTIVITY_RUN):
            continue
        times = [started.at, completed.at, event.at, *run]
        spans = [(0, 1), (2, 3), (3, 4), (4, 5), (5, 6)]
        found.append([(times[end] - times[start]) * 1000 for start, end in spans])
    return found


def all_segments(
    events: Sequence[Event], handovers: Iterable[tuple[float, float]]
) -> list[list[float]]:
    """segments() of every hand-over whose events are all there."""
    found = []
    for yielded_at, granted_at in handovers:
        try:
            found.append(segments(events, yielded_at, granted_at))
        except IncompleteHandover:
            continue
    return found
