"""The scheduling core as the group workflow drives it: events in, commands
out, with no Temporal. What follows a switch attempt (grant, retry after a
pause, evict, give up), continue-as-new and prefetch are the core's
decisions, checked here command by command."""

from __future__ import annotations

import ast
import dataclasses
import typing
from pathlib import Path

import pytest

from timeshare.models import AcquireResult, FailureKind, GroupPolicy, JoinOutput
from timeshare.refusals import Refusal
from timeshare.scheduling import commands as cmd
from timeshare.scheduling import events as ev
from timeshare.scheduling.base import QueueError
from timeshare.scheduling.group_core import SWITCH_PLAN_ATTEMPTS, GroupCore
from timeshare.scheduling.rules import RULES_ANTICIPATION
from timeshare.scheduling.state import GroupState, StoredPolicy
from timeshare.scheduling.versions import (
    EVICT_FAILED_JOBS,
    EVICT_FAILING_HOOKS,
    PREFETCH,
    PREFETCH_GUESS,
    RELEASE_PER_MEMBERSHIP,
    WHOLE_JOBS,
)

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


def wake_of(commands: list[cmd.Command]) -> cmd.Wake:
    wake = commands[-1]
    assert isinstance(wake, cmd.Wake)
    return wake


def settled(commands: list[cmd.Command]) -> bool:
    """The group's look at itself is over (no switch goes on): it ends by
    saying when to look again."""
    going_on = [c for c in commands if isinstance(c, cmd.AttemptSwitch | cmd.PauseSwitch)]
    return not going_on and isinstance(commands[-1], cmd.Wake)


def went_through() -> ev.SwitchAttempted:
    return ev.SwitchAttempted(done=[ev.NodeSwitched(NODE)], failed=[])


def b_waits_behind_a(policy: GroupPolicy | None = None) -> GroupCore:
    group = core(policy)
    assert ask(group, "a", "a-1", 0.0).grant is None
    attempt_of(group.handle(ev.Tick(), 0.0))
    assert settled(group.handle(went_through(), 0.1))
    assert group.state.turn is not None and group.state.turn.job == "a"
    ask(group, "b", "b-1", 0.2)
    reply(group.handle(ev.Yield("a", "hash-a", group.state.turn.epoch), 1.0))
    return group


def test_a_waiter_is_switched_in_and_granted_when_every_node_reported() -> None:
    group = b_waits_behind_a()
    commands = group.handle(ev.Tick(), 1.0)
    assert commands[0] == cmd.MarkPatch(WHOLE_JOBS)
    plan = attempt_of(commands).plan
    assert [(m.node, m.admit, m.evict) for m in plan.moves] == [(NODE, "b", ["a"])]
    assert group.answer("b", "b-1") is None  # still waiting for the nodes
    assert settled(group.handle(went_through(), 1.2))
    grant = group.answer("b", "b-1")
    assert grant is not None and grant.job == "b"


def test_a_checkpoint_that_fails_pauses_then_retries_then_sets_the_plan_aside() -> None:
    group = b_waits_behind_a()
    plan = attempt_of(group.handle(ev.Tick(), 1.0)).plan
    failed = ev.NodeFailed(
        NODE, "checkpoint failed: CUDA_ERROR_UNKNOWN", FailureKind.CHECKPOINT, "a"
    )
    now = 2.0
    for attempt in range(1, SWITCH_PLAN_ATTEMPTS + 1):
        commands = group.handle(ev.SwitchAttempted(done=[], failed=[failed]), now)
        pause = commands[-1]
        assert isinstance(pause, cmd.PauseSwitch) and pause.seconds == min(30.0, 2.0**attempt)
        assert any(isinstance(c, cmd.Log) and c.warning for c in commands)
        now += pause.seconds
        after = group.handle(ev.SwitchPaused(), now)
        if attempt < SWITCH_PLAN_ATTEMPTS:
            # The same plan, once more, counting its attempts.
            assert after == [cmd.AttemptSwitch(plan.model_copy(update={"attempts": attempt}))]
    # Failing for long: the plan is set aside, the waiter kept, planned afresh.
    assert settled(after) and group.plan() is None
    # Planned afresh at once: the group is told to look at itself again.
    assert group.is_waiting("b", "b-1") and wake_of(after).at_once
    assert "switch failing:" in group.status(now).degraded_cause


