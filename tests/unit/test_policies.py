"""Scheduling policies in the pure queue (groups with rules 2): fair share,
priorities with aging, stage priorities, preemption by priority, and the
leases that only bind a holder others wait for. Beside examples, property
tests of the stated bounds: fair shares stay within one turn of each other,
and aging lets every waiter through."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from tests.lock_queue import LockQueue
from timeshare.models import GroupPolicy
from timeshare.scheduling import commands as cmd
from timeshare.scheduling import events as ev
from timeshare.scheduling import ordering
from timeshare.scheduling.base import QueueError
from timeshare.scheduling.group_core import GroupCore
from timeshare.scheduling.rules import RULES_LEGACY, RULES_POLICIES
from timeshare.scheduling.state import GroupState, StoredPolicy, Waiter


def group(policy: GroupPolicy | None = None, /, **jobs: tuple[float, int]) -> LockQueue:
    """A queue with policies; jobs name (weight, priority); all on node n."""
    state = GroupState(
        group="g", policy=StoredPolicy.stored(policy or GroupPolicy()), rules=RULES_POLICIES
    )
    queue = LockQueue(state)
    for job, (weight, priority) in jobs.items():
        queue.join(job, ["n"], f"h-{job}", now=0.0, weight=weight, priority=priority)
    return queue


def grant_next(queue: LockQueue, now: float) -> str:
    """Carry out the switch the queue wants, if any; the holder's name."""
    if queue.needs_switch():
        queue.begin_switch(now)
        queue.finish_switch(now)
    turn = queue.state.turn
    assert turn is not None
    return turn.job


def hold(queue: LockQueue, job: str, start: float, seconds: float, phase: str = "") -> float:
    """Job asks (as phase), is granted, holds for seconds, yields; returns the end time."""
    queue.request(job, f"{job}-{start}", now=start, phase=phase)
    assert grant_next(queue, start) == job
    turn = queue.state.turn
    assert turn is not None
    queue.yield_turn(job, turn.epoch, now=start + seconds)
    return start + seconds


# -- fair share -----------------------------------------------------------------


def cycle(queue: LockQueue, turns: dict[str, float], grants: int) -> dict[str, float]:
    """Every job always wants the GPU; each holds its own turn length. As in
    the workflow, the next turn is granted when the holder yields, before
    that holder's next request arrives. GPU-seconds per job."""
    now = 0.0
    for job in turns:
        queue.request(job, f"{job}-0", now=now)
    holder = grant_next(queue, now)
    for n in range(grants):
        turn = queue.state.turn
        assert turn is not None and turn.job == holder
        now += turns[holder]
        queue.yield_turn(holder, turn.epoch, now=now)
        following = grant_next(queue, now)
        queue.request(holder, f"{holder}-{n + 1}", now=now)
        holder = following
    return {job: entry.held_seconds for job, entry in queue.state.jobs.items()}


def jain(values: list[float]) -> float:
    return sum(values) ** 2 / (len(values) * sum(v * v for v in values))


def test_fair_share_evens_out_gpu_time_where_fifo_gives_it_to_long_turns() -> None:
    turns = {"long": 0.6, "short-a": 0.1, "short-b": 0.1}
    fifo = cycle(group(GroupPolicy(ordering="fifo"), **dict.fromkeys(turns, (1, 0))), turns, 300)
    fair = cycle(group(**dict.fromkeys(turns, (1, 0))), turns, 300)
    assert fifo["long"] == pytest.approx(6 * fifo["short-a"], rel=0.05)
    assert jain(list(fifo.values())) < 0.8
    assert jain(list(fair.values())) > 0.99


def test_two_jobs_that_always_want_the_gpu_alternate_whatever_the_ordering() -> None:
    # Work-conserving: when one yields, the other is the only waiter and gets
    # the GPU; no ordering of waiters can change a share between two jobs.
    turns = {"long": 0.6, "short": 0.1}
    for policy in (GroupPolicy(ordering="fifo"), GroupPolicy()):
        used = cycle(group(policy, long=(1, 0), short=(1, 0)), turns, 200)
        assert used["long"] == pytest.approx(6 * used["short"], rel=0.05)


def test_weights_scale_the_share() -> None:
    # (A job never waits at its own yield, so no weight gets it more than
    # every other turn: here its share is 2/5, within that.)
    lights = {f"light-{n}": 0.1 for n in range(3)}
    turns = {"heavy": 0.1, **lights}
    used = cycle(group(heavy=(2, 0), **dict.fromkeys(lights, (1, 0))), turns, 500)
    for light in lights:
        assert used["heavy"] == pytest.approx(2 * used[light], rel=0.05)


