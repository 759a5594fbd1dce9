"""Backfill jobs through the scheduling core's one door (GroupCore.handle):
granted only while no regular job holds or waits, asked to yield at once
when a regular job asks, preempted (or, where only the job's own hooks
could move its state, evicted) after the group's backfill grace."""

from __future__ import annotations

import pytest

from timeshare.models import GroupPolicy, HeartbeatOutput, JoinOutput, KeepTurnOutput
from timeshare.refusals import Refusal
from timeshare.scheduling import commands as cmd
from timeshare.scheduling import events as ev
from timeshare.scheduling.base import QueueError
from timeshare.scheduling.group_core import GroupCore
from timeshare.scheduling.rules import RULES_ANTICIPATION, RULES_LEGACY
from timeshare.scheduling.state import GroupState, StoredPolicy, StoredSwitch
from timeshare.status import jobs_table, policy_line

NODE = "n1"
GRACE = 5.0


def group_with(
    regular: tuple[str, ...], backfill: tuple[str, ...], policy: GroupPolicy | None = None
) -> GroupCore:
    policy = policy or GroupPolicy(backfill_grace_seconds=GRACE)
    state = GroupState(group="g", policy=StoredPolicy.stored(policy), rules=RULES_ANTICIPATION)
    group = GroupCore(state)
    for job in regular + backfill:
        # Backfill jobs of a high priority: still below every regular job.
        joined = ev.Join(job, [NODE], f"hash-{job}", priority=10 * (job in backfill),
                         backfill=job in backfill)  # fmt: skip
        answer = reply(group.handle(joined, 0))
        assert isinstance(answer, JoinOutput)
    return group


def reply(commands: list[cmd.Command]) -> object:
    (answer,) = [c for c in commands if isinstance(c, cmd.Reply)]
    return answer.value


def ask(group: GroupCore, job: str, now: float) -> None:
    group.handle(ev.Acquire(job, f"hash-{job}", f"{job}-{now}"), now)


def settle(group: GroupCore, now: float) -> None:
    """Look at the group, and let every switch it starts go through."""
    for _ in range(10):
        commands = group.handle(ev.Tick(), now)
        if not any(isinstance(c, cmd.AttemptSwitch) for c in commands):
            return
        group.handle(ev.SwitchAttempted(done=[ev.NodeSwitched(NODE)], failed=[]), now)


def holder(group: GroupCore) -> str:
    turn = group.state.turn
    return turn.job if turn is not None else ""


def should_yield(group: GroupCore, job: str, now: float) -> bool:
    beat = reply(group.handle(ev.Heartbeat(job, f"hash-{job}"), now))
    assert isinstance(beat, HeartbeatOutput)
    return beat.should_yield


def backfill_holds_then_regular_asks() -> GroupCore:
    group = group_with(("a",), ("bf",))
    ask(group, "bf", 1.0)
    settle(group, 1.0)
    assert holder(group) == "bf"
    ask(group, "a", 2.0)
    settle(group, 2.0)
    return group


def test_a_backfill_job_waits_while_a_regular_job_holds_or_waits() -> None:
    group = group_with(("a", "b"), ("bf",))
    ask(group, "a", 1.0)
    settle(group, 1.0)
    ask(group, "bf", 2.0)
    ask(group, "b", 3.0)
    settle(group, 3.0)
    epoch = group.state.turn.epoch if group.state.turn else 0
    group.handle(ev.Yield("a", "hash-a", epoch), 4.0)
    settle(group, 4.0)
    # b asked after bf, yet goes first: a regular job waits.
    assert holder(group) == "b"
    epoch = group.state.turn.epoch if group.state.turn else 0
    group.handle(ev.Yield("b", "hash-b", epoch), 5.0)
    settle(group, 5.0)
    assert holder(group) == "bf"


def test_a_regular_request_asks_the_backfill_holder_to_yield_at_once() -> None:
    group = group_with(("a",), ("bf",))
    ask(group, "bf", 1.0)
    settle(group, 1.0)
    assert not should_yield(group, "bf", 1.5)
    ask(group, "a", 2.0)
    assert should_yield(group, "bf", 2.0)
    assert holder(group) == "bf"


def test_a_backfill_holder_that_yields_in_time_hands_over_without_preemption() -> None:
    group = backfill_holds_then_regular_asks()
    epoch = group.state.turn.epoch if group.state.turn else 0
    group.handle(ev.Yield("bf", "hash-bf", epoch), 3.0)
    settle(group, 3.0)
    assert holder(group) == "a"
    assert group.state.preemptions == 0


