"""Switch-cost-aware admission (Rules 4) through the scheduling core's one
door (GroupCore.handle): each switch's measured checkpoint and restore
seconds are learned per job and node; a backfill job is granted only a
predicted gap longer than its switches there and back, and looked at again
when the prediction runs out; a backfill holder is asked to yield one switch
ahead of the regular job's predicted request; fair share's anticipation
lasts no longer than a switch. Older rules, and ``switch_cost_aware=False``,
grant as before."""

from __future__ import annotations

import pytest

from timeshare.models import GroupPolicy, HeartbeatOutput
from timeshare.scheduling import commands as cmd
from timeshare.scheduling import events as ev
from timeshare.scheduling import switch_costs
from timeshare.scheduling.group_core import GroupCore
from timeshare.scheduling.rules import RULES_ANTICIPATION, RULES_OVERDUE_ASKS, RULES_SWITCH_COSTS
from timeshare.scheduling.state import GroupState, StoredPolicy, StoredSwitch

NODE = "n1"
CHECKPOINT, RESTORE = 3.0, 1.0
# The backfill job's way in and the regular job's way back.
ROUND_TRIP = 2 * (CHECKPOINT + RESTORE)
# The regular job asks again this long after it yields (measured below).
ASK_GAP = 10.0
# When the fixture's regular job last yielded, and is expected to ask next.
YIELDED_AT = 12.0
EXPECTED_ASK = YIELDED_AT + ASK_GAP


def group_of(
    jobs: dict[str, bool], rules: int = RULES_SWITCH_COSTS, policy: GroupPolicy | None = None
) -> GroupCore:
    """The jobs (name: backfill or not) joined on one node."""
    policy = policy or GroupPolicy(prefetch="off")
    group = GroupCore(GroupState(group="g", policy=StoredPolicy.stored(policy), rules=rules))
    for job, backfill in jobs.items():
        group.handle(ev.Join(job, [NODE], f"hash-{job}", backfill=backfill), 0.0)
    return group


def ask(group: GroupCore, job: str, now: float) -> None:
    group.handle(ev.Acquire(job, f"hash-{job}", f"{job}-{now}"), now)


def give_back(group: GroupCore, job: str, now: float) -> None:
    turn = group.state.turn
    assert turn is not None and turn.job == job
    group.handle(ev.Yield(job, f"hash-{job}", turn.epoch), now)


def settle(
    group: GroupCore, now: float, checkpoint: float = CHECKPOINT, restore: float = RESTORE
) -> list[cmd.Command]:
    """Look at the group, and let every switch it starts go through, each
    node reporting what its checkpoints and restore took; the last look's commands."""
    for _ in range(10):
        commands = group.handle(ev.Tick(), now)
        plans = [c.plan for c in commands if isinstance(c, cmd.AttemptSwitch)]
        if not plans:
            return commands
        records = [
            StoredSwitch(node=m.node, epoch=plans[0].epoch, started_at=now, finished_at=now,
                         evicted=m.evict, admitted=m.admit,
                         checkpoint_seconds=dict.fromkeys(m.evict, checkpoint),
                         restore_seconds=restore if m.admit else 0.0)
            for m in plans[0].moves
        ]  # fmt: skip
        done = [ev.NodeSwitched(m.node) for m in plans[0].moves]
        group.handle(ev.SwitchAttempted(done=done, failed=[], records=records), now)
    raise AssertionError("the group keeps switching")


def holder(group: GroupCore) -> str:
    turn = group.state.turn
    return turn.job if turn is not None else ""


def wake_at(commands: list[cmd.Command]) -> float | None:
    (wake,) = [c for c in commands if isinstance(c, cmd.Wake)]
    return wake.at


def should_yield(group: GroupCore, job: str, now: float) -> bool:
    (answer,) = [c for c in group.handle(ev.Heartbeat(job, f"hash-{job}"), now)
                 if isinstance(c, cmd.Reply)]  # fmt: skip
    assert isinstance(answer.value, HeartbeatOutput)
    return answer.value.should_yield