def test_a_switch_failing_past_the_give_up_time_evicts_the_stuck_job_then_answers() -> None:
    group = b_waits_behind_a(GroupPolicy(switch_give_up_seconds=5))
    attempt_of(group.handle(ev.Tick(), 1.0))
    failed = ev.NodeFailed(
        NODE, "checkpoint failed: CUDA_ERROR_UNKNOWN", FailureKind.CHECKPOINT, "a"
    )
    assert isinstance(group.handle(ev.SwitchAttempted([], [failed]), 1.0)[-1], cmd.PauseSwitch)
    commands = group.handle(ev.SwitchAttempted([], [failed]), 6.5)
    # a's state could not leave for 5 s: a is evicted, released, and the
    # switch tried again at once.
    assert commands[-2:] == [cmd.StartReleases((cmd.Release("a", NODE, 1),)), attempt_of(commands)]
    assert "a" not in group.state.jobs
    commands = group.handle(ev.SwitchAttempted([], [failed]), 7.0)
    # Given up; a's release was started already.
    assert settled(commands) and not any(isinstance(c, cmd.StartReleases) for c in commands)
    with pytest.raises(QueueError) as refused:
        group.answer("b", "b-1")
    assert refused.value.code == Refusal.ABORTED
    assert refused.value.details is not None and refused.value.details["job"] == "a"


def test_jobs_lost_for_good_or_whose_hooks_fail_are_evicted_and_released() -> None:
    group = core(jobs=("a", "b", "c"))
    ask(group, "a", "a-1", 0.0)
    attempt_of(group.handle(ev.Tick(), 0.0))
    lost = ev.NodeFailed(NODE, "CUDA state FAILED", FailureKind.JOB_FAILED, "b")
    hooks = ev.NodeFailed(NODE, "the engine will not sleep", FailureKind.HOOK, "c")
    commands = group.handle(ev.SwitchAttempted(done=[], failed=[lost, hooks]), 1.0)
    patches = [c.patch for c in commands if isinstance(c, cmd.MarkPatch)]
    assert patches == [EVICT_FAILED_JOBS, EVICT_FAILING_HOOKS]
    started = [c for c in commands if isinstance(c, cmd.StartReleases)]
    assert started == [
        cmd.StartReleases((cmd.Release("b", NODE, 2),)),
        cmd.StartReleases((cmd.Release("c", NODE, 3),)),
    ]
    assert set(group.state.jobs) == {"a"}
    assert "its workload hooks failed" in group.evicted_reason("c")
    assert group.evicted_reason("b") == "CUDA state FAILED"
    group.handle(ev.ReleaseEnded("b", NODE, 2), 2.0)
    assert group.state.releasing == {"c": [NODE]}


def test_a_job_whose_processes_are_gone_is_evicted_when_the_switch_goes_through() -> None:
    group = b_waits_behind_a()
    attempt_of(group.handle(ev.Tick(), 1.0))
    done = ev.SwitchAttempted(done=[ev.NodeSwitched(NODE, gone=["a"])], failed=[])
    assert settled(group.handle(done, 1.1))
    assert "have exited" in group.evicted_reason("a")


