"""The state a run began with, read from its start event: where the
scheduler's code cannot replay even the run's first workflow task."""

from __future__ import annotations

import json
from collections.abc import Sequence

from temporalio.api.enums.v1 import EventType
from temporalio.api.history.v1 import HistoryEvent
from temporalio.converter import PayloadConverter

from timeshare.models import GroupPolicy
from timeshare.scheduling import healing
from timeshare.scheduling.base import Group
from timeshare.scheduling.state import GroupState, StoredPolicy
from timeshare.workflows.group import GroupInput, rules_created_with

# The marker Temporal's SDKs record for a patch, and where its id is.
PATCH_MARKER = "core_patch"


def start_input(events: Sequence[HistoryEvent], converter: PayloadConverter) -> GroupInput:
    started = events[0].workflow_execution_started_event_attributes
    value: GroupInput = converter.from_payloads(list(started.input.payloads), [GroupInput])[0]
    return value


def start_state(events: Sequence[HistoryEvent], converter: PayloadConverter) -> GroupState:
    """The group's state as its run's first workflow task found it: carried
    by the run's input (continued as new, or healed: the heal applied), or a
    new group's, with the rules its first task chose (its patch markers)."""
    given = start_input(events, converter)
    if given.state is None:
        markers = patch_markers(events)
        return GroupState(
            group=given.group,
            policy=StoredPolicy.stored(given.policy or GroupPolicy()),
            rules=rules_created_with(lambda patch: patch in markers),
        )
    state = given.state.model_copy(deep=True)
    if given.heal is not None:
        started_at = events[0].event_time.ToDatetime().timestamp()
        healing.heal(Group.of(state), given.heal, started_at)
    return state


def patch_markers(events: Sequence[HistoryEvent]) -> set[str]:
    found = set()
    for event in events:
        if event.event_type != EventType.EVENT_TYPE_MARKER_RECORDED:
            continue
        marker = event.marker_recorded_event_attributes
        if marker.marker_name != PATCH_MARKER:
            continue
        for payloads in marker.details.values():
            for payload in payloads.payloads:
                found.add(str(json.loads(payload.data).get("id", "")))
    return found
