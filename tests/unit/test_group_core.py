"""The scheduling core as the group workflow drives it: events in, commands
out, with no Temporal. What follows a switch attempt (grant, retry after a
pause, evict, give up), continue-as-new and prefetch are the core's
decisions, checked here command by command."""

from __future__ import annotations

import pytest

from timeshare.models import AcquireResult, GroupPolicy, JoinOutput
from timeshare.refusals import Refusal
from timeshare.scheduling import commands as cmd
from timeshare.scheduling import events as ev
from timeshare.scheduling.base import QueueError
from timeshare.scheduling.group_core import (
    EVICT_FAILED_JOBS,
    EVICT_FAILING_HOOKS,
    PREFETCH,
    SWITCH_PLAN_ATTEMPTS,
    WHOLE_JOBS,
    GroupCore,
)
from timeshare.scheduling.prefetch import PREFETCH_GUESS
from timeshare.scheduling.rules import RULES_ANTICIPATION
from timeshare.scheduling.state import GroupState, StoredPolicy

NODE = "n1"


def core(policy: GroupPolicy | None = None, jobs: tuple[str, ...] = ("a", "b")) -> GroupCore:
    state = GroupState(
        group="g", policy=StoredPolicy.stored(policy or GroupPolicy()), rules=RULES_ANTICIPATION
    )
    group = GroupCore(state)
    for job in jobs:
        replies = group.handle(ev.Join(job, [NODE], f"hash-{job}"), 0.0)
        assert isinstance(replies[0], cmd.Reply) and isinstance(replies[0].value, JoinOutput)
    return group


def reply(commands: list[cmd.Command]) -> object:
    (answer,) = [c for c in commands if isinstance(c, cmd.Reply)]
    return answer.value


def ask(group: GroupCore, job: str, request: str, now: float) -> AcquireResult:
    result = reply(group.handle(ev.Acquire(job, f"hash-{job}", request), now))
    assert isinstance(result, AcquireResult)
    return result


def attempt_of(commands: list[cmd.Command]) -> cmd.AttemptSwitch:
    (attempt,) = [c for c in commands if isinstance(c, cmd.AttemptSwitch)]
    return attempt


def went_through() -> ev.SwitchAttempted:
    return ev.SwitchAttempted(done=[ev.NodeSwitched(NODE)], failed=[])


def b_waits_behind_a(policy: GroupPolicy | None = None) -> GroupCore:
    group = core(policy)
    assert ask(group, "a", "a-1", 0.0).grant is None
    attempt_of(group.handle(ev.Tick(), 0.0))
    assert group.handle(went_through(), 0.1) == [cmd.SwitchOver()]
    assert group.state.turn is not None and group.state.turn.job == "a"
    ask(group, "b", "b-1", 0.2)
    reply(group.handle(ev.Yield("a", "hash-a", group.state.turn.epoch), 1.0))
    return group


def test_a_waiter_is_switched_in_and_granted_when_every_node_reported() -> None:
    group = b_waits_behind_a()
    commands = group.handle(ev.Tick(), 1.0)
    assert commands[0] == cmd.RuleUsed(WHOLE_JOBS)
    plan = attempt_of(commands).plan
    assert [(m.node, m.admit, m.evict) for m in plan.moves] == [(NODE, "b", ["a"])]
    assert group.answer("b", "b-1") is None  # still waiting for the nodes
    assert group.handle(went_through(), 1.2) == [cmd.SwitchOver()]
    grant = group.answer("b", "b-1")
    assert grant is not None and grant.job == "b"


def test_a_checkpoint_that_fails_pauses_then_retries_then_sets_the_plan_aside() -> None:
    group = b_waits_behind_a()
    plan = attempt_of(group.handle(ev.Tick(), 1.0)).plan
    failed = ev.NodeFailed(NODE, "checkpoint failed: CUDA_ERROR_UNKNOWN", "checkpoint", "a")
    now = 2.0
    for attempt in range(1, SWITCH_PLAN_ATTEMPTS + 1):
        commands = group.handle(ev.SwitchAttempted(done=[], failed=[failed]), now)
        pause = commands[-1]
        assert isinstance(pause, cmd.PauseSwitch) and pause.seconds == min(30.0, 2.0**attempt)
        assert any(isinstance(c, cmd.Log) and c.warning for c in commands)
        now += pause.seconds
        after = group.handle(ev.SwitchPaused(), now)
        if attempt < SWITCH_PLAN_ATTEMPTS:
            assert after == [cmd.AttemptSwitch(plan)]
    # Failing for long: the plan is set aside, the waiter kept, planned afresh.
    assert after == [cmd.SwitchOver()] and group.plan() is None
    assert group.is_waiting("b", "b-1") and group.switch_due()
    assert "switch failing:" in group.status(now).degraded_cause


