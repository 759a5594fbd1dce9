"""bench.parts.handover_kinds names what woke each workflow task and counts
the visibility writes, from a history's events."""

from __future__ import annotations

from temporalio.api.enums.v1 import EventType
from temporalio.api.history.v1 import HistoryEvent

from bench.parts.handover_kinds import task_causes, visibility_writes

E = EventType


def event(at: float, kind: int, update: str = "", rejected: bool = False) -> HistoryEvent:
    made = HistoryEvent(event_type=kind)  # type: ignore[arg-type]
    made.event_time.FromMicroseconds(int(at * 1e6))
    if update and rejected:
        made.workflow_execution_update_rejected_event_attributes.rejected_request.input.name = (
            update
        )
    elif update:
        made.workflow_execution_update_accepted_event_attributes.accepted_request.input.name = (
            update
        )
    return made


def task(at: float, *then: HistoryEvent) -> list[HistoryEvent]:
    """A speculative task (an update's): its three events at once, then what it wrote."""
    return [
        event(at, E.EVENT_TYPE_WORKFLOW_TASK_SCHEDULED),
        event(at, E.EVENT_TYPE_WORKFLOW_TASK_STARTED),
        event(at, E.EVENT_TYPE_WORKFLOW_TASK_COMPLETED),
        *then,
    ]


def woken(at: float, by: int, *then: HistoryEvent) -> list[HistoryEvent]:
    """A task woken by an event (an activity's result, a timer)."""
    return [event(at, by), *task(at, *then)]


# A hand-over as the groups' histories have it: the waiter's acquire, the
# holder's yield (which schedules the switch), the switch's result (the grant);
# then a timer, and an activity's result that a heartbeat arrived with.
HISTORY = [
    *task(1.0, event(1.0, E.EVENT_TYPE_WORKFLOW_EXECUTION_UPDATE_ACCEPTED, "acquire"),
          event(1.0, E.EVENT_TYPE_UPSERT_WORKFLOW_SEARCH_ATTRIBUTES)),
    *task(2.0, event(2.0, E.EVENT_TYPE_WORKFLOW_EXECUTION_UPDATE_ACCEPTED, "yield"),
          event(2.0, E.EVENT_TYPE_WORKFLOW_EXECUTION_UPDATE_COMPLETED),
          event(2.0, E.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED)),
    event(2.1, E.EVENT_TYPE_ACTIVITY_TASK_STARTED),
    *woken(2.1, E.EVENT_TYPE_ACTIVITY_TASK_COMPLETED,
           event(2.1, E.EVENT_TYPE_UPSERT_WORKFLOW_SEARCH_ATTRIBUTES),
           event(2.1, E.EVENT_TYPE_WORKFLOW_PROPERTIES_MODIFIED),
           event(2.1, E.EVENT_TYPE_WORKFLOW_EXECUTION_UPDATE_COMPLETED)),
    *woken(3.0, E.EVENT_TYPE_TIMER_FIRED),
    *woken(4.0, E.EVENT_TYPE_ACTIVITY_TASK_COMPLETED,
           event(4.0, E.EVENT_TYPE_WORKFLOW_EXECUTION_UPDATE_ACCEPTED, "heartbeat"),
           event(4.0, E.EVENT_TYPE_WORKFLOW_EXECUTION_UPDATE_COMPLETED)),
    *task(5.0, event(5.0, E.EVENT_TYPE_WORKFLOW_EXECUTION_UPDATE_REJECTED, "acquire", True)),
]  # fmt: skip


def test_each_task_is_named_by_what_it_delivered() -> None:
    assert task_causes(HISTORY, 0.0, 10.0) == {
        "update acquire": 1,
        "update yield": 1,
        "activity result": 1,
        "timer": 1,
        "activity result+update heartbeat": 1,
        "update acquire (rejected)": 1,
    }


def test_only_tasks_completed_in_the_window_count() -> None:
    assert task_causes(HISTORY, 1.5, 3.5) == {"update yield": 1, "activity result": 1, "timer": 1}


def test_visibility_writes_are_the_upserts_in_the_window() -> None:
    assert visibility_writes(HISTORY, 0.0, 10.0) == {"search attributes": 2, "memo": 1}
    assert visibility_writes(HISTORY, 1.5, 10.0) == {"search attributes": 1, "memo": 1}
