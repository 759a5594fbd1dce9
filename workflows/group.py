"""GroupWorkflow: one durable lock queue per group of jobs sharing GPUs.

A thin adapter around the scheduling core (timeshare.scheduling.GroupCore):
each update, timer and switch outcome becomes an event handed to the core
with workflow time, and the workflow carries out the commands it returns, all
in one place (``_carry_out``): the answers to updates, the switch activities
(one per node, in parallel, on each node's task queue), the releases of jobs
that left, the pause between failed attempts, when to look again,
continue-as-new. It decides nothing itself.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine, Iterator
from contextlib import contextmanager, suppress
from datetime import timedelta
from typing import Any, assert_never

from pydantic import BaseModel
from temporalio import workflow
from temporalio.exceptions import ApplicationError

with workflow.unsafe.imports_passed_through():
    from timeshare.history import GroupHistory
    from timeshare.models import (
        AcquireResult,
        Grant,
        GroupPolicy,
        GroupStatus,
        HeartbeatOutput,
        JobToken,
        JoinOutput,
        KeepTurnOutput,
        PublishedTurn,
        TokenCheck,
        YieldOutput,
    )
    from timeshare.refusals import Refusal
    from timeshare.scheduling import commands as cmd
    from timeshare.scheduling import events as ev
    from timeshare.scheduling import versions
    from timeshare.scheduling.base import QueueError
    from timeshare.scheduling.group_core import GroupCore
    from timeshare.scheduling.healing import HealInput
    from timeshare.scheduling.state import GroupState, StoredPolicy, SwitchPlan
    from timeshare.scheduling.watch import TurnAsk
    from timeshare.workflows import node_calls
    from timeshare.workflows.patches import newest_granted
    from timeshare.workflows.visibility import GroupVisibility

# An acquire waits inside one update at most this long, then returns "still
# waiting" and the gateway asks again: no update stays open for long, so the
# workflow can continue as new while jobs wait.
ACQUIRE_WAIT_SLICE_SECONDS = 60.0
# A switch is not shown as `switching` outside the workflow (search
# attributes) where the group's last one was over within this: it would be
# over before anyone could look. Slower switches, and every retry, are shown.
QUICK_SWITCH_SECONDS = 1.0


class GroupInput(BaseModel):
    group: str
    # Applied when the group is created; a running group keeps its own.
    policy: GroupPolicy | None = None
    # Set when the workflow continues as new; a new group starts empty.
    state: GroupState | None = None
    # Set where the scheduler's healer started this run after the last one
    # kept failing its workflow task: how ``state`` is brought up to date.
    heal: HealInput | None = None


@workflow.defn(name="GroupWorkflow")
class GroupWorkflow:
    @workflow.init
    def __init__(self, input: GroupInput) -> None:
        state = input.state or GroupState(
            group=input.group,
            policy=StoredPolicy.stored(input.policy or GroupPolicy()),
            rules=_rules_of_a_new_group(),
        )
        workflow.deprecate_patch(versions.LEASE_FROM_GRANT)
        self._core = GroupCore(state)
        # The core's latest word on when to look again, and whether a look is
        # due now (the main loop's wait ends).
        self._wake = cmd.Wake(at=None)
        self._tick_due = False
        # The answer of the message being handled (carried out as a Reply).
        self._reply: Any = None
        # Set just before continuing as new: waiting acquires return "ask again".
        self._closing = False
        self._visibility = GroupVisibility(_visibility_of_this_run())
        workflow.deprecate_patch(versions.STEADY_TIMER)
        # The one timer: when it rings, and whether it has.
        self._timer: asyncio.Task[None] | None = None
        self._timer_at = 0.0
        self._rang = False
        # Each waiting acquire's (job, request id, when its wait slice ends), by update id.
        self._slice_ends: dict[str, tuple[str, str, float]] = {}
        self._release_tasks: set[asyncio.Task[None]] = set()
        # Workflow time, in nanoseconds and as _now() gives it, at the last call.
        self._now_ns = -1
        self._now_seconds = 0.0
        if input.heal is not None:
            # Before any message of this first task is checked or handled.
            self._carry_out_now(self._core.handle(ev.Healed(input.heal), self._now()))

    @workflow.run
    async def run(self, input: GroupInput) -> None:
        commands = self._core.handle(ev.RunStarted(), self._now())
        while True:
            await self._carry_out_all(commands)
            self._publish()
            # The core's word at the end of its look stands: it has seen what
            # the messages handled meanwhile changed.
            self._tick_due = self._wake.at_once
            wake = [] if self._wake.at is None else [self._wake.at]
            self._arm(min([*self._slice_wakes(), *wake], default=None))
            await workflow.wait_condition(
                lambda: self._tick_due or self._rang or _continue_as_new_suggested()
            )
            commands = self._core.handle(ev.Tick(_continue_as_new_suggested()), self._now())

    # -- the one executor of the core's commands -------------------------------------

    def _carry_out(self, command: cmd.Command) -> Coroutine[Any, Any, list[cmd.Command]] | None:
        """Carry out one command; where it takes time (a switch attempt, a
        pause, continuing as new), what to await: the commands that follow."""
        match command:
            case cmd.Reply(value=value):
                self._reply = value
            case cmd.Log(message=message, warning=warning):
                log = workflow.logger.warning if warning else workflow.logger.info
                log("group %s: %s", self._core.state.group, message)
            case cmd.MarkPatch(patch=patch):
                workflow.deprecate_patch(patch)
            case cmd.StartReleases(releases=releases):
                self._start_releases(releases)
            case cmd.Wake(at_once=at_once):
                self._wake = command
                self._tick_due = self._tick_due or at_once
            case cmd.AttemptSwitch(plan=plan):
                return self._attempt(plan)
            case cmd.PauseSwitch(seconds=seconds):
                return self._pause_switch(seconds)
            case cmd.ContinueAsNew():
                return self._continue_as_new()
            case _:
                assert_never(command)
        return None

    async def _carry_out_all(self, commands: list[cmd.Command]) -> None:
        """In order, each awaited one's own commands next."""
        work = list(commands)
        while work:
            follow = self._carry_out(work.pop(0))
            if follow is not None:
                work[:0] = await follow

    def _carry_out_now(self, commands: list[cmd.Command]) -> None:
        """A message's commands, or a release's: none of them takes time."""
        for command in commands:
            follow = self._carry_out(command)
            if follow is not None:
                follow.close()
                raise RuntimeError(f"the scheduling core asked a message to wait: {command}")

    # -- the one timer --------------------------------------------------------------

    def _slice_wakes(self) -> list[float]:
        """When the wait slices the main loop's timer must end do end."""
        slices = self._slice_ends.values()
        waiting = [
            ends for job, request_id, ends in slices if self._core.is_waiting(job, request_id)
        ]
        # Asked only where a slice has settled: elsewhere both rules agree.
        if len(waiting) < len(slices) and workflow.patched(versions.SETTLED_SLICES):
            return waiting
        return [ends for _, _, ends in slices]

    def _arm(self, deadline: float | None) -> None:
        """Keep the timer that rings first at or before ``deadline``; a timer
        that rings early only makes the loop look again."""
        running = self._timer is not None and not self._timer.done()
        if not running:
            self._rang = False
        if deadline is None or (running and self._timer_at <= deadline):
            return
        if self._timer is not None and running:
            self._timer.cancel()
        self._timer_at = deadline
        self._timer = asyncio.get_running_loop().create_task(self._ring(deadline))

    async def _ring(self, at: float) -> None:
        await workflow.sleep(timedelta(seconds=max(0.001, at - self._now())))
        self._rang = True

    # -- what the core asks for ---------------------------------------------------

    def _start_releases(self, releases: tuple[cmd.Release, ...]) -> None:
        """In the background: a node that is down must not hold up the queue."""
        workflow.deprecate_patch(versions.RELEASE_LEFT_JOBS)
        for release in releases:
            task = asyncio.create_task(self._release(release))
            self._release_tasks.add(task)
            task.add_done_callback(self._release_tasks.discard)

    async def _release(self, release: cmd.Release) -> None:
        try:
            await node_calls.release(self._core.state, release)
        finally:
            # A run torn down (evicted from the worker's cache) closes this
            # coroutine outside the workflow, where no workflow API answers and
            # nothing is left to record.
            if workflow.in_workflow():
                ended = ev.ReleaseEnded(*release)
                self._carry_out_now(self._core.handle(ended, self._now()))

    async def _attempt(self, plan: SwitchPlan) -> list[cmd.Command]:
        """One attempt of a planned switch; what the core makes of its outcome.
        A first attempt is not shown where the group's switches are quick: it
        would be over before anyone could look."""
        quiet = plan.attempts == 0 and self._core.switches_are_quick(QUICK_SWITCH_SECONDS)
        if not quiet:
            self._publish()
        outcome = await node_calls.attempt(self._core.state, plan)
        return self._core.handle(outcome, self._now())

    async def _pause_switch(self, seconds: float) -> list[cmd.Command]:
        with suppress(TimeoutError):
            await workflow.wait_condition(
                lambda: not self._core.switch_plan_stands(), timeout=timedelta(seconds=seconds)
            )
        return self._core.handle(ev.SwitchPaused(), self._now())

    async def _continue_as_new(self) -> list[cmd.Command]:
        self._closing = True
        # Waiting acquires return "ask again" and the gateway re-sends them to
        # the new run, where their place in the queue is carried over.
        await workflow.wait_condition(workflow.all_handlers_finished)
        state = self._core.state
        state.runs += 1
        workflow.continue_as_new(GroupInput(group=state.group, state=state))

    def _now(self) -> float:
        """Workflow time as ``workflow.now().timestamp()`` gives it (to the
        microsecond). It moves only between activations, and a hand-over asks
        for it a score of times: made once per activation."""
        ns = workflow.time_ns()
        if ns != self._now_ns:
            self._now_ns, self._now_seconds = ns, workflow.now().timestamp()
        return self._now_seconds

    def _publish(self) -> None:
        self._visibility.publish(self._core.summary(self._now()), self._core.decides_by_policies)

    # -- messages: each an event for the core -------------------------------------------

    @contextmanager
    def _handling(self, message: str) -> Iterator[None]:
        """Turn every failure of a message into a typed, non-retryable
        rejection of that message alone, with the state as it was before it
        (the core keeps no change of a handler that raised). An exception
        that escaped a handler would instead fail the workflow task again
        and again, and the whole group would stop."""
        try:
            yield
        except ApplicationError:
            raise  # a rejection the handler chose, with the state it meant to leave
        except QueueError as refusal:
            details = [refusal.details] if refusal.details else []
            raise ApplicationError(
                refusal.message, *details, type=refusal.code, non_retryable=True
            ) from None
        except Exception as bug:
            workflow.logger.exception(
                "group %s: %s failed (state unchanged)", self._core.state.group, message
            )
            raise ApplicationError(
                f"the scheduler could not handle {message}: {type(bug).__name__}: {bug}; "
                "the group is as it was before it (see the scheduler's log)",
                type=Refusal.INTERNAL,
                non_retryable=True,
            ) from None

    def _answer(self, message: str, event: ev.Event) -> Any:
        """Hand the event to the core; its reply."""
        with self._handling(message):
            commands = self._core.handle(event, self._now())
        self._reply = None
        self._carry_out_now(commands)
        return self._reply

    def _check(self, message: str, event: ev.Message) -> None:
        with self._handling(message):
            self._core.check(event)

    @workflow.update
    def join(self, input: ev.Join) -> JoinOutput:
        output: JoinOutput = self._answer("join", input)
        return output

    @join.validator
    def _check_join(self, input: ev.Join) -> None:
        self._check("join", input)

    @workflow.update
    async def acquire(self, input: ev.Acquire) -> AcquireResult:
        job, request_id = input.job, input.request_id
        asked: AcquireResult = self._answer("acquire", input)
        if asked.grant is not None:
            return asked
        final = 0 < input.timeout_seconds <= ACQUIRE_WAIT_SLICE_SECONDS
        wait = input.timeout_seconds if final else ACQUIRE_WAIT_SLICE_SECONDS
        try:
            await self._wait_slice(job, request_id, wait)
        except TimeoutError:
            timed_out = ev.AcquireTimedOut(job=job, request_id=request_id, call_id=input.call_id)
            if final and self._answer("acquire timeout", timed_out):
                raise ApplicationError(
                    f"job {job!r} was not granted within its timeout",
                    type=Refusal.DEADLINE_EXCEEDED,
                    non_retryable=True,
                ) from None
        with self._handling("acquire"):
            grant = self._core.answer(job, request_id)
        return AcquireResult(grant=grant, yielded=asked.yielded, published=self._published(grant))

    def _published(self, grant: Grant | None) -> PublishedTurn | None:
        """What the group published with ``grant``, where its last publish shows
        that turn: a waiter's grant was made in a task that ended in a publish
        before this handler went on. A run of the legacy visibility publishes
        no record."""
        shown = self._visibility.shown
        if grant is None or shown is None or self._visibility.version < versions.VISIBILITY_RECORD:
            return None
        if (shown.holder, shown.holder_epoch) != (grant.job, grant.told_epoch):
            return None
        return PublishedTurn(waiting=len(shown.queue), record=shown.watch)

    async def _wait_slice(self, job: str, request_id: str, seconds: float) -> None:
        """Until the request is no longer waiting (or the run closes); raises
        TimeoutError after ``seconds``. The main loop's timer ends the slice."""

        def over() -> bool:
            return self._closing or not self._core.is_waiting(job, request_id)

        workflow.deprecate_patch(versions.SLICE_BY_MAIN_TIMER)
        update = workflow.current_update_info()
        key = update.id if update is not None else f"{job}/{request_id}"
        ends = self._now() + seconds
        self._slice_ends[key] = (job, request_id, ends)
        self._tick_due = True  # the main loop arms its timer for the slice too
        try:
            await workflow.wait_condition(lambda: over() or self._now() >= ends)
        finally:
            del self._slice_ends[key]
        if not over():
            raise TimeoutError

    @acquire.validator
    def _check_acquire(self, input: ev.Acquire) -> None:
        self._check("acquire", input)

    @workflow.update
    def keep_turn(self, input: ev.KeepTurn) -> KeepTurnOutput:
        """The holder goes on into its next phase (Job.next_turn_nowait). An
        update of its own, not a flag on acquire: a scheduler from before it
        refuses it as unknown instead of passing the turn on while the job
        computes."""
        output: KeepTurnOutput = self._answer("keep_turn", input)
        return output

    @keep_turn.validator
    def _check_keep_turn(self, input: ev.KeepTurn) -> None:
        self._check("keep_turn", input)

    @workflow.update
    def cancel_acquire(self, input: ev.CancelAcquire) -> bool:
        return bool(self._answer("cancel_acquire", input))

    @cancel_acquire.validator
    def _check_cancel(self, input: ev.CancelAcquire) -> None:
        self._check("cancel_acquire", input)

    @workflow.update(name="yield")
    def yield_turn(self, input: ev.Yield) -> YieldOutput:
        output: YieldOutput = self._answer("yield", input)
        return output

    @yield_turn.validator
    def _check_yield(self, input: ev.Yield) -> None:
        self._check("yield", input)

    @workflow.update
    def heartbeat(self, input: ev.Heartbeat) -> HeartbeatOutput:
        output: HeartbeatOutput = self._answer("heartbeat", input)
        return output

    @heartbeat.validator
    def _check_heartbeat(self, input: ev.Heartbeat) -> None:
        self._check("heartbeat", input)

    @workflow.update
    def leave(self, input: ev.Leave) -> None:
        self._answer("leave", input)

    @leave.validator
    def _check_leave(self, input: ev.Leave) -> None:
        self._check("leave", input)

    @workflow.update
    async def watch_turn(self, input: TurnAsk) -> None:
        """Until the group says something new to the holder of the turn
        watched (asks it to yield, others wait, the turn ends), or the run closes:
        completed in the workflow task that decided it, so the holder's
        gateway hears it without polling (workers/gateway/turn_push.py)."""
        await workflow.wait_condition(lambda: self._closing or self._turn_news(input))

    @watch_turn.validator
    def _check_watch_turn(self, input: TurnAsk) -> None:
        """Refused, leaving no event, where there is news already."""
        if self._turn_news(input):
            raise ApplicationError(
                f"the group has news for {input.job!r}'s turn of epoch {input.epoch}: read it",
                type=Refusal.FAILED_PRECONDITION,
                non_retryable=True,
            )

    def _turn_news(self, ask: TurnAsk) -> bool:
        shown = self._visibility.shown
        if shown is None:
            return True
        return ask.news(shown.watch, shown.holder, shown.holder_epoch, len(shown.queue))

    # -- operator controls --------------------------------------------------------

    @workflow.update
    def evict(self, input: ev.Evict) -> bool:
        return bool(self._answer("evict", input))

    @workflow.update
    def pause(self, input: ev.Pause) -> GroupStatus:
        status: GroupStatus = self._answer("pause", input)
        return status

    @workflow.update
    def drain(self, input: ev.Drain) -> GroupStatus:
        status: GroupStatus = self._answer("drain", input)
        return status

    def durable_state(self) -> GroupState:
        """The state as the last activation left it: what the scheduler's
        healer rebuilds a stuck group from (workers/scheduler/healing/)."""
        return self._core.state

    @workflow.query
    def status(self) -> GroupStatus:
        return self._core.status(self._now())

    @workflow.query
    def history(self) -> GroupHistory:
        return self._core.history(self._now())

    @workflow.query
    def token_matches(self, input: JobToken) -> TokenCheck:
        """Whether ``input.token_hash`` is the job's: node agents ask before a
        process joins the job's switches. A query, so it adds nothing to the
        history and changes nothing; hashes only, like every other message."""
        return self._core.token_check(input.job, input.token_hash)


def _continue_as_new_suggested() -> bool:
    """Temporal finds the history long: the core decides whether to continue as new."""
    return workflow.info().is_continue_as_new_suggested()


def _visibility_of_this_run() -> int:
    """What this run publishes outside (versions.VISIBILITY), asked of
    Temporal when it starts: a run that began before the record replays on
    the legacy path until it continues as new."""
    version = newest_granted(versions.VISIBILITY_LEGACY, versions.visibility_patches())
    if version == versions.VISIBILITY_LEGACY:
        # Asked where the run's visibility was chosen, before the record.
        workflow.deprecate_patch(versions.LEAN_SEARCH_ATTRIBUTES)
    return version


def _rules_of_a_new_group() -> int:
    """The rules a group decides by for as long as it runs: the newest this
    scheduler knows, asked of Temporal so that a group created by an older
    scheduler replays with the rules it was created with."""
    return rules_created_with(workflow.patched)


def rules_created_with(patched: Callable[[str], bool]) -> int:
    """The rules of a group created where ``patched`` says which patches
    hold: Temporal's answer in the workflow, the markers of a history in
    the scheduler's healer."""
    return newest_granted(versions.RULES_LEGACY, versions.rules_patches(), patched)