def test_a_backfill_holder_past_its_grace_is_preempted_and_the_regular_job_granted() -> None:
    group = backfill_holds_then_regular_asks()
    wake = group.handle(ev.Tick(), 2.5)[-1]
    assert isinstance(wake, cmd.Wake) and wake.at == pytest.approx(2.0 + GRACE)
    settle(group, 2.0 + GRACE - 0.1)
    assert holder(group) == "bf"
    settle(group, 2.0 + GRACE)
    assert holder(group) == "a"
    assert group.state.preemptions == 1
    assert group.state.jobs["bf"].preempted
    # It waits to resume, after the regular job.
    assert [w.job for w in group.state.queue] == ["bf"]


def test_a_backfill_holder_moved_only_by_its_hooks_is_evicted_with_the_reason() -> None:
    group = backfill_holds_then_regular_asks()
    group.state.recent_switches.append(
        StoredSwitch(node=NODE, epoch=1, started_at=1.0, finished_at=1.0, backend="app")
    )
    settle(group, 2.0 + GRACE)
    assert holder(group) == "a"
    assert "bf" not in group.state.jobs
    assert "did not yield within 5 s" in group.evicted_reason("bf")


def test_a_regular_holder_is_never_asked_to_yield_for_a_backfill_job() -> None:
    group = group_with(("a",), ("bf",))
    ask(group, "a", 1.0)
    settle(group, 1.0)
    ask(group, "bf", 2.0)
    settle(group, 20.0)
    assert holder(group) == "a"
    assert not should_yield(group, "a", 20.0)


def test_a_turn_limit_or_a_higher_priority_never_asks_a_regular_holder_to_yield_to_backfill() -> (
    None
):
    policy = GroupPolicy(max_turn_seconds=1.0, preempt_lower_after_seconds=1.0)
    group = group_with(("a",), ("bf",), policy)
    ask(group, "a", 1.0)
    settle(group, 1.0)
    ask(group, "bf", 2.0)
    settle(group, 20.0)
    assert holder(group) == "a" and group.state.preemptions == 0
    assert not should_yield(group, "a", 20.0)
    epoch = group.state.turn.epoch if group.state.turn else 0
    kept = reply(group.handle(ev.KeepTurn("a", "hash-a", epoch, "train"), 21.0))
    assert isinstance(kept, KeepTurnOutput) and not kept.asked_to_yield


def test_a_regular_job_asking_again_as_it_yields_goes_before_a_backfill_job() -> None:
    """The backfill job is already on its own node: it would need no switch."""
    group = group_with((), ())
    for job, node, backfill in (("a", "n1", False), ("bf", "n2", True)):
        group.handle(ev.Join(job, [node], f"hash-{job}", backfill=backfill), 0.0)
    ask(group, "bf", 1.0)
    settle(group, 1.0)
    epoch = group.state.turn.epoch if group.state.turn else 0
    group.handle(ev.Yield("bf", "hash-bf", epoch), 2.0)
    ask(group, "a", 3.0)
    settle(group, 3.0)
    assert holder(group) == "a"
    ask(group, "bf", 4.0)
    epoch = group.state.turn.epoch if group.state.turn else 0
    group.handle(ev.Acquire("a", "hash-a", "a-next", yield_epoch=epoch), 5.0)
    settle(group, 5.0)
    assert holder(group) == "a"
    assert [w.job for w in group.state.queue] == ["bf"]


def test_a_group_from_before_policies_refuses_a_backfill_job() -> None:
    group = GroupCore(GroupState(group="g", rules=RULES_LEGACY))
    with pytest.raises(QueueError) as refused:
        group.check(ev.Join("bf", [NODE], "hash-bf", backfill=True))
    assert refused.value.code == Refusal.FAILED_PRECONDITION


def test_the_group_status_names_its_backfill_jobs() -> None:
    group = group_with(("a",), ("bf",))
    jobs = {j.job: j.backfill for j in group.status(0.0).jobs}
    assert jobs == {"a": False, "bf": True}


def test_a_backfill_grace_out_of_range_is_refused() -> None:
    with pytest.raises(ValueError):
        GroupPolicy(backfill_grace_seconds=-1.0)


def test_timeshare_status_marks_backfill_jobs_and_shows_the_grace() -> None:
    status = group_with(("a",), ("bf",)).status(0.0)
    table = jobs_table(status)
    assert "bf (backfill)" in table and "a (backfill)" not in table
    assert f"backfill preempted {GRACE:g} s after a regular ask" in policy_line(status)