def test_a_newcomer_starts_level_with_the_least_served_member() -> None:
    queue = group(a=(1, 0), b=(1, 0))
    end = hold(queue, "a", 0.0, 100.0)
    end = hold(queue, "b", end, 40.0)
    queue.join("c", ["n"], "h-c", now=end)
    assert queue.state.jobs["c"].share_seconds == queue.state.jobs["b"].share_seconds == 40.0
    # c does not get the GPU for the 100 s it never used: it alternates with b.
    for job in ("a", "b", "c"):
        queue.request(job, f"{job}-again", now=end)
    assert grant_next(queue, end) in ("b", "c")


def test_a_job_back_from_a_long_absence_banks_at_most_the_credit() -> None:
    policy = GroupPolicy(fair_credit_seconds=5)
    queue = group(policy, a=(1, 0), b=(1, 0))
    end = 0.0
    for n in range(10):  # b alone for 100 s
        end = hold(queue, "b", end, 10.0)
        assert n >= 0
    queue.request("b", "b-more", now=end)
    grant_next(queue, end)  # b holds; a comes back
    queue.request("a", "a-back", now=end)
    assert queue.state.jobs["a"].share_seconds == pytest.approx(100.0 - 5.0)


def test_switch_time_is_charged_to_nobody() -> None:
    queue = group(a=(1, 0), b=(1, 0))
    hold(queue, "a", 0.0, 1.0)
    queue.request("b", "rb", now=1.0)
    queue.begin_switch(now=1.0)
    queue.finish_switch(now=9.0)  # an 8 s switch
    turn = queue.state.turn
    assert turn is not None
    queue.yield_turn("b", turn.epoch, now=10.0)
    assert queue.state.jobs["b"].held_seconds == queue.state.jobs["b"].share_seconds == 1.0


# -- priorities, phases, aging -----------------------------------------------------


def test_priority_goes_first_and_fair_share_applies_within_it() -> None:
    queue = group(low=(1, 0), high=(1, 5), other=(1, 5))
    end = hold(queue, "high", 0.0, 3.0)
    for job in ("low", "other", "high"):
        queue.request(job, f"{job}-r", now=end)
    order = ordering.in_grant_order(queue.state.queue, queue.state.jobs, queue.state.policy, end)
    assert [w.job for w in order] == ["other", "high", "low"]


def test_phase_priority_puts_train_before_rollout() -> None:
    policy = GroupPolicy(phase_priority={"train": 1})
    queue = group(policy, sampler=(1, 0), batch=(1, 0), trainer=(1, 0))
    queue.request("sampler", "s1", now=0.0, phase="rollout")
    grant_next(queue, 0.0)
    queue.request("batch", "b1", now=0.2, phase="rollout")
    queue.request("trainer", "t1", now=0.5, phase="train")  # asked later
    queue.yield_turn("sampler", 1, now=1.0)
    assert grant_next(queue, 1.0) == "trainer"
    turn = queue.state.turn
    assert turn is not None and turn.phase == "train"
    assert queue.state.recent_turns[-1].phase == "train"


def test_aging_raises_a_waiter_one_level_per_period() -> None:
    policy = GroupPolicy(aging_seconds=10)
    queue = group(policy, low=(1, 0), high=(1, 2))
    waiter = Waiter(job="low", request_id="r", ticket=1, since=0.0)
    stored = queue.state.policy
    entry = queue.state.jobs["low"]
    assert [ordering.effective_priority(entry, waiter, stored, t) for t in (0, 9.9, 10, 25)] == [
        0,
        0,
        1,
        2,
    ]


def test_legacy_groups_keep_fifo_whatever_the_policy_says() -> None:
    state = GroupState(
        group="g",
        policy=StoredPolicy.stored(GroupPolicy(phase_priority={"train": 9})),
        rules=RULES_LEGACY,
    )
    queue = LockQueue(state)
    for job in ("a", "b", "c"):
        queue.join(job, ["n"], f"h-{job}", now=0.0, priority=0 if job != "c" else 9)
    hold(queue, "a", 0.0, 1.0)
    queue.request("a", "a2", now=1.0)
    queue.request("b", "b1", now=1.0)
    queue.request("c", "c1", now=1.0, phase="train")
    assert grant_next(queue, 1.0) == "a"


# -- preemption by priority ---------------------------------------------------------