def measured(rules: int = RULES_SWITCH_COSTS, policy: GroupPolicy | None = None) -> GroupCore:
    """A regular job "a" and a backfill job "bf" that have each been
    checkpointed and restored once (CHECKPOINT, RESTORE); "a" asked again
    ASK_GAP after its last turn, and has just yielded again (YIELDED_AT)."""
    group = group_of({"a": False, "bf": True}, rules, policy)
    ask(group, "a", 0.0)
    settle(group, 0.0)
    give_back(group, "a", 1.0)
    # Nothing predicts a's next request yet: the first backfill turn is granted.
    ask(group, "bf", 1.0)
    settle(group, 1.0)
    assert holder(group) == "bf"
    ask(group, "a", 1.0 + ASK_GAP)
    give_back(group, "bf", 1.0 + ASK_GAP)
    settle(group, 1.0 + ASK_GAP)
    assert holder(group) == "a"
    give_back(group, "a", YIELDED_AT)
    return group


def backfill_asks(
    gap: float, rules: int = RULES_SWITCH_COSTS, policy: GroupPolicy | None = None
) -> tuple[GroupCore, list[cmd.Command]]:
    """The measured group, where "bf" asks ``gap`` before "a" is expected to,
    and the group looks at it then; the look's commands."""
    group = measured(rules, policy)
    ask(group, "bf", EXPECTED_ASK - gap)
    return group, settle(group, EXPECTED_ASK - gap)


def test_each_jobs_checkpoint_and_restore_seconds_are_learned_per_node() -> None:
    group = measured()
    a, bf = group.state.jobs["a"], group.state.jobs["bf"]
    assert (a.checkpoint_seconds, a.restore_seconds) == ({NODE: CHECKPOINT}, {NODE: RESTORE})
    assert (bf.checkpoint_seconds, bf.restore_seconds) == ({NODE: CHECKPOINT}, {NODE: RESTORE})
    ask(group, "bf", YIELDED_AT)
    # A slower checkpoint moves the estimate half-way; a restore that brought
    # nothing back (under a millisecond) says nothing.
    settle(group, YIELDED_AT, checkpoint=CHECKPOINT + 2.0, restore=0.0005)
    assert group.state.jobs["a"].checkpoint_seconds == {NODE: CHECKPOINT + 1.0}
    assert group.state.jobs["bf"].restore_seconds == {NODE: RESTORE}
    record = group.state.recent_switches[-1]
    assert record.as_record().checkpoint_seconds == {"a": CHECKPOINT + 2.0}


def test_a_backfill_waiter_is_not_granted_a_gap_shorter_than_its_round_trip() -> None:
    group, commands = backfill_asks(ROUND_TRIP - 1.0)
    assert holder(group) == "" and [w.job for w in group.state.queue] == ["bf"]
    # Looked at again when the prediction runs out: not stranded.
    assert wake_at(commands) == pytest.approx(EXPECTED_ASK)
    settle(group, EXPECTED_ASK - 0.1)
    assert holder(group) == ""
    settle(group, EXPECTED_ASK)
    assert holder(group) == "bf"


def test_a_backfill_waiter_is_granted_a_gap_longer_than_its_round_trip() -> None:
    group, _ = backfill_asks(ROUND_TRIP + 0.5)
    assert holder(group) == "bf"


def test_a_regular_job_asking_when_predicted_finds_its_state_where_it_left_it() -> None:
    group, _ = backfill_asks(1.0)
    ask(group, "a", EXPECTED_ASK - 0.5)
    settle(group, EXPECTED_ASK - 0.5)
    turn = group.state.turn
    assert turn is not None and turn.job == "a" and turn.switch_seconds == 0.0


