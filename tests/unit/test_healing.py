"""A group rebuilt from an earlier state and what its jobs were told since
(timeshare.scheduling.healing), against the group that really ran.

The test runs a group through the core as the workflow would (joins, asks,
yields, leaves, heartbeats, switches that take a while), writes down each
fact its history would record, and cuts the run at a random point, as a
replay that stops part-way does. The state at the cut, healed with the facts
after it, must agree with where the group really got to: the same holder
with the epoch it was told, the same members and waiters, epochs and plans
never below any the run used, and no node said to hold a job it may not."""

from __future__ import annotations

from dataclasses import dataclass, field

from hypothesis import given, settings
from hypothesis import strategies as st

from timeshare.models import AcquireResult, GroupPolicy
from timeshare.scheduling import commands as cmd
from timeshare.scheduling import events as ev
from timeshare.scheduling import healing
from timeshare.scheduling.base import UNKNOWN_RESIDENT, QueueError
from timeshare.scheduling.group_core import GroupCore
from timeshare.scheduling.rules import RULES_OVERDUE_ASKS
from timeshare.scheduling.state import GroupState, StoredGrant, StoredPolicy, SwitchPlan

NODES = {"a": ["n1"], "b": ["n1", "n2"], "c": ["n2"], "d": ["n1"]}
JOBS = st.sampled_from(sorted(NODES))
# Weighted towards what moves the group on: asks, the holder's yields, the
# group's looks and the switches they start completing.
OPS = st.one_of(
    st.tuples(st.sampled_from(["ask", "ask", "leave", "join", "heartbeat"]), JOBS),
    st.tuples(st.sampled_from(["yield", "look", "switched"]), st.just("")),
)


def token(job: str) -> str:
    return f"hash-{job}"


@dataclass
class Run:
    """A group as its workflow runs it, and the facts its history records."""

    core: GroupCore
    now: float = 0.0
    facts: list[healing.HealFact] = field(default_factory=list)
    requests: dict[str, str] = field(default_factory=dict)
    told: set[tuple[str, int]] = field(default_factory=set)
    # The switch attempted and not yet answered, and every plan sent (in order).
    attempt: SwitchPlan | None = None
    plans: list[SwitchPlan] = field(default_factory=list)
    asked: int = 0

    @classmethod
    def new(cls) -> Run:
        state = GroupState(
            group="g",
            policy=StoredPolicy.stored(GroupPolicy(prefetch="off")),
            rules=RULES_OVERDUE_ASKS,
        )
        run = cls(GroupCore(state))
        for job in sorted(NODES):
            run.join(job)
        return run

    def handle(self, event: ev.Event) -> list[cmd.Command]:
        self.now += 0.5
        commands = self.core.handle(event, self.now)
        for command in commands:
            if isinstance(command, cmd.AttemptSwitch):
                self.attempt = command.plan
                self.plans.append(command.plan)
        return commands

    def join(self, job: str) -> None:
        join = ev.Join(job, NODES[job], token(job))
        self.handle(join)
        self.facts.append(healing.Joined(join=join, at=self.now))

    def step(self, op: str, job: str) -> None:
        state = self.core.state
        try:
            if op == "ask" and job in state.jobs:
                self.ask(job)
            elif op == "yield" and state.turn is not None:
                given = ev.Yield(state.turn.job, token(state.turn.job), state.turn.told_epoch)
                self.handle(given)
                self.facts.append(healing.GaveBack(given=given, at=self.now))
            elif op == "leave" and job in state.jobs:
                leave = ev.Leave(job, token(job))
                self.handle(leave)
                self.facts.append(healing.Left(leave=leave, at=self.now))
            elif op == "join" and job not in state.jobs:
                self.join(job)
            elif op == "heartbeat" and job in state.jobs:
                heartbeat = ev.Heartbeat(job, token(job))
                self.handle(heartbeat)
                self.facts.append(healing.Heard(heartbeat=heartbeat, at=self.now))
            elif op == "look" and self.attempt is None:
                self.handle(ev.Tick())
            elif op == "switched" and self.attempt is not None:
                done = [ev.NodeSwitched(move.node) for move in self.attempt.moves]
                self.attempt = None
                self.handle(ev.SwitchAttempted(done=done, failed=[]))
        except QueueError:
            pass
        self.tell_grants()

    def ask(self, job: str) -> None:
        self.asked += 1
        request = f"{job}-{self.asked}"
        acquire = ev.Acquire(job, token(job), request)
        result = self.core.handle(acquire, self.now)
        answer = next(c.value for c in result if isinstance(c, cmd.Reply))
        assert isinstance(answer, AcquireResult)
        self.requests[job] = request
        self.facts.append(healing.Asked(acquire=acquire, at=self.now))

    def tell_grants(self) -> None:
        """A waiting acquire returns its grant as soon as the group makes it."""
        turn = self.core.state.turn
        if turn is not None and (turn.job, turn.told_epoch) not in self.told:
            self.told.add((turn.job, turn.told_epoch))
            self.facts.append(healing.Granted(grant=turn.model_copy(), at=self.now))


