"""The backfill totals the group keeps for its metrics: backfill GPU time,
backfill preemptions, and regular jobs' wait while a backfill job held the
turn; shown in the group's summary, where the workflow's gauges read them."""

from __future__ import annotations

import pytest

from tests.unit.test_backfill import (
    GRACE,
    NODE,
    ask,
    backfill_holds_then_regular_asks,
    group_with,
    holder,
    settle,
)
from timeshare.scheduling import events as ev
from timeshare.scheduling.group_core import GroupCore
from timeshare.scheduling.state import StoredSwitch


def yield_turn(group: GroupCore, job: str, now: float) -> None:
    epoch = group.state.turn.epoch if group.state.turn else 0
    group.handle(ev.Yield(job, f"hash-{job}", epoch), now)
    settle(group, now)


def test_a_backfill_turn_given_back_in_time_counts_its_time_and_the_delay() -> None:
    group = group_with(("a",), ("bf",))
    ask(group, "bf", 1.0)
    settle(group, 1.0)
    ask(group, "a", 4.0)
    yield_turn(group, "bf", 6.0)
    assert holder(group) == "a"
    yield_turn(group, "a", 9.0)
    summary = group.summary(9.0)
    assert summary.backfill_busy_seconds == pytest.approx(5.0)
    assert summary.backfill_delay_seconds == pytest.approx(2.0)  # 4.0 to 6.0
    assert summary.backfill_preemptions == 0


def test_regular_turns_count_neither_as_backfill_time_nor_as_its_delay() -> None:
    group = group_with(("a", "b"), ("bf",))
    ask(group, "a", 1.0)
    settle(group, 1.0)
    ask(group, "b", 2.0)
    yield_turn(group, "a", 3.0)
    yield_turn(group, "b", 4.0)
    summary = group.summary(4.0)
    assert summary.backfill_busy_seconds == 0.0
    assert summary.backfill_delay_seconds == 0.0


def test_a_preempted_backfill_holder_is_counted_and_the_wait_ends_at_the_grace() -> None:
    group = group_with(("a",), ("bf",))
    ask(group, "bf", 1.0)
    settle(group, 1.0)
    ask(group, "a", 2.0)
    settle(group, 2.0 + GRACE)
    assert holder(group) == "a"
    summary = group.summary(2.0 + GRACE)
    assert summary.backfill_preemptions == 1
    assert group.state.preemptions == 1
    assert summary.backfill_delay_seconds == pytest.approx(GRACE)
    assert summary.backfill_busy_seconds == pytest.approx(1.0 + GRACE)


def test_an_evicted_backfill_holder_counts_as_preempted_and_its_turn_as_delay() -> None:
    group = backfill_holds_then_regular_asks()  # bf from 1.0, a asks at 2.0
    group.state.recent_switches.append(
        StoredSwitch(node=NODE, epoch=1, started_at=1.0, finished_at=1.0, backend="app")
    )
    settle(group, 2.0 + GRACE)
    assert "bf" not in group.state.jobs
    summary = group.summary(2.0 + GRACE)
    assert summary.backfill_preemptions == 1
    assert summary.backfill_delay_seconds == pytest.approx(GRACE)  # though bf has left
    assert summary.backfill_busy_seconds == pytest.approx(1.0 + GRACE)