@pytest.mark.parametrize(
    ("rules", "policy"),
    [
        (RULES_ANTICIPATION, GroupPolicy(prefetch="off")),
        (RULES_SWITCH_COSTS, GroupPolicy(prefetch="off", switch_cost_aware=False)),
    ],
    ids=["rules-3", "switch-cost-aware-off"],
)
def test_without_weighing_costs_a_backfill_waiter_is_granted_as_before(
    rules: int, policy: GroupPolicy
) -> None:
    group, _ = backfill_asks(1.0, rules, policy)
    assert holder(group) == "bf"
    assert not should_yield(group, "bf", EXPECTED_ASK - 0.1)


@pytest.mark.parametrize(
    ("switch_cost_seconds", "gap", "granted"),
    [(1.0, 2.5, True), (5.0, ROUND_TRIP + 1.0, False)],
    ids=["cheaper-than-measured", "dearer-than-measured"],
)
def test_the_operators_switch_cost_is_used_instead_of_the_measured_one(
    switch_cost_seconds: float, gap: float, granted: bool
) -> None:
    """Two switches of the operator's figure each: 2 s, shorter than the
    measured round trip; 10 s, longer."""
    policy = GroupPolicy(prefetch="off", switch_cost_seconds=switch_cost_seconds)
    group, _ = backfill_asks(gap, policy=policy)
    assert (holder(group) == "bf") is granted


def test_a_backfill_holder_is_asked_to_yield_one_switch_ahead_of_the_regular_request() -> None:
    group, commands = backfill_asks(ROUND_TRIP + 0.5)
    assert holder(group) == "bf"
    # Its checkpoint and a's restore: 4 s ahead of a's predicted request.
    ahead = EXPECTED_ASK - (CHECKPOINT + RESTORE)
    assert wake_at(commands) == pytest.approx(ahead)
    assert not should_yield(group, "bf", ahead - 0.1)
    # Published until then, for the holder's watch to ask it at that moment itself.
    turn = group.state.turn
    assert turn is not None
    epoch, due = group.summary(ahead - 0.2).backfill_yield_due
    assert epoch == turn.epoch and due == pytest.approx(ahead)
    assert should_yield(group, "bf", ahead)
    assert group.summary(ahead).backfill_yield_due == (0, 0.0)


# How long the backfill job below holds on once asked to yield.
LAG = 1.5


def slow_to_yield() -> tuple[GroupCore, float]:
    """The measured group, where "bf" gave its turn back LAG after it was
    asked to, and "a" then had a turn; when "a" is next expected to ask."""
    group, _ = backfill_asks(ROUND_TRIP + 0.5)
    ahead = EXPECTED_ASK - (CHECKPOINT + RESTORE)
    give_back(group, "bf", ahead + LAG)
    assert group.state.jobs["bf"].yield_lag_seconds == LAG
    ask(group, "a", EXPECTED_ASK)
    settle(group, EXPECTED_ASK)
    give_back(group, "a", EXPECTED_ASK + 1.0)
    return group, EXPECTED_ASK + 1.0 + ASK_GAP


@pytest.mark.parametrize(("gap", "granted"), [(ROUND_TRIP + LAG - 0.5, False),
                                             (ROUND_TRIP + LAG + 0.5, True)])  # fmt: skip
def test_a_backfill_job_slow_to_yield_is_granted_only_a_gap_worth_its_lag_too(
    gap: float, granted: bool
) -> None:
    group, next_ask = slow_to_yield()
    ask(group, "bf", next_ask - gap)
    settle(group, next_ask - gap)
    assert (holder(group) == "bf") is granted


def test_a_backfill_job_slow_to_yield_is_asked_that_much_earlier() -> None:
    group, next_ask = slow_to_yield()
    ask(group, "bf", next_ask - ROUND_TRIP - LAG - 0.5)
    commands = settle(group, next_ask - ROUND_TRIP - LAG - 0.5)
    assert holder(group) == "bf"
    assert wake_at(commands) == pytest.approx(next_ask - (CHECKPOINT + RESTORE) - LAG)


