"""The group's durable state: its own schema, decoupled from the public models,
and a failure inside a message handler that rejects that message alone and
leaves the state as it was, instead of wedging the group's workflow.

Here the tests that start no process; the others are in
tests/integration/test_group_state.py."""

from __future__ import annotations

import pytest
from pydantic import BaseModel, ValidationError

from timeshare.history import SwitchRecord, TurnRecord
from timeshare.models import FailureKind, Grant, GroupPolicy, NodeMove
from timeshare.scheduling import commands as cmd
from timeshare.scheduling import events as ev
from timeshare.scheduling.base import QueueError
from timeshare.scheduling.draft import draft
from timeshare.scheduling.group_core import GroupCore
from timeshare.scheduling.rules import NEWEST
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
    purpose (stored, or derived from what is): until then the two differ and
    crossing between them fails."""
    derived: frozenset[str] = getattr(stored, "DERIVED", frozenset())
    assert set(stored.model_fields) | derived == set(public.model_fields)
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


def _holding_core() -> tuple[GroupCore, int]:
    """Jobs a and b on one node; a holds the turn, b waits for it."""
    core = GroupCore(GroupState(group="g", rules=NEWEST))
    for job in ("a", "b"):
        core.handle(ev.Join(job=job, nodes=["n"], token_hash=f"h-{job}"), 0.0)
    core.handle(ev.Acquire(job="a", token_hash="h-a", request_id="r1"), 1.0)
    for command in core.handle(ev.Tick(), 1.0):
        if isinstance(command, cmd.AttemptSwitch):
            core.handle(ev.SwitchAttempted(done=[ev.NodeSwitched(node="n")], failed=[]), 1.5)
    core.handle(ev.Acquire(job="b", token_hash="h-b", request_id="r2"), 2.0)
    assert core.state.turn is not None
    return core, core.state.turn.epoch


def _refused_part_way(epoch: int) -> list[ev.Event]:
    return [
        # The turn is given back, then the request that asks again is refused.
        ev.Acquire(job="a", token_hash="h-a", request_id="", yield_epoch=epoch),
        # Job a is evicted as lost, then the switch outcome is refused: none is under way.
        ev.SwitchAttempted(
            done=[],
            failed=[ev.NodeFailed(node="n", cause="x", kind=FailureKind.JOB_FAILED, job="a")],
        ),
    ]


@pytest.mark.parametrize("which", [0, 1])
def test_an_event_refused_part_way_leaves_the_state_exactly_as_it_was(which: int) -> None:
    core, epoch = _holding_core()
    before = core.state.model_dump()
    with pytest.raises(QueueError):
        core.handle(_refused_part_way(epoch)[which], 3.0)
    assert core.state.model_dump() == before
    # Nothing of the refused event lingers: the group goes on as if it never
    # came, and job a's release, commanded by nobody yet, is commanded when it leaves.
    core.handle(ev.Yield(job="a", token_hash="h-a", epoch=epoch), 4.0)
    assert core.state.yielded == {"a": epoch}
    core.handle(ev.Leave(job="a", token_hash="h-a"), 5.0)
    commands = core.handle(ev.Tick(), 5.0)  # the switch to b
    commands += core.handle(ev.SwitchAttempted(done=[ev.NodeSwitched(node="n")], failed=[]), 5.5)
    releases = [c for c in commands if isinstance(c, cmd.StartReleases)]
    assert releases == [cmd.StartReleases((cmd.Release("a", "n", 1),))]  # a joined first


def test_a_handler_that_fails_leaves_the_state_exactly_as_it_was() -> None:
    core, epoch = _holding_core()
    yield_turn = core._handlers[ev.Yield]

    def yield_with_a_bug(event: ev.Yield, now: float) -> list[cmd.Command]:
        yield_turn(event, now)
        raise KeyError("a bug in the scheduler, after the yield was recorded")

    core._handlers[ev.Yield] = yield_with_a_bug
    before = core.state.model_dump()
    with pytest.raises(KeyError):
        core.handle(ev.Yield(job="a", token_hash="h-a", epoch=epoch), 3.0)
    assert core.state.model_dump() == before


def test_a_draft_changes_nothing_of_the_state_it_copies() -> None:
    state = _holding_core()[0].state
    before = state.model_dump()
    copy = draft(state)
    assert copy.model_dump() == before
    for name in GroupState.model_fields:
        value = getattr(state, name)
        if isinstance(value, list | dict | BaseModel) and name != "policy":
            assert getattr(copy, name) is not value, name
    assert copy.jobs["a"] is not state.jobs["a"] and copy.queue[0] is not state.queue[0]
    copy.recent_turns[-1].released_at = 9.0
    copy.recent_turns.append(copy.recent_turns[-1].model_copy())
    copy.recent_switches.append(StoredSwitch(node="n", epoch=9, started_at=3.0, finished_at=3.1))
    copy.jobs["a"].turns = 99
    copy.queue.clear()
    assert state.model_dump() == before


def test_a_grant_carries_the_epoch_its_job_is_told() -> None:
    turn = StoredGrant(job="a", request_id="r", epoch=7, ticket=1, granted_at=0.0,
                       waited_seconds=0.0, switch_seconds=0.0)  # fmt: skip
    assert turn.as_grant().told_epoch == 7
    resumed = turn.model_copy(update={"resumes_epoch": 3})
    assert resumed.as_grant().told_epoch == 3 == resumed.told_epoch
