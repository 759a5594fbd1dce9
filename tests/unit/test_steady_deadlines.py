"""Rules 6, on the two corners the group's property machine found in
Rules 4 and 5 (tests/unit/test_group_machine.py exempts them there): a
holder's turn limit that starts counting when a backfill waiter held back by
switch costs may go is looked at then, a turn held or not; and a backfill
job that joins again as a regular one starts level in fair share."""

from __future__ import annotations

import pytest

from tests.unit.test_switch_costs import (
    ASK_GAP,
    EXPECTED_ASK,
    YIELDED_AT,
    ask,
    give_back,
    group_of,
    holder,
    settle,
    wake_at,
)
from timeshare.models import GroupPolicy
from timeshare.scheduling import events as ev
from timeshare.scheduling import switch_costs
from timeshare.scheduling.group_core import GroupCore
from timeshare.scheduling.rules import RULES_OVERDUE_ASKS, RULES_STEADY_DEADLINES
from timeshare.scheduling.state import GroupState, StoredPolicy


@pytest.mark.parametrize("rules", [RULES_OVERDUE_ASKS, RULES_STEADY_DEADLINES])
def test_a_turn_limit_that_counts_from_a_held_back_waiters_release_is_looked_at_then(
    rules: int,
) -> None:
    """A regular job "a" expected back at EXPECTED_ASK; a backfill job "bf2"
    holds with a turn limit of 1 s; a backfill job "bf" asks just before
    "a" is expected, and is held back until that prediction runs out. From
    then bf waits, bf2 is past its limit, and is preempted a grace later:
    the group must look by then."""
    policy = GroupPolicy(prefetch="off", max_turn_seconds=1.0, preempt_grace_seconds=1.0)
    group = group_of({"a": False, "bf": True, "bf2": True}, rules, policy)
    ask(group, "a", 0.0)
    settle(group, 0.0)
    give_back(group, "a", 1.0)
    ask(group, "bf", 1.0)
    settle(group, 1.0)
    ask(group, "a", 1.0 + ASK_GAP)
    give_back(group, "bf", 1.0 + ASK_GAP)
    settle(group, 1.0 + ASK_GAP)
    give_back(group, "a", YIELDED_AT)
    ask(group, "bf2", YIELDED_AT)
    settle(group, YIELDED_AT)
    asked = EXPECTED_ASK - 0.5
    ask(group, "bf", asked)
    commands = settle(group, asked)
    released = switch_costs.held_back_until(group.state, "bf", asked)
    assert holder(group) == "bf2" and released is not None
    wake = wake_at(commands)
    assert wake is not None
    if rules >= RULES_STEADY_DEADLINES:
        assert wake <= released
    else:
        assert wake > released + 1.0  # the late look Rules 6 mends


@pytest.mark.parametrize("rules", [RULES_OVERDUE_ASKS, RULES_STEADY_DEADLINES])
def test_a_backfill_job_that_turns_regular_starts_level_in_fair_share(rules: int) -> None:
    state = GroupState(group="g", policy=StoredPolicy.stored(GroupPolicy()), rules=rules)
    group = GroupCore(state)
    group.handle(ev.Join("a", ["n1"], "hash-a"), 0.0)
    group.handle(ev.Join("bf", ["n1"], "hash-bf", backfill=True), 0.0)
    group.state.jobs["a"].share_seconds = 5.0  # a has had the GPU 5 s
    group.handle(ev.Join("bf", ["n1"], "hash-bf"), 1.0)
    share = group.state.jobs["bf"].share_seconds
    # Rules 6: level with a, so bf does not take the GPU 5 s ahead of it.
    assert share == (5.0 if rules >= RULES_STEADY_DEADLINES else 0.0)
