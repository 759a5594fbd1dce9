"""bench.parts.handover_segments cuts a hand-over at the right events."""

from __future__ import annotations

import pytest

from bench.parts.handover_segments import (
    SEGMENTS,
    Event,
    IncompleteHandover,
    all_segments,
    floor_segments,
    segments,
)

# One hand-over as a group's history has it (times in ms after the yield call
# at 100 s), with the previous hand-over's events before it and B's own
# yield's after it, which must not be taken for this one's.
HANDOVER = [
    (-40.0, "WORKFLOW_TASK_STARTED", ""),
    (-30.0, "WORKFLOW_TASK_COMPLETED", ""),
    (-29.0, "ACTIVITY_TASK_SCHEDULED", "switch"),
    (5.0, "WORKFLOW_TASK_STARTED", ""),
    (14.0, "WORKFLOW_TASK_COMPLETED", ""),
    (14.5, "UPSERT_WORKFLOW_SEARCH_ATTRIBUTES", ""),
    (15.0, "ACTIVITY_TASK_SCHEDULED", "switch"),
    (21.0, "ACTIVITY_TASK_STARTED", ""),
    (28.0, "ACTIVITY_TASK_COMPLETED", ""),
    (28.0, "WORKFLOW_TASK_SCHEDULED", ""),
    (32.0, "WORKFLOW_TASK_STARTED", ""),
    (41.0, "WORKFLOW_TASK_COMPLETED", ""),
    (42.0, "WORKFLOW_EXECUTION_UPDATE_COMPLETED", ""),
    (60.0, "WORKFLOW_TASK_STARTED", ""),
]


def events() -> list[Event]:
    return [Event(100 + at / 1000, kind, activity) for at, kind, activity in HANDOVER]


def test_each_hop_is_the_gap_between_its_own_two_events() -> None:
    found = segments(events(), 100.0, 100.050)
    assert len(found) == len(SEGMENTS)
    assert found == pytest.approx([5.0, 9.0, 6.0, 7.0, 4.0, 9.0, 9.0])


def test_a_handover_whose_switch_is_not_in_the_history_is_left_out() -> None:
    without_switch = [e for e in events() if e.activity != "switch" or e.at < 100]
    with pytest.raises(IncompleteHandover):
        segments(without_switch, 100.0, 100.050)
    assert all_segments(without_switch, [(100.0, 100.050)]) == []
    assert len(all_segments(events(), [(100.0, 100.050), (100.0, 100.020)])) == 1


# A floor workflow's history: a trivial update (a task of its own, no
# activity), then an update awaiting an activity, then one whose activity
# never ran (the workflow was finished): only the second is a whole floor.
FLOOR = [
    (0.0, "WORKFLOW_TASK_STARTED", ""),
    (2.0, "WORKFLOW_TASK_COMPLETED", ""),
    (10.0, "WORKFLOW_TASK_STARTED", ""),
    (13.0, "WORKFLOW_TASK_COMPLETED", ""),
    (13.0, "ACTIVITY_TASK_SCHEDULED", "floor_noop"),
    (15.0, "ACTIVITY_TASK_STARTED", ""),
    (19.0, "ACTIVITY_TASK_COMPLETED", ""),
    (19.0, "WORKFLOW_TASK_SCHEDULED", ""),
    (20.5, "WORKFLOW_TASK_STARTED", ""),
    (24.0, "WORKFLOW_TASK_COMPLETED", ""),
    (30.0, "WORKFLOW_TASK_STARTED", ""),
    (31.0, "WORKFLOW_TASK_COMPLETED", ""),
    (31.0, "ACTIVITY_TASK_SCHEDULED", "floor_noop"),
]


def test_the_floors_hops_are_the_handovers_middle_hops_in_its_own_history() -> None:
    floor = [Event(at / 1000, kind, activity) for at, kind, activity in FLOOR]
    # its task 3, dispatch 2, the activity 4, dispatch back 1.5, the result's task 3.5
    assert floor_segments(floor) == [pytest.approx([3.0, 2.0, 4.0, 1.5, 3.5])]