def test_a_higher_priority_waiter_asks_the_holder_to_yield_then_preempts_it() -> None:
    policy = GroupPolicy(preempt_lower_after_seconds=5)
    queue = group(policy, batch=(1, 0), trainer=(1, 3))
    queue.request("batch", "b1", now=0.0)
    grant_next(queue, 0.0)
    assert queue.yield_requested_epoch(now=1.0) == 0
    queue.request("trainer", "t1", now=2.0)
    assert queue.yield_requested_epoch(now=2.0) == 1
    assert queue.heartbeat("batch", now=2.0).should_yield
    assert queue.next_deadline(now=2.0) == 7.0
    assert queue.expire(now=6.9) == []
    assert queue.expire(now=7.0) == ["preempted batch after 7 s"]
    assert grant_next(queue, 7.0) == "trainer"
    assert queue.state.jobs["batch"].preempted
    assert queue.yield_turn("batch", 1, now=8.0) == 0.0  # its late yield is accepted


def test_without_the_knob_a_higher_priority_waiter_only_goes_first() -> None:
    queue = group(batch=(1, 0), trainer=(1, 3))
    queue.request("batch", "b1", now=0.0)
    grant_next(queue, 0.0)
    queue.request("trainer", "t1", now=1.0)
    queue.heartbeat("batch", now=90.0)  # renewing, as its client does while others wait
    assert queue.yield_requested_epoch(now=100.0) == 0
    assert queue.expire(now=100.0) == []


def test_the_turn_limit_asks_at_its_due_time_and_wakes_the_group_then() -> None:
    policy = GroupPolicy(max_turn_seconds=10, preempt_grace_seconds=5)
    queue = group(policy, a=(1, 0), b=(1, 0))
    queue.request("a", "a1", now=0.0)
    grant_next(queue, 0.0)
    queue.request("b", "b1", now=1.0)
    assert queue.next_deadline(now=1.0) == 10.0  # when the request to yield is published
    assert queue.yield_requested_epoch(now=10.0) == 1
    assert queue.next_deadline(now=10.0) == 15.0
    status = queue.status(now=10.0)
    assert status.yield_requested and status.holder == "a"


# -- leases ------------------------------------------------------------------------


def test_an_idle_member_outlives_the_lease_and_a_contended_holder_does_not() -> None:
    policy = GroupPolicy(lease_seconds=30, idle_lease_seconds=3600)
    queue = group(policy, a=(1, 0), b=(1, 0))
    queue.request("a", "a1", now=0.0)
    grant_next(queue, 0.0)
    assert queue.expire(now=1000.0) == []  # a holds alone, b idles: nobody is harmed
    queue.request("b", "b1", now=1000.0)
    assert queue.next_deadline(now=1000.0) == 1030.0
    done = queue.expire(now=1030.0)
    assert done == ["evicted a: it held the turn while others waited and sent nothing for 30 s"]
    assert "a" not in queue.state.jobs
    assert queue.expire(now=1000.0 + 3600.0) == ["evicted b: it sent nothing for 3600 s"]


def test_a_job_granted_after_a_long_wait_gets_its_whole_lease_from_the_grant() -> None:
    # As in a chaos run: a's process dies holding the turn, b and c wait
    # behind it; b is granted once a's lease runs out and must not be evicted
    # for the silence of its own wait.
    queue = group(GroupPolicy(lease_seconds=30), a=(1, 0), b=(1, 0), c=(1, 0))
    queue.request("a", "a1", now=0.0)
    grant_next(queue, 0.0)
    queue.request("b", "b1", now=1.0)
    queue.request("c", "c1", now=2.0)
    assert queue.expire(now=31.0) == [
        "evicted a: it held the turn while others waited and sent nothing for 30 s"
    ]
    assert grant_next(queue, 31.5) == "b"
    assert queue.next_deadline(now=31.5) == 61.5
    assert queue.expire(now=45.0) == []
    assert queue.state.turn is not None and queue.state.turn.job == "b"
    assert queue.yield_turn("b", queue.state.turn.epoch, now=45.0) >= 0.0


def test_a_holder_that_renews_keeps_its_turn_while_others_wait() -> None:
    queue = group(GroupPolicy(lease_seconds=30), a=(1, 0), b=(1, 0))
    queue.request("a", "a1", now=0.0)
    grant_next(queue, 0.0)
    queue.request("b", "b1", now=1.0)
    for now in range(11, 200, 10):
        queue.heartbeat("a", now=float(now))
        assert queue.expire(now=float(now)) == []
    assert queue.state.turn is not None and queue.state.turn.job == "a"