def test_continue_as_new_when_suggested_but_never_in_the_middle_of_a_switch() -> None:
    group = b_waits_behind_a()
    attempt_of(group.handle(ev.Tick(continue_as_new_suggested=False), 1.0))
    during = group.handle(ev.Tick(continue_as_new_suggested=True), 1.05)
    assert cmd.ContinueAsNew() not in during  # a switch is under way
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
    assert [c.patch for c in commands if isinstance(c, cmd.MarkPatch)] == [
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


def test_the_core_says_when_to_look_again_and_a_heartbeat_asks_for_no_look() -> None:
    group = core(GroupPolicy(idle_lease_seconds=30))
    # Nothing to do now; the next lease to run out is the earliest joiner's.
    assert wake_of(group.handle(ev.Tick(), 1.0)) == cmd.Wake(at=30.0, at_once=False)
    # a's lease is later now, b's is not.
    assert wake_of(group.handle(ev.Heartbeat("a", "hash-a"), 2.0)) == cmd.Wake(30.0, False)
    assert wake_of(group.handle(ev.Acquire("a", "hash-a", "a-1"), 3.0)).at_once


def test_a_release_is_commanded_once_per_run_and_again_by_a_new_run() -> None:
    group = core()
    reply(group.handle(ev.Leave("a", "hash-a"), 1.0))
    assert cmd.StartReleases((cmd.Release("a", NODE, 1),)) in group.handle(ev.Tick(), 1.0)
    again = group.handle(ev.Tick(), 2.0)
    assert not any(isinstance(c, cmd.StartReleases) for c in again)
    assert not wake_of(again).at_once
    # The state carried into a new run still names the release: started again.
    carried = GroupState.model_validate(group.state.model_dump())
    restarted = GroupCore(carried).handle(ev.RunStarted(), 3.0)
    assert restarted[0] == cmd.StartReleases((cmd.Release("a", NODE, 1),))
    ended = group.handle(ev.ReleaseEnded("a", NODE, 1), 4.0)
    assert not group.state.releasing and ended == [wake_of(ended)] and not wake_of(ended).at_once


def test_a_release_of_an_earlier_membership_never_ends_the_release_of_a_later_one() -> None:
    """a leaves; while its agent still releases it, a joins again, is granted,
    and leaves again. That membership's release is its own: the first one's
    late end neither counts for it nor keeps it from being commanded."""
    group = core(jobs=("a",))
    reply(group.handle(ev.Leave("a", "hash-a"), 1.0))
    (first,) = releases_in(group.handle(ev.Tick(), 1.0))
    reply(group.handle(ev.Join("a", [NODE], "hash-a2"), 2.0))
    reply(group.handle(ev.Acquire("a", "hash-a2", "a-2"), 2.0))
    attempt_of(group.handle(ev.Tick(), 2.0))
    group.handle(went_through(), 2.1)
    assert group.state.turn is not None and group.state.turn.job == "a"
    reply(group.handle(ev.Leave("a", "hash-a2"), 3.0))
    looked = group.handle(ev.Tick(), 3.0)
    (second,) = releases_in(looked)
    assert second != first
    # A history from before took no second release here: its marker says so.
    assert cmd.MarkPatch(RELEASE_PER_MEMBERSHIP) in looked
    group.handle(ev.ReleaseEnded(*first), 4.0)
    assert group.state.releasing == {"a": [NODE]}  # the later membership's is under way
    group.handle(ev.ReleaseEnded(*second), 5.0)
    assert not group.state.releasing


def releases_in(commands: list[cmd.Command]) -> list[cmd.Release]:
    return [release for c in commands if isinstance(c, cmd.StartReleases) for release in c.releases]


def test_every_command_is_in_the_union_and_carried_out_by_the_workflow() -> None:
    """mypy fails the workflow's executor where its match misses a command of
    the union (assert_never); this fails where a command is left out of the
    union, or the executor's match names none of it."""
    defined = {
        value
        for value in vars(cmd).values()
        if isinstance(value, type)
        and value.__module__ == cmd.__name__
        and dataclasses.is_dataclass(value)  # not what a command carries (Release)
    }
    assert set(typing.get_args(cmd.Command)) == defined
    source = (Path(__file__).parents[2] / "workflows" / "group.py").read_text()
    (carry_out,) = [
        node
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.FunctionDef) and node.name == "_carry_out"
    ]
    matched = {
        pattern.cls.attr
        for node in ast.walk(carry_out)
        if isinstance(node, ast.match_case)
        for pattern in [node.pattern]
        if isinstance(pattern, ast.MatchClass) and isinstance(pattern.cls, ast.Attribute)
    }
    assert matched == {command.__name__ for command in defined}


def test_every_event_is_handled_by_the_core() -> None:
    defined = {
        value
        for value in vars(ev).values()
        if isinstance(value, type) and value.__module__ == ev.__name__
    }
    # Parts of an event, not events.
    parts = {ev.NodeSwitched, ev.NodeFailed}
    assert set(typing.get_args(ev.Event)) == defined - parts
    assert set(core()._handlers) == defined - parts