def test_a_switch_failing_past_the_give_up_time_evicts_the_stuck_job_then_answers() -> None:
    group = b_waits_behind_a(GroupPolicy(switch_give_up_seconds=5))
    attempt_of(group.handle(ev.Tick(), 1.0))
    failed = ev.NodeFailed(NODE, "checkpoint failed: CUDA_ERROR_UNKNOWN", "checkpoint", "a")
    assert isinstance(group.handle(ev.SwitchAttempted([], [failed]), 1.0)[-1], cmd.PauseSwitch)
    commands = group.handle(ev.SwitchAttempted([], [failed]), 6.5)
    # a's state could not leave for 5 s: a is evicted, released, and the
    # switch tried again at once.
    assert commands[-2:] == [cmd.StartReleases(), attempt_of(commands)]
    assert "a" not in group.state.jobs and group.releases() == [("a", NODE)]
    commands = group.handle(ev.SwitchAttempted([], [failed]), 7.0)
    assert commands[-2:] == [cmd.StartReleases(), cmd.SwitchOver()]
    with pytest.raises(QueueError) as refused:
        group.answer("b", "b-1")
    assert refused.value.code == Refusal.ABORTED
    assert refused.value.details is not None and refused.value.details["job"] == "a"


def test_jobs_lost_for_good_or_whose_hooks_fail_are_evicted_and_released() -> None:
    group = core(jobs=("a", "b", "c"))
    ask(group, "a", "a-1", 0.0)
    attempt_of(group.handle(ev.Tick(), 0.0))
    lost = ev.NodeFailed(NODE, "CUDA state FAILED", "job-failed", "b")
    hooks = ev.NodeFailed(NODE, "the engine will not sleep", "hook", "c")
    commands = group.handle(ev.SwitchAttempted(done=[], failed=[lost, hooks]), 1.0)
    rules = [c.rule for c in commands if isinstance(c, cmd.RuleUsed)]
    assert rules == [EVICT_FAILED_JOBS, EVICT_FAILING_HOOKS]
    assert commands.count(cmd.StartReleases()) == 2
    assert set(group.state.jobs) == {"a"}
    assert "its workload hooks failed" in group.evicted_reason("c")
    assert group.evicted_reason("b") == "CUDA state FAILED"
    group.handle(ev.ReleaseEnded("b", NODE), 2.0)
    assert group.releases() == [("c", NODE)]


def test_a_job_whose_processes_are_gone_is_evicted_when_the_switch_goes_through() -> None:
    group = b_waits_behind_a()
    attempt_of(group.handle(ev.Tick(), 1.0))
    done = ev.SwitchAttempted(done=[ev.NodeSwitched(NODE, gone=["a"])], failed=[])
    assert group.handle(done, 1.1) == [cmd.SwitchOver()]
    assert "have exited" in group.evicted_reason("a")


def test_continue_as_new_when_suggested_but_never_in_the_middle_of_a_switch() -> None:
    group = b_waits_behind_a()
    attempt_of(group.handle(ev.Tick(continue_as_new_suggested=False), 1.0))
    assert not group.continue_as_new_due(True)  # a switch is under way
    group.handle(went_through(), 1.1)
    assert group.handle(ev.Tick(continue_as_new_suggested=True), 2.0) == [cmd.ContinueAsNew()]
    every = core(GroupPolicy(continue_as_new_every=1))
    ask(every, "a", "a-1", 0.0)
    attempt_of(every.handle(ev.Tick(), 0.0))
    every.handle(went_through(), 0.1)
    assert every.handle(ev.Tick(), 0.2) == [cmd.ContinueAsNew()]


def test_an_idle_group_brings_back_the_job_away_longest_and_names_the_rules() -> None:
    group = b_waits_behind_a()
    attempt_of(group.handle(ev.Tick(), 1.0))
    group.handle(went_through(), 1.1)
    turn = group.state.turn
    assert turn is not None
    reply(group.handle(ev.Yield("b", "hash-b", turn.epoch), 2.0))
    commands = group.handle(ev.Tick(), 2.1)
    assert [c.rule for c in commands if isinstance(c, cmd.RuleUsed)] == [
        PREFETCH_GUESS, PREFETCH, WHOLE_JOBS]  # fmt: skip
    plan = attempt_of(commands).plan
    assert plan.prefetch and plan.waiter.job == "a"


def test_a_message_the_group_refuses_is_refused_before_it_is_handled() -> None:
    group = core()
    with pytest.raises(QueueError) as refused:
        group.check(ev.Acquire("a", "hash-b", "a-1"))
    assert refused.value.code == Refusal.PERMISSION_DENIED
    with pytest.raises(QueueError) as refused:
        group.check(ev.Acquire("a", "hash-a", "a-1", phase="\x00"))
    assert refused.value.code == Refusal.INVALID_ARGUMENT
    group.check(ev.Leave("gone", "anything"))  # leaving twice is fine
