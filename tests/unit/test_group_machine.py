"""The scheduling core under random traffic, through its one door: a
Hypothesis state machine hands GroupCore.handle joins, asks, yields, leaves,
heartbeats, evictions, time passing, backfill joins, switch outcomes (through, or failing in
each way a node reports), releases ending and restarts (the state carried
through its schema into a new core, as continue-as-new does), under every
Rules version a recorded group can have. It carries out the core's commands
as the group workflow does: a look (Tick) when a Wake says so, an attempt's
outcome only after AttemptSwitch, a pause's end only after PauseSwitch.

Beside the core, the machine keeps what the nodes really hold, moved only by
the switch outcomes it reports; the invariants are checked against that, not
against the core's own belief."""

from __future__ import annotations

from typing import assert_never

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    rule,
)

from timeshare.models import AcquireResult, FailureKind, GroupPolicy
from timeshare.scheduling import commands as cmd
from timeshare.scheduling import events as ev
from timeshare.scheduling import moves
from timeshare.scheduling.base import QueueError
from timeshare.scheduling.group_core import GroupCore
from timeshare.scheduling.rules import (
    RULES_ANTICIPATION,
    RULES_LEGACY,
    RULES_OVERDUE_ASKS,
    RULES_POLICIES,
    RULES_STEADY_DEADLINES,
    RULES_SWITCH_COSTS,
)
from timeshare.scheduling.state import GroupState, StoredPolicy, StoredSwitch, SwitchPlan

# Short, so that random traffic reaches the give-up of failing switches.
GIVE_UP_SECONDS = 10.0
SWITCH_SECONDS = 0.5
# Fixed per job, so that a share (GPU seconds over weight) means one thing throughout.
WEIGHTS = {"a": 1.0, "b": 2.0, "c": 0.5, "d": 1.0}
# A message comes at once, within an anticipation window, or a while later.
STEPS = st.sampled_from([0.0, 0.01, 1.0])
JOBS = st.sampled_from(sorted(WEIGHTS))
NODE_SETS = [["n1"], ["n2"], ["n1", "n2"]]
FAILURES = ["checkpoint", "restore", "hook", "unreachable", "quiesce"]
# Slack for float sums of shares.
EPSILON = 1e-6


def token(job: str) -> str:
    return f"hash-{job}"


class GroupMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.now = 0.0
        self.core = GroupCore(GroupState(group="g"))
        # The attempt or pause under way (the workflow awaits it), if any.
        self.attempt: SwitchPlan | None = None
        self.pause_until: float | None = None
        self.wake = cmd.Wake(at=None)
        self.releases: list[cmd.Release] = []
        # What each node's GPU really holds.
        self.device: dict[str, set[str]] = {}
        self.requests = 0
        # Requests answered "wait", by request id: their jobs.
        self.open: dict[str, str] = {}
        self.last_epoch = 0
        self.tickets: list[int] = []
        # By the waiter's ticket, for each switch planned: the members then if
        # every other member was waiting, else None.
        self.planned_contended: dict[int, frozenset[str] | None] = {}
        # A turn granted while every other member waited: (epoch, its grant
        # time, the spread of shares then, the smallest weight then).
        self.contended_turn: tuple[int, float, float, float] | None = None
        # A backfill job joined again as a regular one during the contended
        # turn: under Rules before 6 it kept its backfill share.
        self.turned_regular = False
        self.version = RULES_LEGACY
        # Who waited before the event being handled.
        self.waited: set[str] = set()

    # -- carrying out what the core says, as the group workflow does ----------------

    @initialize(
        rules=st.sampled_from(
            [
                RULES_LEGACY,
                RULES_POLICIES,
                RULES_ANTICIPATION,
                RULES_SWITCH_COSTS,
                RULES_OVERDUE_ASKS,
                RULES_STEADY_DEADLINES,
            ]
        ),
        members=st.sets(JOBS, min_size=2),
        nodes=st.sampled_from(NODE_SETS),
    )
    def create(self, rules: int, members: set[str], nodes: list[str]) -> None:
        self.version = rules
        policy = GroupPolicy(
            lease_seconds=30, idle_lease_seconds=120, max_turn_seconds=20,
            preempt_grace_seconds=5, switch_give_up_seconds=GIVE_UP_SECONDS,
        )  # fmt: skip
        state = GroupState(group="g", policy=StoredPolicy.stored(policy), rules=rules)
        self.core = GroupCore(state)
        self.handle(ev.RunStarted())
        for job in sorted(members):
            self.join(job, nodes, 0.0)

    def handle(self, event: ev.Event) -> list[cmd.Command]:
        self.waited = {waiter.job for waiter in self.core.state.queue}
        commands = self.core.handle(event, self.now)
        for command in commands:
            match command:
                case cmd.Reply() | cmd.Log() | cmd.MarkPatch():
                    pass  # the rule that sent the message reads its reply
                case cmd.StartReleases(releases=releases):
                    self.releases += releases
                case cmd.Wake():
                    self.wake = command
                case cmd.AttemptSwitch(plan=plan):
                    self.attempt = plan
                    self.note_plan(plan)
                case cmd.PauseSwitch(seconds=seconds):
                    self.pause_until = self.now + seconds
                case cmd.ContinueAsNew():
                    self.restart()
                case _:
                    assert_never(command)
        self.observe()
        return commands

    def in_switch(self) -> bool:
        return self.attempt is not None or self.pause_until is not None

    def look_when_told(self) -> None:
        """With no switch under way, a Wake at once is a look now (the
        workflow's loop); each look must get somewhere."""
        for _ in range(10):
            if self.in_switch() or not self.wake.at_once:
                return
            self.handle(ev.Tick())
        raise AssertionError(f"the core asks to look at once, again and again: {self.wake}")

    def restart(self) -> None:
        """Continue as new: the state through its schema into a new core; the
        old run's releases end with it, the new one commands them again."""
        assert not self.in_switch()
        state = self.core.state
        state.runs += 1
        self.core = GroupCore(GroupState.model_validate_json(state.model_dump_json()))
        self.releases = []
        self.handle(ev.RunStarted())

    def message(self, event: ev.Event, step: float) -> object:
        """Send a message as the gateway does: refused by the validator, or
        handled (a refusal changes nothing); its reply."""
        self.advance(step)
        if isinstance(event, ev.Message):
            try:
                self.core.check(event)
            except QueueError:
                return None
        before = self.core.state.model_dump()
        try:
            commands = self.handle(event)
        except QueueError:
            assert self.core.state.model_dump() == before
            return None
        self.look_when_told()
        (reply,) = [c.value for c in commands if isinstance(c, cmd.Reply)]
        return reply

    # -- jobs and operators ----------------------------------------------------------

    jobs = JOBS

    @rule(job=jobs, nodes=st.sampled_from(NODE_SETS), step=STEPS)
    def join(self, job: str, nodes: list[str], step: float) -> None:
        entry = self.core.state.jobs.get(job)
        self.turned_regular |= entry is not None and entry.backfill
        self.message(ev.Join(job, nodes, token(job), weight=WEIGHTS[job]), step)

    @rule(job=jobs, nodes=st.sampled_from(NODE_SETS), step=STEPS)
    def join_as_backfill(self, job: str, nodes: list[str], step: float) -> None:
        """Refused by groups from before policies."""
        self.message(ev.Join(job, nodes, token(job), weight=WEIGHTS[job], backfill=True), step)

    @rule(step=STEPS)
    def every_member_asks(self, step: float) -> None:
        """Contention: the case fair share's bound speaks of."""
        asking = set(self.open.values())
        turn = self.core.state.turn
        for job in sorted(self.core.state.jobs):
            if job not in asking and (turn is None or turn.job != job):
                self.acquire(job, step)

    @rule(job=jobs, step=STEPS)
    def acquire(self, job: str, step: float, yield_epoch: int = 0) -> None:
        self.requests += 1
        request_id = f"r{self.requests}"
        asked = ev.Acquire(job, token(job), request_id, yield_epoch=yield_epoch)
        result = self.message(asked, step)
        if isinstance(result, AcquireResult):
            if result.grant is None:
                self.open[request_id] = job
            else:
                assert result.grant.job == job and job in self.core.state.jobs

    @rule(asks_again=st.booleans(), step=STEPS)
    def holder_yields(self, asks_again: bool, step: float) -> None:
        """Alone, or in the same message as its next request (a busy job)."""
        turn = self.core.state.turn
        if turn is None:
            return
        epoch = turn.told_epoch
        if asks_again:
            self.acquire(turn.job, step, yield_epoch=epoch)
        else:
            self.message(ev.Yield(turn.job, token(turn.job), epoch), step)

    @rule(job=jobs, step=STEPS)
    def heartbeat(self, job: str, step: float) -> None:
        self.message(ev.Heartbeat(job, token(job)), step)

    @rule(job=jobs, evicted=st.booleans(), step=STEPS)
    def member_goes(self, job: str, evicted: bool, step: float) -> None:
        """It leaves, or an operator evicts it."""
        self.message(ev.Evict(job, "operator") if evicted else ev.Leave(job, token(job)), step)

    @rule(data=st.data(), timed_out=st.booleans(), step=STEPS)
    def caller_goes_away(self, data: st.DataObject, timed_out: bool, step: float) -> None:
        if not self.open:
            return
        request_id = data.draw(st.sampled_from(sorted(self.open)))
        job = self.open.pop(request_id)
        if timed_out:
            self.message(ev.AcquireTimedOut(job, request_id), step)
        else:
            self.message(ev.CancelAcquire(job, token(job), request_id), step)

    # Paused now and then: a paused group grants nothing.
    @rule(paused=st.sampled_from([False, False, False, True]), step=STEPS)
    def operator_pauses(self, paused: bool, step: float) -> None:
        self.message(ev.Pause(paused), step)

    # -- time, switches, releases, restarts ---------------------------------------------

    @rule(seconds=st.sampled_from([0.01, 1.0, 5.0, 25.0]))
    def time_passes(self, seconds: float) -> None:
        """Long enough for every release under way to end too."""
        self.advance(seconds)
        while self.releases:
            self.end_release(self.releases[0])

    def advance(self, seconds: float) -> None:
        """Time passes as the workflow lives it: an attempt under way goes
        through in SWITCH_SECONDS, a pause ends (at its time, or when its plan
        falls), and while no switch is under way the one timer rings at each
        Wake's time (at least a millisecond on)."""
        end = self.now + seconds
        for _ in range(100):
            at = self.wake.at
            if self.attempt is not None and self.now + SWITCH_SECONDS <= end:
                self.report_attempt("", [], [], SWITCH_SECONDS)
            elif self.pause_until is not None and (
                self.pause_until <= end or not self.core.switch_plan_stands()
            ):
                self.end_pause()
            elif self.in_switch() or at is None or at > end:
                break
            else:
                self.now = max(at, self.now + 0.001)
                self.handle(ev.Tick())
                self.look_when_told()
        else:
            raise AssertionError(f"the timer rings again and again: {self.wake}")
        self.now = max(self.now, end)

    @rule(
        failure=st.sampled_from([*[""] * len(FAILURES), *FAILURES]),
        seconds=st.sampled_from([0.0, 0.5, 3.0]),
        data=st.data(),
    )
    def switch_attempt_ends(self, failure: str, seconds: float, data: st.DataObject) -> None:
        if self.attempt is None:
            return
        nodes = [move.node for move in self.attempt.moves]
        failed = (
            data.draw(st.lists(st.sampled_from(nodes), min_size=1, unique=True)) if failure else []
        )
        # Where the agent did not answer, nobody knows whether it moved the
        # state: either may be true.
        unknown = [node for node in failed if failure == "unreachable" and data.draw(st.booleans())]
        self.report_attempt(failure, failed, unknown, seconds)

    def report_attempt(
        self, failure: str, failed: list[str], moved_unseen: list[str], seconds: float
    ) -> None:
        plan = self.attempt
        assert plan is not None
        self.attempt = None
        self.now += seconds
        if failure == "quiesce":
            failures = [ev.NodeFailed(node, "could not stop", FailureKind.OTHER) for node in failed]
            self.handle(ev.SwitchAttempted(done=[], failed=failures, moved=False))
            self.look_when_told()
            return
        done, failures, records = [], [], []
        for move in plan.moves:
            leaving = move.evict[0] if move.evict else ""
            if move.node not in failed or move.node in moved_unseen:
                self.device[move.node] = {move.admit} if move.admit else set()
            if move.node not in failed:
                done.append(ev.NodeSwitched(move.node))
                # Measured: what switch-cost-aware admission (Rules 4) weighs.
                records.append(
                    StoredSwitch(
                        node=move.node, epoch=plan.epoch, started_at=self.now - seconds,
                        finished_at=self.now, evicted=move.evict, admitted=move.admit,
                        checkpoint_seconds={job: seconds / 2 for job in move.evict},
                        restore_seconds=seconds / 2,
                    )
                )  # fmt: skip
            elif failure == "restore":
                self.device[move.node] = set()  # checkpointed, and nothing came back
                failures.append(ev.NodeFailed(move.node, "restore failed", FailureKind.RESTORE))
            elif failure == "hook" and leaving:
                failures.append(ev.NodeFailed(move.node, "hooks failed", FailureKind.HOOK, leaving))
            elif failure == "unreachable":
                failures.append(ev.NodeFailed(move.node, "no answer", FailureKind.UNREACHABLE))
            else:
                failures.append(
                    ev.NodeFailed(move.node, "checkpoint failed", FailureKind.CHECKPOINT, leaving)
                )
        self.handle(ev.SwitchAttempted(done=done, failed=failures, records=records))
        self.look_when_told()

    def end_pause(self) -> None:
        """At its time, or as soon as the plan no longer stands."""
        assert self.pause_until is not None
        if self.core.switch_plan_stands():
            self.now = max(self.now, self.pause_until)
        self.pause_until = None
        self.handle(ev.SwitchPaused())
        self.look_when_told()

    @rule(data=st.data())
    def release_ends(self, data: st.DataObject) -> None:
        if not self.releases:
            return
        self.end_release(data.draw(st.sampled_from(self.releases)))

    def end_release(self, release: cmd.Release) -> None:
        """The agent lets the job's processes go: they run again where they
        are, no longer the group's (no switch stops them)."""
        self.releases.remove(release)
        self.handle(ev.ReleaseEnded(*release))
        self.look_when_told()

    @rule()
    def temporal_suggests_continue_as_new(self) -> None:
        if self.in_switch():
            return
        assert cmd.ContinueAsNew() in self.handle(ev.Tick(continue_as_new_suggested=True))
        self.look_when_told()

    # -- what each step is checked against --------------------------------------------

    def spread(self) -> float:
        shares = [entry.share_seconds for entry in self.core.state.jobs.values()]
        return max(shares) - min(shares) if shares else 0.0

    def others_all_wait(self, job: str) -> bool:
        """Before the event and after it: a job that asks again in the
        message that yields its turn has not asked when the turn goes on."""
        state = self.core.state
        waiting = {waiter.job for waiter in state.queue} & self.waited
        return set(state.jobs) - {job} <= waiting

    def note_plan(self, plan: SwitchPlan) -> None:
        if plan.attempts:
            return  # the waiter was chosen when the plan was made
        contended = not plan.prefetch and self.others_all_wait(plan.waiter.job)
        members = frozenset(self.core.state.jobs) if contended else None
        self.planned_contended[plan.waiter.ticket] = members

    def observe(self) -> None:
        """After every event: a contended turn that ended kept fair shares
        within the bound; a new turn is noted."""
        state, now = self.core.state, self.now
        turn = state.turn
        ended = self.contended_turn
        if ended is not None and (turn is None or turn.epoch != ended[0]):
            self.contended_turn = None
            _, granted_at, spread, lightest = ended
            # docs/guide/policies.md, "Fair share": the job granted is the one
            # furthest behind, and one turn moves it on by at most T / w_min.
            bound = max(spread, (now - granted_at) / lightest) + EPSILON
            kept_backfill_share = self.turned_regular and self.version < RULES_STEADY_DEADLINES
            assert kept_backfill_share or self.spread() <= bound, (self.spread(), bound, state.jobs)
        if turn is None or turn.epoch == self.last_epoch:
            return
        assert turn.epoch > self.last_epoch
        self.last_epoch = turn.epoch
        self.tickets.append(turn.ticket)
        self.open.pop(turn.request_id, None)
        # A switch under way completes (the documented exception): the grant
        # was decided when it was planned.
        came_by_switch = turn.ticket in self.planned_contended
        planned = self.planned_contended.pop(turn.ticket, None)
        backfill = {job for job, entry in state.jobs.items() if entry.backfill}
        if turn.job in backfill:
            regular_waiting = {w.job for w in state.queue} - backfill
            assert not regular_waiting, (turn, state.queue)
        # Fair share's bound speaks of regular jobs alone.
        contended = (
            self.version >= RULES_POLICIES
            and not backfill
            and self.others_all_wait(turn.job)
            and (planned == frozenset(state.jobs) if came_by_switch else True)
        )
        if contended:
            lightest = min(WEIGHTS[job] for job in state.jobs)
            self.contended_turn = (turn.epoch, turn.granted_at, self.spread(), lightest)
            self.turned_regular = False

    @invariant()
    def at_most_one_holder_alone_on_its_gpus_and_a_member(self) -> None:
        state = self.core.state
        turn = state.turn
        if turn is not None:
            assert turn.job in state.jobs
            assert all(waiter.job != turn.job for waiter in state.queue)
            for node in state.jobs[turn.job].nodes:
                members_there = self.device.get(node, set()) & set(state.jobs)
                assert members_there == {turn.job}, (node, self.device)

    @invariant()
    def a_due_switch_is_under_way(self) -> None:
        """The core asked for the look that starts it (Wake at once)."""
        assert self.in_switch() or not moves.needs_switch(self.core.state, self.now)

    @invariant()
    def nothing_is_overdue(self) -> None:
        """A lease, turn limit or turn held open that ran out by now was seen
        to when the core's Wake rang, or the Wake rings now (one that ran out
        during a switch)."""
        if self.in_switch() or (self.wake.at is not None and self.wake.at <= self.now):
            return
        if self.version in (RULES_SWITCH_COSTS, RULES_OVERDUE_ASKS) and self.backfill_waits():
            # Rules 4 and 5 looked again at a backfill waiter held back by
            # switch costs only while nobody held the turn, so a holder's turn
            # limit that counted from its release could ring late (Rules 6).
            return
        look = GroupCore(self.core.state.model_copy(deep=True)).handle(ev.Tick(), self.now)
        overdue = [c for c in look if isinstance(c, cmd.Log)]
        assert not overdue, (overdue, self.wake)

    def backfill_waits(self) -> bool:
        jobs = self.core.state.jobs
        return any(jobs[waiter.job].backfill for waiter in self.core.state.queue)

    @invariant()
    def every_release_is_commanded(self) -> None:
        """Once the core has settled, each node a job that left still holds
        is being released, by a release of the membership that left (a job
        that joined and left again while its last one was under way needs
        one of its own)."""
        if not self.in_switch():
            state = self.core.state
            wanted = {
                cmd.Release(job, node, state.releasing_incarnation.get(job, 0))
                for job, nodes in state.releasing.items()
                for node in nodes
            }
            assert wanted <= set(self.releases), (wanted, self.releases)

    @invariant()
    def no_waiter_is_lost(self) -> None:
        """Each request told to wait still waits, or was granted, or was
        ended with a reason its caller is told (or its job is gone)."""
        state = self.core.state
        waiting = [waiter.job for waiter in state.queue]
        assert len(waiting) == len(set(waiting)) and set(waiting) <= set(state.jobs)
        for request_id, job in list(self.open.items()):
            if self.core.is_waiting(job, request_id):
                continue
            del self.open[request_id]
            if job in state.jobs:
                assert request_id in state.aborted_requests, (request_id, state)

    @invariant()
    def legacy_grants_follow_arrival_order(self) -> None:
        if self.version == RULES_LEGACY:
            assert self.tickets == sorted(self.tickets)

    @invariant()
    def state_round_trips_through_its_schema(self) -> None:
        state = self.core.state
        assert GroupState.model_validate_json(state.model_dump_json()) == state

    def teardown(self) -> None:
        """Unpaused, with every holder yielding and every switch going
        through, every request still waiting is granted in the end."""
        if not self.open:
            return
        self.message(ev.Pause(False), 0.0)
        for _ in range(300):
            state = self.core.state
            if self.attempt is not None:
                self.report_attempt("", [], [], 0.0)
            elif self.pause_until is not None:
                self.end_pause()
            elif state.turn is not None:
                self.holder_yields(False, 0.0)
            elif state.queue:
                for job in state.jobs:
                    self.message(ev.Heartbeat(job, token(job)), 0.0)
                self.time_passes(1.0)
            else:
                break
            self.no_waiter_is_lost()
        self.no_waiter_is_lost()
        assert not self.open, f"requests wait for ever: {self.open}, {self.core.state}"


TestGroupMachine = GroupMachine.TestCase
TestGroupMachine.settings = settings(max_examples=400, stateful_step_count=50, deadline=None)