def test_a_bad_phase_or_weight_is_refused() -> None:
    with pytest.raises(ValueError, match="phase"):
        GroupPolicy(phase_priority={"x" * 64: 1})
    with pytest.raises(ValueError, match="idle_lease_seconds"):
        GroupPolicy(lease_seconds=100, idle_lease_seconds=50)


# -- the stated bounds, as properties --------------------------------------------------


@settings(max_examples=200, deadline=None)
@given(
    weights=st.lists(st.sampled_from([0.5, 1.0, 2.0, 4.0]), min_size=2, max_size=4),
    lengths=st.lists(st.floats(min_value=0.0, max_value=2.0), min_size=60, max_size=60),
)
def test_fair_shares_stay_within_one_turn_of_each_other(
    weights: list[float], lengths: list[float]
) -> None:
    """Jobs that are all waiting at every grant (each asks again as it yields):
    after every turn, no two shares differ by more than T / w_min (T the
    longest turn), the bound the docs and ordering.py state."""
    names = [f"j{i}" for i in range(len(weights))]
    queue = group(None, **{name: (weight, 0) for name, weight in zip(names, weights, strict=True)})
    now = 0.0
    for name in names:
        queue.request(name, f"{name}-0", now=now)
    bound = 2.0 / min(weights) + 1e-9
    for n, length in enumerate(lengths):
        holder = grant_next(queue, now)
        turn = queue.state.turn
        assert turn is not None
        now += length
        queue.yield_turn(holder, turn.epoch, now=now)
        shares = [entry.share_seconds for entry in queue.state.jobs.values()]
        assert max(shares) - min(shares) <= bound, (n, shares)
        queue.request(holder, f"{holder}-{n + 1}", now=now)


@settings(max_examples=100, deadline=None)
@given(
    gap=st.integers(min_value=1, max_value=5),
    aging=st.floats(min_value=5.0, max_value=60.0),
    turn=st.floats(min_value=0.5, max_value=4.0),
)
def test_aging_lets_the_lowest_priority_through_within_its_bound(
    gap: int, aging: float, turn: float
) -> None:
    """Two high-priority jobs hand the GPU back and forth forever; the low one
    still gets it within (gap + 1) * aging_seconds + 2 turns of asking."""
    queue = group(GroupPolicy(aging_seconds=aging), high1=(1, gap), high2=(1, gap), low=(1, 0))
    now = 0.0
    queue.request("low", "low", now=now)
    for job in ("high1", "high2"):
        queue.request(job, f"{job}-0", now=now)
    for n in itertools.count():
        holder = grant_next(queue, now)
        if holder == "low":
            break
        turn_now = queue.state.turn
        assert turn_now is not None
        now += turn
        queue.yield_turn(holder, turn_now.epoch, now=now)
        queue.request(holder, f"{holder}-{n + 1}", now=now)
        assert now <= (gap + 1) * aging + 2 * turn, f"low still waits at {now:.1f} s"