@pytest.mark.parametrize("asks_again", [True, False], ids=["asking-again", "not-asking"])
def test_prefetch_brings_the_regular_job_back_past_the_backfill_job(asks_again: bool) -> None:
    """Once the backfill job yields one switch ahead, whether it asks again
    (held back: its gap is shorter than its way back) or not (it would ask
    again before the regular job)."""
    group, _ = backfill_asks(ROUND_TRIP + 0.5, policy=GroupPolicy(prefetch="auto"))
    ahead = EXPECTED_ASK - (CHECKPOINT + RESTORE)
    give_back(group, "bf", ahead)
    if asks_again:
        ask(group, "bf", ahead)
    commands = group.handle(ev.Tick(), ahead)
    plans = [c.plan for c in commands if isinstance(c, cmd.AttemptSwitch)]
    assert [(p.prefetch, p.waiter.job) for p in plans] == [(True, "a")]


def test_a_backfill_job_is_not_brought_in_ahead_into_a_gap_shorter_than_its_round_trip() -> None:
    group = measured(policy=GroupPolicy(prefetch="auto"))
    # bf is expected to ask again before a, too close to a's request to be worth it.
    now = EXPECTED_ASK - ROUND_TRIP + 1.0
    bf = group.state.jobs["bf"]
    bf.yielded_at, bf.ask_gaps[""] = YIELDED_AT, now + 0.5 - YIELDED_AT
    commands = group.handle(ev.Tick(), now)
    assert not [c for c in commands if isinstance(c, cmd.AttemptSwitch)]


def anticipated_for(policy: GroupPolicy, checkpoint: float, restore: float) -> float:
    """How long fair share holds the turn open for "short", which yields
    behind its share while "long" waits, having asked again 4 ms after its
    last turn (see test_anticipation.py)."""
    group = group_of({"long": False, "short": False}, RULES_SWITCH_COSTS, policy)
    ask(group, "long", 0.0)
    settle(group, 0.0, checkpoint, restore)
    ask(group, "short", 0.001)
    for job, yields_at in [("long", 0.4), ("short", 0.47), ("long", 0.87)]:
        assert holder(group) == job
        give_back(group, job, yields_at)
        settle(group, yields_at, checkpoint, restore)
        ask(group, job, yields_at + 0.004)
    give_back(group, "short", 0.94)
    held = group.state.anticipation
    assert held is not None and held.job == "short"
    return held.until - 0.94


def test_anticipation_lasts_no_longer_than_a_measured_or_set_switch() -> None:
    unweighed = GroupPolicy(prefetch="off", switch_cost_aware=False)
    assert anticipated_for(unweighed, 0.001, 0.001) == pytest.approx(2 * 0.004 + 0.005)
    weighed = GroupPolicy(prefetch="off")
    assert anticipated_for(weighed, 0.001, 0.001) == pytest.approx(0.002)
    set_switch = GroupPolicy(prefetch="off", switch_cost_seconds=0.003)
    assert anticipated_for(set_switch, 0.001, 0.001) == pytest.approx(0.003)


@pytest.mark.parametrize(("rules", "held"), [(RULES_SWITCH_COSTS, False),
                                             (RULES_OVERDUE_ASKS, True)])  # fmt: skip
def test_a_regular_request_a_little_late_still_holds_a_backfill_waiter_back(
    rules: int, held: bool
) -> None:
    """Rules 5: "a" is due at EXPECTED_ASK and has not asked yet; a backfill
    turn granted now would be cut short as soon as it asks."""
    group = measured(rules)
    late = EXPECTED_ASK + 0.1
    ask(group, "bf", late)
    commands = settle(group, late)
    assert (holder(group) == "bf") is not held
    if held:
        slack = ASK_GAP * switch_costs.OVERDUE_SHARE
        assert wake_at(commands) == pytest.approx(EXPECTED_ASK + slack)
        settle(group, EXPECTED_ASK + slack)
        assert holder(group) == "bf"  # no request came: the gap is the backfill job's
