"""What a hand-over costs Temporal, counted by kind from the groups'
histories: the workflow tasks by what woke each one, and the writes to the
visibility store (an upsert of search attributes or of the memo: each is a
visibility task and a row written there). bench.scale prints them per
hand-over beside the server's own request counters (DescribeWorkflowExecution
among them), and docs/benchmarks.md says which a hand-over needs.

A workflow task's cause is what it delivered: an activity's result, a timer
that fired, a signal, or the updates it accepted or rejected (by name). A
task that delivered several (an update that arrived while the worker was
busy with an activity's result) is counted once, under all of them joined
by ``+``."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

from temporalio.api.enums.v1 import EventType
from temporalio.api.history.v1 import HistoryEvent

E = EventType
# What a workflow task is woken by, other than an update (those are named by
# the events that accept or reject them, right after the task completes).
WAKES = {
    E.EVENT_TYPE_ACTIVITY_TASK_COMPLETED: "activity result",
    E.EVENT_TYPE_ACTIVITY_TASK_FAILED: "activity result",
    E.EVENT_TYPE_ACTIVITY_TASK_TIMED_OUT: "activity result",
    E.EVENT_TYPE_ACTIVITY_TASK_CANCELED: "activity result",
    E.EVENT_TYPE_TIMER_FIRED: "timer",
    E.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED: "signal",
    E.EVENT_TYPE_WORKFLOW_EXECUTION_STARTED: "start",
}
VISIBILITY_WRITES = {
    E.EVENT_TYPE_UPSERT_WORKFLOW_SEARCH_ATTRIBUTES: "search attributes",
    E.EVENT_TYPE_WORKFLOW_PROPERTIES_MODIFIED: "memo",
}


def _update_name(event: HistoryEvent) -> str | None:
    if event.HasField("workflow_execution_update_accepted_event_attributes"):
        return event.workflow_execution_update_accepted_event_attributes.accepted_request.input.name
    if event.HasField("workflow_execution_update_rejected_event_attributes"):
        rejected = event.workflow_execution_update_rejected_event_attributes
        return f"{rejected.rejected_request.input.name} (rejected)"
    return None


def task_causes(events: Iterable[HistoryEvent], start: float, end: float) -> Counter[str]:
    """One group's workflow tasks completed between ``start`` and ``end``
    (Unix seconds), by cause. ``events``: the group's history, in order."""
    causes: Counter[str] = Counter()
    woken: set[str] = set()
    pending: tuple[set[str], bool] | None = None  # a completed task's causes, and if counted

    def close() -> None:
        if pending is not None and pending[1]:
            causes["+".join(sorted(pending[0])) or "other"] += 1

    for event in events:
        if event.event_type == E.EVENT_TYPE_WORKFLOW_TASK_COMPLETED:
            close()
            at = event.event_time.ToMicroseconds() / 1e6
            pending, woken = (woken, start <= at <= end), set()
        elif (update := _update_name(event)) is not None and pending is not None:
            pending[0].add(f"update {update}")
        elif event.event_type in WAKES:
            woken.add(WAKES[event.event_type])
        elif event.event_type == E.EVENT_TYPE_WORKFLOW_TASK_SCHEDULED:
            close()
            pending = None
    close()
    return causes


def visibility_writes(events: Iterable[HistoryEvent], start: float, end: float) -> Counter[str]:
    """One group's writes to the visibility store between ``start`` and ``end``, by kind."""
    return Counter(
        VISIBILITY_WRITES[event.event_type]
        for event in events
        if event.event_type in VISIBILITY_WRITES
        and start <= event.event_time.ToMicroseconds() / 1e6 <= end
    )