class PolicyMachine(RuleBasedStateMachine):
    """Random traffic in a group with policies: priorities, phases, aging,
    preemption by priority, the turn limit, leases and pauses, through
    GroupCore's door as the group workflow drives it (every switch goes
    through; tests/unit/test_group_machine.py has the failures).

    Invariant beyond the group machine's (tests/unit/test_group_machine.py): whenever a
    turn is granted, no eligible waiter left behind had a higher effective
    priority, except those that asked after the switch for the granted job had
    begun (a switch under way completes: the documented exception)."""

    def __init__(self) -> None:
        super().__init__()
        policy = GroupPolicy(
            lease_seconds=30,
            idle_lease_seconds=120,
            max_turn_seconds=20,
            preempt_grace_seconds=5,
            aging_seconds=15,
            phase_priority={"train": 2, "rollout": 0},
            preempt_lower_after_seconds=3,
        )
        state = GroupState(group="g", policy=StoredPolicy.stored(policy), rules=RULES_POLICIES)
        self.core = GroupCore(state)
        self.wake = cmd.Wake(at=None)
        self.now = 0.0
        self.requests = 0
        self.last_epoch = 0
        self.violations: list[str] = []

    jobs = st.sampled_from(["a", "b", "c", "d"])
    phases = st.sampled_from(["", "train", "rollout"])

    def tick(self, seconds: float = 1.0) -> float:
        self.now += seconds
        return self.now

    def handle(self, event: ev.Event, switch_began: float | None = None) -> list[cmd.Command]:
        """The event at the machine's time (a refused message changes nothing,
        whatever the handler had done); then a new turn is checked."""
        before = self.core.state.model_dump()
        try:
            commands = self.core.handle(event, self.now)
        except QueueError:
            assert self.core.state.model_dump() == before
            return []
        self.wake = next((c for c in commands if isinstance(c, cmd.Wake)), self.wake)
        self.check_grant(switch_began)
        return commands

    def check_grant(self, switch_began: float | None = None) -> None:
        state = self.core.state
        turn = state.turn
        if turn is None or turn.epoch == self.last_epoch:
            return
        self.last_epoch = turn.epoch
        at = switch_began if switch_began is not None else turn.granted_at
        granted = state.jobs[turn.job].priority + state.policy.phase_priority.get(turn.phase, 0)
        waited = state.queue if not state.paused else []
        drained = set(state.drained)
        for waiter in waited:
            if drained.intersection(state.jobs[waiter.job].nodes) or waiter.since > at:
                continue
            rank = ordering.effective_priority(state.jobs[waiter.job], waiter, state.policy, at)
            # The granted waiter's own aging counted at the same moment.
            if rank > granted + self.granted_age(turn.job, at):
                self.violations.append(f"{waiter.job} ({rank}) waits behind {turn.job}")

    def granted_age(self, job: str, at: float) -> int:
        record = self.core.state.recent_turns[-1]
        waiter = Waiter(job=job, request_id="", ticket=0, since=record.requested_at)
        return ordering.aged_periods(waiter, self.core.state.policy, at)

    def ask(self, job: str, phase: str, switch_began: float | None = None) -> None:
        if job in self.core.state.jobs:
            self.requests += 1
            asked = ev.Acquire(job, f"h-{job}", f"r{self.requests}", phase=phase)
            self.tick()
            self.handle(asked, switch_began)

    @rule(job=jobs, priority=st.sampled_from([0, 3]))
    def join(self, job: str, priority: int) -> None:
        self.tick()
        self.handle(ev.Join(job, ["n"], f"h-{job}", priority=priority))

    @rule(job=jobs, phase=phases)
    def acquire(self, job: str, phase: str) -> None:
        self.ask(job, phase)

    @rule()
    def yield_turn(self) -> None:
        turn = self.core.state.turn
        if turn is not None:
            self.tick()
            self.handle(ev.Yield(turn.job, f"h-{turn.job}", turn.told_epoch))

    @rule(seconds=st.floats(min_value=0, max_value=40))
    def time_passes(self, seconds: float) -> None:
        """The timer rings: the group looks at itself (leases, turn limits)."""
        self.tick(seconds)
        self.look([])

    @rule(paused=st.booleans())
    def pause(self, paused: bool) -> None:
        self.tick()
        self.handle(ev.Pause(paused))

    @rule(job=jobs)
    def leave(self, job: str) -> None:
        self.tick()
        self.handle(ev.Leave(job, f"h-{job}"))

    @precondition(lambda self: self.wake.at_once)
    @rule(arrivals=st.lists(st.tuples(jobs, phases), max_size=2))
    def look_when_told(self, arrivals: list[tuple[str, str]]) -> None:
        self.tick()
        self.look(arrivals)

    def look(self, arrivals: list[tuple[str, str]]) -> None:
        """A look, and the switch it starts going through; ``arrivals``:
        requests that come in while the switch runs."""
        commands = self.handle(ev.Tick())
        attempts = [c for c in commands if isinstance(c, cmd.AttemptSwitch)]
        if not attempts:
            return
        began = self.now
        for job, phase in arrivals:
            self.ask(job, phase, switch_began=began)
        done = [ev.NodeSwitched(move.node) for move in attempts[0].plan.moves]
        self.tick()
        self.handle(ev.SwitchAttempted(done=done, failed=[]), switch_began=began)

    @invariant()
    def no_higher_priority_waiter_was_passed_over(self) -> None:
        assert not self.violations, self.violations

    @invariant()
    def each_waiter_is_a_member_waiting_once(self) -> None:
        waiting = [w.job for w in self.core.state.queue]
        assert len(waiting) == len(set(waiting))
        assert set(waiting) <= set(self.core.state.jobs)


TestPolicyMachine = PolicyMachine.TestCase
TestPolicyMachine.settings = settings(max_examples=500, stateful_step_count=40, deadline=None)