def healed(base: GroupState, run: Run, facts_from: int, plans_from: int) -> GroupCore:
    after = run.plans[plans_from:]
    touched = {move.node for plan in after for move in plan.moves}
    rebuild = healing.HealInput(
        cause="test",
        failed_run_id="r",
        rebuilt_from="a cut",
        facts=run.facts[facts_from:],
        plans_sent=max([0, *(plan.number for plan in run.plans)]),
        epochs_sent=max([0, *(plan.epoch for plan in run.plans)]),
        touched_nodes=sorted(touched),
    )
    core = GroupCore(base.model_copy(deep=True))
    core.handle(ev.Healed(rebuild), run.now + 1)
    return core


def holder(state: GroupState) -> tuple[str, int] | None:
    return None if state.turn is None else (state.turn.job, state.turn.told_epoch)


@settings(max_examples=500, deadline=None)
@given(st.lists(OPS, max_size=40), st.lists(OPS, max_size=40))
def test_a_group_healed_from_any_cut_agrees_with_where_it_got_to(
    before: list[tuple[str, str]], after: list[tuple[str, str]]
) -> None:
    run = Run.new()
    for op, job in before:
        run.step(op, job)
    base = run.core.state.model_copy(deep=True)
    facts_from, plans_from = len(run.facts), len(run.plans)
    for op, job in after:
        run.step(op, job)
    live, rebuilt = run.core.state, healed(base, run, facts_from, plans_from).state

    assert holder(rebuilt) == holder(live)
    assert set(rebuilt.jobs) == set(live.jobs)
    assert {w.job for w in rebuilt.queue} == {w.job for w in live.queue}
    assert rebuilt.epoch >= live.epoch and rebuilt.plans >= live.plans
    assert rebuilt.switching is None
    for node, job in rebuilt.resident.items():
        assert job in (UNKNOWN_RESIDENT, live.resident.get(node)), (node, job, live.resident)
    if live.turn is not None:
        assert all(rebuilt.resident[n] == live.turn.job for n in live.jobs[live.turn.job].nodes)


def test_a_rebuilt_group_grants_nobody_while_it_applies_the_facts() -> None:
    """b waited, a yielded: the live group would switch b in at its next look.
    Healed, nobody holds: the grant is the new run's to make, after a switch."""
    run = Run.new()
    run.ask("a")
    run.step("look", "")
    run.step("switched", "")
    base = run.core.state.model_copy(deep=True)
    start = len(run.facts)
    run.ask("b")
    run.step("yield", "a")
    core = healed(base, run, start, len(run.plans))
    state = core.state
    assert state.turn is None and [w.job for w in state.queue] == ["b"]
    assert state.grants == base.grants
    attempt = [c for c in core.handle(ev.Tick(), run.now + 2) if isinstance(c, cmd.AttemptSwitch)]
    assert [(m.node, m.admit) for m in attempt[0].plan.moves] == [("n1", "b"), ("n2", "b")]


