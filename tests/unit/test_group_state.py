"""The group's durable state: its own schema, decoupled from the public models,
and a failure inside a message handler that rejects that message alone and
leaves the state as it was, instead of wedging the group's workflow.

Here the tests that start no process; the others are in
tests/integration/test_group_state.py."""

from __future__ import annotations

import pytest
from pydantic import BaseModel, ValidationError

from timeshare.history import SwitchRecord, TurnRecord
from timeshare.models import Grant, GroupPolicy, NodeMove
from timeshare.scheduling.queue import LockQueue
from timeshare.scheduling.state import (
    LEGACY_DEFAULTS,
    SCHEMA_VERSION,
    GroupState,
    StoredGrant,
    StoredModel,
    StoredMove,
    StoredPolicy,
    StoredSwitch,
    StoredTurn,
)

TWINS: list[tuple[type[StoredModel], type[BaseModel]]] = [
    (StoredPolicy, GroupPolicy),
    (StoredGrant, Grant),
    (StoredMove, NodeMove),
    (StoredTurn, TurnRecord),
    (StoredSwitch, SwitchRecord),
]


@pytest.mark.parametrize(("stored", "public"), TWINS, ids=lambda kind: kind.__name__)
def test_each_durable_model_has_its_public_twins_fields(
    stored: type[StoredModel], public: type[BaseModel]
) -> None:
    """A field added to a public model alone must be added to the durable one on
    purpose: until then the two differ and crossing between them fails."""
    assert set(stored.model_fields) == set(public.model_fields)
    legacy = LEGACY_DEFAULTS if stored is StoredPolicy else set()
    for name, field in stored.model_fields.items():
        if name not in legacy:  # what a state from before the field meant, on purpose
            assert field.default == public.model_fields[name].default, name


def test_a_field_the_durable_schema_lacks_is_refused_not_dropped() -> None:
    class PolicyWithMore(GroupPolicy):
        new_knob: int = 3

    with pytest.raises(ValidationError, match="new_knob"):
        StoredPolicy.stored(PolicyWithMore())


def test_a_newer_schema_is_refused_with_what_to_do() -> None:
    with pytest.raises(ValidationError, match="upgrade the scheduler"):
        GroupState(group="g", schema_version=SCHEMA_VERSION + 1)


def test_a_snapshot_restores_every_kind_of_change() -> None:
    queue = LockQueue(GroupState(group="g"))
    for job in ("a", "b"):
        queue.join(job, ["n"], f"h-{job}", now=0.0)
    queue.request("a", "r1", now=1.0)
    queue.begin_switch(now=1.0)
    queue.finish_switch(now=1.5)
    before = queue.snapshot()
    expected = queue.state.model_dump()
    assert not queue.changed_since(before)
    queue.request("b", "r2", now=2.0)  # the queue grows
    queue.release("a", 1, now=3.0)  # the last turn record is closed in place
    queue.record_switches([StoredSwitch(node="n", epoch=9, started_at=3.0, finished_at=3.1)])
    queue.state.jobs["a"].turns = 99  # a nested change
    assert queue.changed_since(before)
    queue.restore(before)
    assert queue.state.model_dump() == expected
    assert not queue.changed_since(before)
