"""GroupCore: one group's scheduling core, as typed events in and commands
out (after dask's worker state machine). The group workflow turns each
message, timer and switch outcome into an event, hands it to ``handle`` with
the workflow's time, and carries out the commands in order; every decision,
switch failures included (retry, back-off, eviction, giving up), is made
here and tested without Temporal. ``handle`` is the only way to change a
group: every other method reads its state (status, whether a plan still
stands, a waiting acquire's answer) and decides nothing. The core also says
when the group must next look at itself (Wake), and which releases to start
(StartReleases): the workflow polls for neither."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from timeshare.history import GroupHistory
from timeshare.models import (
    AcquireResult,
    FailureKind,
    Grant,
    GroupStatus,
    JoinOutput,
    KeepTurnOutput,
    TokenCheck,
    YieldOutput,
    check_phase,
)
from timeshare.refusals import Refusal
from timeshare.scheduling import (
    deadlines,
    healing,
    membership,
    moves,
    prefetch,
    reporting,
    switch_costs,
    switch_failures,
    switching,
    turns,
)
from timeshare.scheduling import events as ev
from timeshare.scheduling.base import Group, QueueError, decides_by_policies
from timeshare.scheduling.commands import (
    AttemptSwitch,
    Command,
    ContinueAsNew,
    Log,
    MarkPatch,
    PauseSwitch,
    Release,
    Reply,
    StartReleases,
    Wake,
)
from timeshare.scheduling.draft import draft
from timeshare.scheduling.reporting import GroupSummary
from timeshare.scheduling.state import GroupState, SwitchPlan
from timeshare.scheduling.switch_failures import FailedMove
from timeshare.scheduling.versions import (
    EVICT_FAILED_JOBS,
    EVICT_FAILING_HOOKS,
    PREFETCH,
    RELEASE_PER_MEMBERSHIP,
    WHOLE_JOBS,
)

# A plan failing this many times is set aside and planned afresh.
SWITCH_PLAN_ATTEMPTS = 5


class GroupCore:
    def __init__(self, state: GroupState) -> None:
        self.group = Group.of(state)
        self._grants_at_start = state.grants
        # Releases commanded in this run that have not ended: a new run
        # (continue-as-new) commands again the ones its state carries.
        self._releases_started: set[Release] = set()
        self._handlers: dict[type[Any], Callable[[Any, float], list[Command]]] = {
            ev.Join: self._join,
            ev.Acquire: self._acquire,
            ev.AcquireTimedOut: self._acquire_timed_out,
            ev.CancelAcquire: self._cancel,
            ev.Yield: self._yield,
            ev.KeepTurn: self._keep_turn,
            ev.Heartbeat: self._heartbeat,
            ev.Leave: self._leave,
            ev.Evict: self._evict,
            ev.Pause: self._pause,
            ev.Drain: self._drain,
            ev.RunStarted: self._run_started,
            ev.Healed: self._healed,
            ev.Tick: self._tick,
            ev.SwitchAttempted: self._switch_attempted,
            ev.SwitchPaused: self._switch_paused,
            ev.ReleaseEnded: self._release_ended,
        }

    @property
    def state(self) -> GroupState:
        return self.group.state

    @property
    def decides_by_policies(self) -> bool:
        return decides_by_policies(self.state)

    def handle(self, event: ev.Event, now: float) -> list[Command]:
        """Apply the event at time ``now``; what to do about it, in order.
        The handler computes on a draft of the state, which becomes the
        state only when the handler returns: a message the group refuses
        (QueueError), or a handler that fails, leaves the group exactly as
        it was."""
        group, state = self.group, self.group.state
        clock, releases = group.clock, set(self._releases_started)
        group.state = draft(state)
        try:
            return self._handlers[type(event)](event, now)
        except BaseException:
            group.state, group.clock = state, clock
            self._releases_started = releases
            raise

    def check(self, message: ev.Message) -> None:
        """Refuse a message before it is handled (QueueError), changing nothing."""
        state = self.state
        match message:
            case ev.Join(job=job, nodes=nodes, backfill=backfill):
                membership.check_join(state, job, nodes, backfill)
            case ev.Leave(job=job, token_hash=token_hash):
                # Leaving is idempotent: a job already gone is fine.
                if job in state.jobs:
                    membership.authenticate(state, job, token_hash)
            case ev.Acquire() | ev.KeepTurn() | ev.Yield() | ev.CancelAcquire() | ev.Heartbeat():
                membership.authenticate(state, message.job, message.token_hash)
                if isinstance(message, ev.Acquire):
                    if message.yield_epoch:
                        turns.check_yield(state, message.job, message.yield_epoch)
                    turns.check_acquire(state, message.job, message.request_id, message.yield_epoch)
                if isinstance(message, ev.KeepTurn | ev.Yield):
                    turns.check_yield(state, message.job, message.epoch)
                if isinstance(message, ev.Acquire | ev.KeepTurn):
                    _check_phase(message.phase)

    # -- messages -----------------------------------------------------------------

    def _join(self, event: ev.Join, now: float) -> list[Command]:
        created = membership.join(
            self.group,
            event.job,
            event.nodes,
            event.token_hash,
            now,
            event.weight,
            event.priority,
            event.backfill,
        )
        policy = self.state.policy
        output = JoinOutput(
            created=created,
            nodes=event.nodes,
            lease_seconds=policy.lease_seconds,
            # 0 tells the client to heartbeat as for the older rules.
            idle_lease_seconds=policy.idle_lease if self.decides_by_policies else 0.0,
        )
        return self._answered(output, now)

    def _acquire(self, event: ev.Acquire, now: float) -> list[Command]:
        job = event.job
        # Given back by this message, not by an earlier one of the same request.
        given_back = event.yield_epoch and self.state.yielded.get(job) != event.yield_epoch
        yielded = self._give_back(job, event.yield_epoch, now, True) if given_back else None
        grant = turns.request(
            self.group, job, event.request_id, now, event.call_id, event.trace_context, event.phase
        )
        result = AcquireResult(grant=grant.as_grant() if grant else None, yielded=yielded)
        return self._answered(result, now)

    def _acquire_timed_out(self, event: ev.AcquireTimedOut, now: float) -> list[Command]:
        cancelled = turns.cancel(self.group, event.job, event.request_id, now, event.call_id)
        return self._answered(cancelled, now, changed=cancelled)

    def _cancel(self, event: ev.CancelAcquire, now: float) -> list[Command]:
        cancelled = turns.cancel(self.group, event.job, event.request_id, now, event.call_id)
        return self._answered(cancelled, now)

    def _yield(self, event: ev.Yield, now: float) -> list[Command]:
        return self._answered(self._give_back(event.job, event.epoch, now), now)

    def _give_back(self, job: str, epoch: int, now: float, asks_again: bool = False) -> YieldOutput:
        turn = self.state.turn
        holding = turn is not None and turn.job == job
        phase = turn.phase if turn is not None and holding else ""
        # Only a backfill holder's lag is learned (and only where costs are weighed).
        lag_learned = holding and switch_costs.learns_yield_lag(self.state, job)
        asked = deadlines.yield_asked_at(self.state, now) if lag_learned else None
        held = turns.yield_turn(self.group, job, epoch, now, asks_again)
        if asked is not None:
            switch_costs.learn_yield_lag(self.state, job, now - asked)
        return YieldOutput(held_seconds=held, phase=phase)

    def _keep_turn(self, event: ev.KeepTurn, now: float) -> list[Command]:
        turn = self.state.turn
        ended = turn.phase if turn is not None else ""
        asked, held = turns.keep_turn(self.group, event.job, event.epoch, event.phase, now)
        turn = self.state.turn
        assert turn is not None
        output = KeepTurnOutput(
            grant=turn.as_grant(),
            asked_to_yield=asked,
            ended=YieldOutput(held_seconds=held, phase=ended),
        )
        return self._answered(output, now)

    def _heartbeat(self, event: ev.Heartbeat, now: float) -> list[Command]:
        # A heartbeat moves the lease deadline later, never earlier: the
        # group's timer need not be reset for it.
        return self._answered(deadlines.heartbeat(self.state, event.job, now), now, changed=False)

    def _leave(self, event: ev.Leave, now: float) -> list[Command]:
        membership.leave(self.group, event.job, now)
        return self._answered(None, now)

    def _evict(self, event: ev.Evict, now: float) -> list[Command]:
        return self._answered(membership.evict(self.group, event.job, event.reason, now), now)

    def _pause(self, event: ev.Pause, now: float) -> list[Command]:
        turns.pause(self.group, event.paused, now)
        return self._answered(self._status(), now)

    def _drain(self, event: ev.Drain, now: float) -> list[Command]:
        turns.drain(self.group, event.node, event.drained, now)
        return self._answered(self._status(), now)

    def _answered(self, value: object, now: float, changed: bool = True) -> list[Command]:
        """The reply, and when to look again: at once where the message
        changed the state (a heartbeat only moves a lease later: the timer
        that rings early only looks again)."""
        return [Reply(value), self._wake(now, at_once=changed)]

    # -- the group looks at itself -----------------------------------------------

    def _run_started(self, event: ev.RunStarted, now: float) -> list[Command]:
        return self._settled(now)

    def _healed(self, event: ev.Healed, now: float) -> list[Command]:
        return [Log(healing.heal(self.group, event.rebuild, now), warning=True)]

    def _tick(self, event: ev.Tick, now: float) -> list[Command]:
        """Leases and turn limits first; then continue as new, or switch to
        the next waiter, or bring the job expected next in ahead of it."""
        commands: list[Command] = [Log(done) for done in deadlines.expire(self.group, now)]
        if self._continue_as_new_due(event.continue_as_new_suggested):
            return [*commands, ContinueAsNew()]
        if moves.needs_switch(self.state, now):
            plan = switching.begin_switch(self.group, now)
            return [*commands, MarkPatch(WHOLE_JOBS), AttemptSwitch(plan)]
        choice = prefetch.prefetch_choice(self.state, now)
        if choice is None:
            return [*commands, *self._settled(now)]
        plan = prefetch.begin_prefetch(self.group, choice.job, now)
        patches = [MarkPatch(patch) for patch in (*choice.patches, PREFETCH, WHOLE_JOBS)]
        return [*commands, *patches, AttemptSwitch(plan)]

    def _switch_attempted(self, event: ev.SwitchAttempted, now: float) -> list[Command]:
        """Evict the jobs a node found lost for good, or whose own hooks fail;
        then, if every node went through, grant; else decide what follows."""
        group, commands = self.group, list[Command]()
        switching.record_switches(group.state, event.records)
        lost = sorted({f.job for f in event.failed if f.kind == FailureKind.JOB_FAILED})
        if lost:
            commands.append(MarkPatch(EVICT_FAILED_JOBS))
            for job in lost:
                cause = _causes(event.failed, job, FailureKind.JOB_FAILED, nodes=False)
                membership.evict_failed(group, job, cause, now)
            commands += self._start_releases()
        hooks = sorted({f.job for f in event.failed if f.kind == FailureKind.HOOK})
        if hooks:
            commands.append(MarkPatch(EVICT_FAILING_HOOKS))
            for job in hooks:
                cause = _causes(event.failed, job, FailureKind.HOOK, nodes=True)
                commands.append(Log(f"evicting job {job}, whose workload hooks failed: {cause}"))
                membership.evict_failed(group, job, f"its workload hooks failed: {cause}", now)
            commands += self._start_releases()
        if not event.failed:
            for node in event.done:
                for job in node.gone:
                    reason = f"its processes on node {node.node} have exited"
                    membership.evict(group, job, reason, now)
            switching.finish_switch(group, now, any(node.restored for node in event.done))
            return [*commands, *self._settled(now)]
        plan = moves.current_plan(group.state)
        causes = "; ".join(f"node {f.node}: {f.cause}" for f in event.failed)
        commands.append(Log(f"switch to {plan.waiter.job} failed: {causes}", warning=True))
        verdict = switch_failures.switch_failed(
            group,
            [_failed_move(f) for f in event.failed],
            done=[node.node for node in event.done],
            # A quiesce that failed moved nothing: the nodes hold what they held.
            failed=[f.node for f in event.failed] if event.moved else [],
            now=now,
        )
        if verdict.given_up:
            return [*commands, *self._settled(now)]
        if verdict.evicted:
            return [*commands, *self._start_releases(), AttemptSwitch(plan)]
        return [*commands, PauseSwitch(verdict.pause)]

    def _switch_paused(self, event: ev.SwitchPaused, now: float) -> list[Command]:
        group = self.group
        # Leases run out during a long outage too.
        deadlines.expire(group, now)
        if not switching.switch_target_waits(group.state):
            # Nobody waits for this switch any more; the next plan starts
            # from what each node reported.
            switching.abort_switch(group, "", now)
            return self._settled(now)
        plan = moves.current_plan(group.state)
        if not self.switch_plan_stands() or plan.attempts >= SWITCH_PLAN_ATTEMPTS:
            # Paused, drained, or failing for long: step out of the switch so
            # that the group can pause, continue as new or plan afresh.
            switching.set_switch_aside(group, now)
            return self._settled(now)
        return [AttemptSwitch(plan)]

    def _release_ended(self, event: ev.ReleaseEnded, now: float) -> list[Command]:
        self._releases_started.discard(Release(event.job, event.node, event.incarnation))
        if event.job not in self.state.jobs:
            membership.release_done(self.state, event.job, event.node, event.incarnation)
        return [self._wake(now)]

    # -- what follows ---------------------------------------------------------------

    def _settled(self, now: float) -> list[Command]:
        """The end of the group's look at itself (a switch under way included):
        releases of jobs that left start; when to look again."""
        return [*self._start_releases(), self._wake(now)]

    def _start_releases(self) -> list[Command]:
        pending = self._releases_to_start()
        under_way = {(r.job, r.node) for r in self._releases_started}
        again = any((r.job, r.node) in under_way for r in pending)
        self._releases_started.update(pending)
        marks: list[Command] = [MarkPatch(RELEASE_PER_MEMBERSHIP)] if again else []
        return [*marks, StartReleases(pending)] if pending else []

    def _releases_to_start(self) -> tuple[Release, ...]:
        """Every node whose agent has yet to release a job that left, and has
        not been asked to in this run (for that incarnation of the job: one
        that joined and left again while its last release was under way is
        released again)."""
        releasing = self.state.releasing_incarnation
        wanted = (
            Release(job, node, releasing.get(job, 0))
            for job, nodes in self.state.releasing.items()
            for node in nodes
        )
        return tuple(release for release in wanted if release not in self._releases_started)

    def _wake(self, now: float, at_once: bool = False) -> Wake:
        return Wake(
            at=deadlines.next_deadline(self.state, now), at_once=at_once or self._duty_due(now)
        )

    def _duty_due(self, now: float) -> bool:
        """A switch, continue-as-new (by the policy's count) or a release waits
        for the group to look at itself."""
        return (
            moves.needs_switch(self.state, now)
            or self._continue_as_new_due(suggested=False)
            or bool(self._releases_to_start())
        )

    def _continue_as_new_due(self, suggested: bool) -> bool:
        """Temporal suggests it or the policy's count of grants is reached,
        and no switch is under way (it would be cut in two)."""
        if self.state.switching is not None:
            return False
        every = self.state.policy.continue_as_new_every
        grants_this_run = self.state.grants - self._grants_at_start
        return suggested or (every > 0 and grants_this_run >= every)

    # -- questions ------------------------------------------------------------------

    def switch_plan_stands(self) -> bool:
        """Whether the switch under way would still be planned, the waiters
        ordered as at the latest time a grant was considered."""
        return switching.switch_plan_stands(self.state, self.group.clock)

    def switches_are_quick(self, seconds: float) -> bool:
        return switching.switches_are_quick(self.state, seconds)

    def is_waiting(self, job: str, request_id: str) -> bool:
        return turns.is_waiting(self.state, job, request_id)

    def answer(self, job: str, request_id: str) -> Grant | None:
        """A waiting acquire's answer: its grant, None while it still waits;
        QueueError (ABORTED) if it was ended, saying why."""
        grant = turns.grant_for(self.state, job, request_id)
        if grant is not None:
            return grant.as_grant()
        if turns.is_waiting(self.state, job, request_id):
            return None
        turns.raise_if_aborted(self.state, request_id)
        raise QueueError(Refusal.ABORTED, f"job {job!r} left the group before its turn came")

    def evicted_reason(self, job: str) -> str:
        return self.state.evicted_jobs.get(job, "")

    def status(self, now: float) -> GroupStatus:
        return reporting.status(self.state, now)

    def _status(self) -> GroupStatus:
        """The status as of the latest time a grant was considered (an
        operator's pause or drain is answered with it)."""
        return reporting.status(self.state, self.group.clock)

    def history(self, now: float) -> GroupHistory:
        return reporting.history(self.state, now)

    def summary(self, now: float) -> GroupSummary:
        return reporting.summary(self.state, now)

    def token_check(self, job: str, token_hash: str) -> TokenCheck:
        member = job in self.state.jobs
        try:
            membership.authenticate(self.state, job, token_hash)
        except QueueError as refusal:
            return TokenCheck(matches=False, reason=refusal.message, member=member)
        return TokenCheck(matches=True, member=member)

    def plan(self) -> SwitchPlan | None:
        return self.state.switching


def _causes(failed: list[ev.NodeFailed], job: str, kind: FailureKind, nodes: bool) -> str:
    return "; ".join(
        f"node {f.node}: {f.cause}" if nodes else f.cause
        for f in failed
        if f.job == job and f.kind == kind
    )


def _failed_move(failure: ev.NodeFailed) -> FailedMove:
    return FailedMove(
        node=failure.node,
        cause=failure.cause,
        stuck=failure.job if failure.kind == FailureKind.CHECKPOINT else "",
        restore_failed=failure.kind == FailureKind.RESTORE,
    )


def _check_phase(phase: str) -> None:
    try:
        check_phase(phase)
    except ValueError as error:
        raise QueueError(Refusal.INVALID_ARGUMENT, str(error)) from None
