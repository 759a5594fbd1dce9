"""bench.parts.handover_segments cuts a hand-over at the right events."""

from __future__ import annotations

import pytest

from bench.parts.handover_segments import (
    SEGMENTS,
    Event,
    IncompleteHandover,
    all_segments,
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