def test_a_node_a_switch_moved_after_the_cut_is_never_said_to_hold_the_job_it_held_before() -> None:
    run = Run.new()
    run.ask("a")
    run.step("look", "")
    run.step("switched", "")
    base = run.core.state.model_copy(deep=True)
    start, plans = len(run.facts), len(run.plans)
    run.step("yield", "")
    run.ask("b")
    run.step("look", "")
    run.step("switched", "")
    run.step("yield", "")
    assert run.core.state.resident == {"n1": "b", "n2": "b"}
    state = healed(base, run, start, plans).state
    assert state.turn is None and state.resident == {"n1": UNKNOWN_RESIDENT, "n2": UNKNOWN_RESIDENT}


def test_a_job_told_a_grant_the_replayed_state_never_made_holds_the_turn() -> None:
    """The SDK bug's shape: the state replays to a switch under way for b;
    the history then tells b its grant and records c's ask."""
    run = Run.new()
    run.ask("b")
    run.step("look", "")
    assert run.attempt is not None
    base = run.core.state.model_copy(deep=True)
    start, plans = len(run.facts), len(run.plans)
    run.step("switched", "")
    run.ask("c")
    core = healed(base, run, start, plans)
    state = core.state
    assert holder(state) == ("b", 1) and [w.job for w in state.queue] == ["c"]
    assert state.resident == {"n1": "b", "n2": "b"}
    assert state.plans == 1 and state.heals == 1 and len(state.heal_times) == 1


def test_a_turn_taken_without_a_yield_is_kept_for_its_holder_to_resume() -> None:
    """A grant told to c while a held the turn: a's turn ended without its
    yield (preempted, or evicted for silence). a keeps its membership and
    the epoch it was told; its yield of it is answered, not refused."""
    run = Run.new()
    run.ask("a")
    run.step("look", "")
    run.step("switched", "")
    base = run.core.state.model_copy(deep=True)
    grant = StoredGrant(
        job="c", request_id="c-9", epoch=2, ticket=9, granted_at=5.0, waited_seconds=0.0,
        switch_seconds=0.0,
    )  # fmt: skip
    run.facts.append(healing.Granted(grant=grant, at=5.0))
    core = healed(base, run, len(run.facts) - 1, len(run.plans))
    assert holder(core.state) == ("c", 2)
    assert core.state.jobs["a"].preempted
    answer = core.handle(ev.Yield("a", token("a"), 1), run.now + 3)
    assert any(isinstance(c, cmd.Reply) for c in answer)


def test_numbers_the_failed_run_sent_are_never_used_again() -> None:
    run = Run.new()
    state = run.core.state.model_copy(deep=True)
    rebuild = healing.HealInput(
        cause="test", failed_run_id="r", rebuilt_from="the run's start",
        plans_sent=7, epochs_sent=5, incarnations_sent=9,
    )  # fmt: skip
    core = GroupCore(state)
    core.handle(ev.Healed(rebuild), 10.0)
    core.handle(ev.Leave("a", token("a")), 11.0)
    core.handle(ev.Join("a", NODES["a"], token("a")), 12.0)
    assert core.state.jobs["a"].incarnation > 9
    core.handle(ev.Acquire("b", token("b"), "b-1"), 13.0)
    plan = next(c for c in core.handle(ev.Tick(), 14.0) if isinstance(c, cmd.AttemptSwitch)).plan
    assert plan.number > 7 and plan.epoch > 5


def test_a_group_whose_new_runs_fail_at_once_is_healed_at_a_pace_never_given_up() -> None:
    times = [100.0, 200.0, 300.0]
    window, served = healing.HEAL_WINDOW_SECONDS, healing.SERVED_TASKS
    assert healing.recent_heals(times, 310.0) == healing.HEALS_ALLOWED
    # Two heals in the window: the third at once.
    assert healing.heal_allowed_at(times[1:], 310.0, served_tasks=2) == 310.0
    # Three, each new run failing before it served: once the oldest is old enough.
    assert healing.heal_allowed_at(times, 310.0, served_tasks=2) == 100.0 + window
    assert healing.heal_allowed_at(times, 100.0 + window, served_tasks=2) == 100.0 + window
    # A run that served its jobs since its heal failed anew: healed at once.
    assert healing.heal_allowed_at(times, 310.0, served_tasks=served) == 310.0
