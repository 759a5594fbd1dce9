"""GroupWorkflow: one durable lock queue per group of jobs sharing GPUs.

A thin shell around timeshare.workflows.lockqueue: handlers feed it messages stamped
with workflow time, a durable timer feeds it lease and turn-limit deadlines,
and the main loop carries out the switches it plans as one ``switch``
activity per node, in parallel, on each node's task queue.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta

from pydantic import BaseModel
from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError, ApplicationError
from temporalio.exceptions import TimeoutError as ActivityTimeoutError

with workflow.unsafe.imports_passed_through():
    from timeshare.history import GroupHistory
    from timeshare.models import (
        CHECKPOINT_FAILED,
        HOOK_FAILED,
        JOB_FAILED,
        RESTORE_FAILED,
        AcquireInput,
        AcquireResult,
        DrainInput,
        EvictInput,
        GroupPolicy,
        GroupStatus,
        HeartbeatOutput,
        JobInput,
        JoinInput,
        JoinOutput,
        KeepTurnInput,
        KeepTurnOutput,
        PauseInput,
        ReleaseInput,
        ReleaseOutput,
        SwitchInput,
        SwitchOutput,
        SwitchPhase,
        TokenCheck,
        YieldInput,
        YieldOutput,
        check_phase,
    )
    from timeshare.names import node_task_queue
    from timeshare.refusals import Refusal
    from timeshare.workflows.group_state import (
        RULES_ANTICIPATION,
        RULES_LEGACY,
        RULES_POLICIES,
        GroupState,
        StoredMove,
        StoredPolicy,
        StoredSwitch,
        SwitchPlan,
    )
    from timeshare.workflows.lockqueue import FailedMove, LockQueue, QueueError, Snapshot
    from timeshare.workflows.visibility import LEAN_PATCH, YIELD_EPOCH_MEMO, GroupVisibility

# An acquire waits inside one update at most this long, then returns "still
# waiting" and the gateway asks again: no update stays open for long, so the
# workflow can continue as new while jobs wait.
ACQUIRE_WAIT_SLICE_SECONDS = 60.0
# A plan failing this many times is set aside and planned afresh.
SWITCH_PLAN_ATTEMPTS = 5
# A switch activity is retried by Temporal this often before the workflow
# sees the failure, marks the group degraded and decides what to do.
SWITCH_ATTEMPTS = 3
# Plans of schedulers before this change neither stopped a job on all its
# nodes first nor evicted it from nodes the next job does not need.
WHOLE_JOBS_PATCH = "timeshare-whole-job-switch"
# Schedulers before these changes neither asked the agents to release the
# processes of a job that left, nor evicted a job whose CUDA state FAILED.
RELEASE_PATCH = "timeshare-release-left-jobs"
FAILED_JOBS_PATCH = "timeshare-evict-failed-jobs"
# Groups created from this change on decide by scheduling policies (fair
# share, priorities, leases only for a holder others wait for); older groups
# keep their rules (group_state.RULES_LEGACY) for as long as they run.
POLICIES_PATCH = "timeshare-scheduling-policies"
# Groups created from this change on hold the turn open for a yielder behind
# its fair share (group_state.RULES_ANTICIPATION); older groups never do.
ANTICIPATION_PATCH = "timeshare-fair-share-anticipation"
# One lease timer kept while the deadline it waits for is not later than the
# group's next one, instead of a timer started and cancelled by every message:
# two history events fewer per message.
STEADY_TIMER_PATCH = "timeshare-steady-timer"
# Schedulers before this change retried a switch whose checkpoint failed in a
# job's own workload hooks for as long as the hooks failed, and the whole
# group waited; from it on, that job is evicted once the switch activity's
# retries are spent, and the switch goes on without it.
HOOK_FAILURES_PATCH = "timeshare-evict-failing-hooks"
# From this change on, an idle group brings the job expected to ask next onto
# its nodes before it asks (GroupPolicy.prefetch); a group created before it
# replays with the policy's new default, so the patch, not the policy, decides.
PREFETCH_PATCH = "timeshare-prefetch"
# From this change on, a waiting acquire's slice ends by the main loop's one
# timer instead of a timer of its own: two history events (a start and a
# cancel) fewer per acquire that waits.
SLICE_BY_MAIN_TIMER_PATCH = "timeshare-slices-by-the-main-timer"
# From this change on, a job that left (or was evicted) no longer holds up
# the prefetch of the job expected next: its memory goes to that job at once,
# not when that job asks.
PREFETCH_PAST_DEPARTED_PATCH = "timeshare-prefetch-past-departed-jobs"
# From this change on, where nobody's next request can be told yet, an idle
# group brings in the job away the longest (LockQueue._longest_away).
PREFETCH_GUESS_PATCH = "timeshare-prefetch-the-job-away-longest"
# From this change on, a holder others wait for gets its whole lease from
# its grant: before it, a job granted after waiting behind a dead holder
# could be evicted a moment into its turn (LockQueue._lease_deadlines).
LEASE_FROM_GRANT_PATCH = "timeshare-lease-from-grant"
# From this change on, the main loop's timer is not armed for the wait slice
# of an acquire already granted (its handler has yet to resume, in the same
# workflow task): such a timer was started at every grant to an idle group,
# and cancelled when the next job asked.
SETTLED_SLICES_PATCH = "timeshare-no-timer-for-settled-slices"
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


class CancelAcquireInput(BaseModel):
    job: str
    token_hash: str
    request_id: str
    # Only the call now waiting for the request may withdraw it.
    call_id: str = ""


class MoveFailure(BaseModel):
    node: str
    cause: str
    restore_failed: bool
    # The job whose state the node found FAILED (terminal), if that was the cause.
    failed_job: str = ""
    # The job whose own workload hooks failed its checkpoint, if that was the cause.
    hook_job: str = ""
    # The job whose state the node could not move off (its lock or checkpoint failed).
    stuck_job: str = ""

    def as_failed_move(self) -> FailedMove:
        return FailedMove(
            node=self.node,
            cause=self.cause,
            stuck=self.stuck_job,
            restore_failed=self.restore_failed,
        )


@workflow.defn(name="GroupWorkflow")
class GroupWorkflow:
    @workflow.init
    def __init__(self, input: GroupInput) -> None:
        state = input.state or GroupState(
            group=input.group,
            policy=StoredPolicy.stored(input.policy or GroupPolicy()),
            rules=_rules_of_a_new_group(),
        )
        self._queue = LockQueue(state, lease_from_grant=workflow.patched(LEASE_FROM_GRANT_PATCH))
        self._grants_at_start = state.grants
        # Set by every message: the main loop re-reads deadlines and duties.
        self._changed = False
        # Set just before continuing as new: waiting acquires return "ask again".
        self._closing = False
        self._visibility = GroupVisibility(
            lean=workflow.patched(LEAN_PATCH),
            carried_yield_epoch=workflow.memo_value(YIELD_EPOCH_MEMO, 0, type_hint=int),
        )
        # The steady timer: when it rings, and whether it has.
        self._steady = workflow.patched(STEADY_TIMER_PATCH)
        self._timer: asyncio.Task[None] | None = None
        self._timer_at = 0.0
        self._rang = False
        # Each waiting acquire's (job, request id, when its wait slice ends), by update id.
        self._slice_ends: dict[str, tuple[str, str, float]] = {}
        # (job, node) releases under way in this run.
        self._releasing: set[tuple[str, str]] = set()
        self._release_tasks: set[asyncio.Task[None]] = set()
        # Workflow time, in nanoseconds and as _now() gives it, at the last call.
        self._now_ns = -1
        self._now_seconds = 0.0

    @workflow.run
    async def run(self, input: GroupInput) -> None:
        while True:
            self._release_left_jobs()
            self._publish()
            deadline = self._queue.next_deadline(self._now())
            self._changed = False
            if self._steady:
                wakes = [*self._slice_wakes(), *([] if deadline is None else [deadline])]
                self._arm(min(wakes, default=None))
                await workflow.wait_condition(
                    lambda: self._changed or self._duty_due() or self._rang
                )
            else:
                timeout = None
                if deadline is not None:
                    timeout = timedelta(seconds=max(0.001, deadline - self._now()))
                with contextlib.suppress(TimeoutError):
                    await workflow.wait_condition(
                        lambda: self._changed or self._duty_due(), timeout=timeout
                    )
            for event in self._queue.expire(self._now()):
                workflow.logger.info("group %s: %s", input.group, event)
            if self._continue_as_new_due():
                await self._continue_as_new(input.group)
            elif self._queue.needs_switch():
                await self._switch()
            else:
                target = self._prefetch_target()
                if target is not None and workflow.patched(PREFETCH_PATCH):
                    await self._switch(prefetch=target)

    def _prefetch_target(self) -> str | None:
        now = self._now()
        target = self._queue.prefetch_target(now)
        if target is None:
            return None
        # Each older rule is stricter: a patch is asked only where the rules
        # differ, so that histories from before each change replay as they ran.
        if self._queue.prefetch_target(now, guess_unknown=False) is None:
            return target if workflow.patched(PREFETCH_GUESS_PATCH) else None
        if self._queue.prefetch_target(now, departed_ask_never=False, guess_unknown=False):
            return target
        return target if workflow.patched(PREFETCH_PAST_DEPARTED_PATCH) else None

    def _slice_wakes(self) -> list[float]:
        """When the wait slices the main loop's timer must end do end."""
        slices = self._slice_ends.values()
        waiting = [
            ends for job, request_id, ends in slices if self._queue.is_waiting(job, request_id)
        ]
        # The patch is asked only where a slice has settled: elsewhere both agree.
        if len(waiting) < len(slices) and workflow.patched(SETTLED_SLICES_PATCH):
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

    def _duty_due(self) -> bool:
        return (
            self._queue.needs_switch() or self._continue_as_new_due() or self._releases_to_start()
        )

    def _releases_to_start(self) -> bool:
        return any(
            (job, node) not in self._releasing
            for job, nodes in self._queue.state.releasing.items()
            for node in nodes
        )

    def _release_left_jobs(self) -> None:
        """Ask the agents of every job that left to let its processes go,
        in the background: a node that is down must not hold up the queue."""
        if not self._releases_to_start():
            return
        if not workflow.patched(RELEASE_PATCH):
            self._queue.state.releasing.clear()
            return
        for job, nodes in self._queue.state.releasing.items():
            for node in nodes:
                if (job, node) not in self._releasing:
                    self._releasing.add((job, node))
                    task = asyncio.create_task(self._release(job, node))
                    self._release_tasks.add(task)
                    task.add_done_callback(self._release_tasks.discard)

    async def _release(self, job: str, node: str) -> None:
        state = self._queue.state
        agent_timeout = timedelta(seconds=state.policy.agent_timeout_seconds)
        try:
            output: ReleaseOutput = await workflow.execute_activity(
                "release",
                ReleaseInput(
                    group=state.group,
                    job=job,
                    reason=state.evicted_jobs.get(job, ""),
                    gpus=state.policy.gpus,
                ),
                result_type=ReleaseOutput,
                task_queue=node_task_queue(node),
                schedule_to_start_timeout=agent_timeout,
                start_to_close_timeout=timedelta(minutes=10),
                heartbeat_timeout=agent_timeout,
                retry_policy=RetryPolicy(
                    initial_interval=timedelta(milliseconds=500),
                    maximum_interval=timedelta(seconds=5),
                    maximum_attempts=SWITCH_ATTEMPTS,
                ),
            )
            workflow.logger.info("group %s: %s", state.group, output.summary)
        except ActivityError as failure:
            # Its agent is down or refused: `timeshare forget` on that node
            # does the same by hand.
            workflow.logger.warning(
                "group %s: the agent of node %s did not release job %s: %s",
                state.group, node, job, failure.cause or failure,
            )  # fmt: skip
        finally:
            self._releasing.discard((job, node))
            if job not in self._queue.state.jobs:
                self._queue.release_done(job, node)

    def _continue_as_new_due(self) -> bool:
        if self._queue.state.switching is not None:
            return False
        every = self._queue.state.policy.continue_as_new_every
        grants_this_run = self._queue.state.grants - self._grants_at_start
        return workflow.info().is_continue_as_new_suggested() or (
            every > 0 and grants_this_run >= every
        )

    async def _continue_as_new(self, group: str) -> None:
        self._closing = True
        # Waiting acquires return "ask again" and the gateway re-sends them to
        # the new run, where their place in the queue is carried over.
        await workflow.wait_condition(workflow.all_handlers_finished)
        self._queue.state.runs += 1
        workflow.continue_as_new(GroupInput(group=group, state=self._queue.state))

    def _now(self) -> float:
        """Workflow time as ``workflow.now().timestamp()`` gives it (to the
        microsecond). It moves only between activations, and a hand-over asks
        for it a score of times: made once per activation."""
        ns = workflow.time_ns()
        if ns != self._now_ns:
            self._now_ns, self._now_seconds = ns, workflow.now().timestamp()
        return self._now_seconds

    def _publish(self) -> None:
        summary = self._queue.summary(self._now())
        self._visibility.publish(summary, summary.yield_epoch if self._queue.policies else None)

    def _mark_changed(self) -> None:
        self._changed = True

    @contextmanager
    def _handling(self, message: str, reads_only: bool = False) -> Iterator[None]:
        """Turn every failure of a message into a typed, non-retryable
        rejection of that message alone, with the state as it was before it.
        An exception that escaped a handler would instead fail the workflow
        task again and again, and the whole group would stop. ``reads_only``:
        a validator, or any block that only reads the state: nothing to undo,
        so no snapshot (a pydantic dump) is taken."""
        before = None if reads_only else self._queue.snapshot()
        try:
            yield
        except ApplicationError:
            raise  # a rejection the handler chose, with the state it meant to leave
        except QueueError as refusal:
            self._undo(before)
            details = [refusal.details] if refusal.details else []
            raise ApplicationError(
                refusal.message, *details, type=refusal.code, non_retryable=True
            ) from None
        except Exception as bug:
            undone = self._undo(before)
            workflow.logger.exception(
                "group %s: %s failed (state %s)", self._queue.state.group, message,
                "restored" if undone else "unchanged",
            )  # fmt: skip
            raise ApplicationError(
                f"the scheduler could not handle {message}: {type(bug).__name__}: {bug}; "
                "the group is as it was before it (see the scheduler's log)",
                type=Refusal.INTERNAL,
                non_retryable=True,
            ) from None

    def _undo(self, before: Snapshot | None) -> bool:
        if before is None or not self._queue.changed_since(before):
            return False
        self._queue.restore(before)
        return True

    # -- messages from jobs -----------------------------------------------------

    @workflow.update
    def join(self, input: JoinInput) -> JoinOutput:
        with self._handling("join"):
            created = self._queue.join(
                input.job,
                input.nodes,
                input.token_hash,
                self._now(),
                weight=input.weight,
                priority=input.priority,
            )
            self._mark_changed()
            policy = self._queue.state.policy
            return JoinOutput(
                created=created,
                nodes=input.nodes,
                lease_seconds=policy.lease_seconds,
                # 0 tells the client to heartbeat as for the older rules.
                idle_lease_seconds=policy.idle_lease if self._queue.policies else 0.0,
            )

    @join.validator
    def _check_join(self, input: JoinInput) -> None:
        with self._handling("join", reads_only=True):
            self._queue.check_join(input.job, input.nodes)

    @workflow.update
    async def acquire(self, input: AcquireInput) -> AcquireResult:
        job, request_id = input.job, input.request_id
        with self._handling("acquire"):
            # Given back by this call, not by an earlier one of the same request.
            yielded = (
                self._give_back(job, input.yield_epoch)
                if input.yield_epoch and self._queue.state.released.get(job) != input.yield_epoch
                else None
            )
            grant = self._queue.request(
                job, request_id, self._now(), input.call_id, input.trace_context, input.phase
            )
            self._mark_changed()
        if grant is not None:
            return AcquireResult(grant=grant.as_grant(), yielded=yielded)
        final = 0 < input.timeout_seconds <= ACQUIRE_WAIT_SLICE_SECONDS
        wait = input.timeout_seconds if final else ACQUIRE_WAIT_SLICE_SECONDS
        try:
            await self._wait_slice(job, request_id, wait)
        except TimeoutError:
            with self._handling("acquire timeout"):
                cancelled = final and self._queue.cancel(
                    job, request_id, self._now(), input.call_id
                )
            if cancelled:
                self._mark_changed()
                raise ApplicationError(
                    f"job {job!r} was not granted within its timeout",
                    type=Refusal.DEADLINE_EXCEEDED,
                    non_retryable=True,
                ) from None
        with self._handling("acquire", reads_only=True):
            grant = self._queue.grant_for(job, request_id)
            if grant is not None:
                return AcquireResult(grant=grant.as_grant(), yielded=yielded)
            if self._queue.is_waiting(job, request_id):
                return AcquireResult(grant=None, yielded=yielded)
            self._queue.raise_if_aborted(request_id)
        raise ApplicationError(
            f"job {job!r} left the group before its turn came",
            type=Refusal.ABORTED,
            non_retryable=True,
        )

    async def _wait_slice(self, job: str, request_id: str, seconds: float) -> None:
        """Until the request is no longer waiting (or the run closes); raises
        TimeoutError after ``seconds``."""

        def over() -> bool:
            return self._closing or not self._queue.is_waiting(job, request_id)

        if not (self._steady and workflow.patched(SLICE_BY_MAIN_TIMER_PATCH)):
            await workflow.wait_condition(over, timeout=timedelta(seconds=seconds))
            return
        update = workflow.current_update_info()
        key = update.id if update is not None else f"{job}/{request_id}"
        ends = self._now() + seconds
        self._slice_ends[key] = (job, request_id, ends)
        self._mark_changed()  # the main loop arms its timer for the slice too
        try:
            await workflow.wait_condition(lambda: over() or self._now() >= ends)
        finally:
            del self._slice_ends[key]
        if not over():
            raise TimeoutError

    @acquire.validator
    def _check_acquire(self, input: AcquireInput) -> None:
        with self._handling("acquire", reads_only=True):
            self._queue.authenticate(input.job, input.token_hash)
            if input.yield_epoch:
                self._queue.check_release(input.job, input.yield_epoch)
            self._queue.check_acquire(input.job, input.request_id, input.yield_epoch)
            _refuse_bad_phase(input.phase)

    @workflow.update
    def keep_turn(self, input: KeepTurnInput) -> KeepTurnOutput:
        """The holder goes on into its next phase (Job.next_turn_nowait). An
        update of its own, not a flag on acquire: a scheduler from before it
        refuses it as unknown instead of passing the turn on while the job
        computes."""
        with self._handling("keep_turn"):
            turn = self._queue.state.turn
            ended = turn.phase if turn is not None else ""
            asked, held = self._queue.keep_turn(input.job, input.epoch, input.phase, self._now())
            self._mark_changed()
            turn = self._queue.state.turn
            assert turn is not None
            return KeepTurnOutput(
                grant=turn.as_grant(),
                asked_to_yield=asked,
                ended=YieldOutput(held_seconds=held, phase=ended),
            )

    @keep_turn.validator
    def _check_keep_turn(self, input: KeepTurnInput) -> None:
        with self._handling("keep_turn", reads_only=True):
            self._queue.authenticate(input.job, input.token_hash)
            self._queue.check_release(input.job, input.epoch)
            _refuse_bad_phase(input.phase)

    @workflow.update
    def cancel_acquire(self, input: CancelAcquireInput) -> bool:
        with self._handling("cancel_acquire"):
            self._mark_changed()
            return self._queue.cancel(input.job, input.request_id, self._now(), input.call_id)

    @cancel_acquire.validator
    def _check_cancel(self, input: CancelAcquireInput) -> None:
        with self._handling("cancel_acquire", reads_only=True):
            self._queue.authenticate(input.job, input.token_hash)

    @workflow.update(name="yield")
    def yield_turn(self, input: YieldInput) -> YieldOutput:
        with self._handling("yield"):
            given_back = self._give_back(input.job, input.epoch)
            self._mark_changed()
            return given_back

    def _give_back(self, job: str, epoch: int) -> YieldOutput:
        turn = self._queue.state.turn
        phase = turn.phase if turn is not None and turn.job == job else ""
        held = self._queue.release(job, epoch, self._now())
        return YieldOutput(held_seconds=held, phase=phase)

    @yield_turn.validator
    def _check_yield(self, input: YieldInput) -> None:
        with self._handling("yield", reads_only=True):
            self._queue.authenticate(input.job, input.token_hash)
            self._queue.check_release(input.job, input.epoch)

    @workflow.update
    def heartbeat(self, input: JobInput) -> HeartbeatOutput:
        # A heartbeat moves the lease deadline later, never earlier: the main
        # loop's timer need not be reset for it.
        with self._handling("heartbeat"):
            return self._queue.heartbeat(input.job, self._now())

    @heartbeat.validator
    def _check_heartbeat(self, input: JobInput) -> None:
        with self._handling("heartbeat", reads_only=True):
            self._queue.authenticate(input.job, input.token_hash)

    @workflow.update
    def leave(self, input: JobInput) -> None:
        with self._handling("leave"):
            self._queue.leave(input.job, self._now())
            self._mark_changed()

    @leave.validator
    def _check_leave(self, input: JobInput) -> None:
        # Leaving is idempotent: a job already gone (left or evicted) is fine.
        if input.job in self._queue.state.jobs:
            with self._handling("leave", reads_only=True):
                self._queue.authenticate(input.job, input.token_hash)

    # -- operator controls --------------------------------------------------------

    @workflow.update
    def evict(self, input: EvictInput) -> bool:
        with self._handling("evict"):
            evicted = self._queue.evict(input.job, input.reason, self._now())
            self._mark_changed()
            return evicted

    @workflow.update
    def pause(self, input: PauseInput) -> GroupStatus:
        with self._handling("pause"):
            self._queue.pause(input.paused, self._now())
            self._mark_changed()
            return self._queue.status()

    @workflow.update
    def drain(self, input: DrainInput) -> GroupStatus:
        with self._handling("drain"):
            self._queue.drain(input.node, input.drained, self._now())
            self._mark_changed()
            return self._queue.status()

    @workflow.query
    def status(self) -> GroupStatus:
        return self._queue.status(self._now())

    @workflow.query
    def history(self) -> GroupHistory:
        return self._queue.history(self._now())

    @workflow.query
    def token_matches(self, input: JobInput) -> TokenCheck:
        """Whether ``input.token_hash`` is the job's: node agents ask before a
        process joins the job's switches. A query, so it adds nothing to the
        history and changes nothing; hashes only, like every other message."""
        member = input.job in self._queue.state.jobs
        try:
            self._queue.authenticate(input.job, input.token_hash)
        except QueueError as refusal:
            return TokenCheck(matches=False, reason=refusal.message, member=member)
        return TokenCheck(matches=True, member=member)

    # -- switches -------------------------------------------------------------

    async def _switch(self, prefetch: str = "") -> None:
        """Carry out the next switch: to the next waiter, or with ``prefetch``,
        bringing that job onto its nodes before it asks."""
        whole_jobs = workflow.patched(WHOLE_JOBS_PATCH)
        plan = (
            self._queue.begin_prefetch(prefetch, self._now(), whole_jobs)
            if prefetch
            else self._queue.begin_switch(self._now(), whole_jobs=whole_jobs)
        )
        quiet = self._visibility.lean and self._queue.switches_are_quick(QUICK_SWITCH_SECONDS)
        while True:
            if not quiet:
                self._publish()
            quiet = False
            results: list[SwitchOutput | MoveFailure] = []
            failures = await self._quiesce(plan)
            if not failures:
                results = list(
                    await asyncio.gather(*(self._move(plan, move) for move in plan.moves))
                )
                failures = [r for r in results if isinstance(r, MoveFailure)]
            lost = sorted({f.failed_job for f in failures if f.failed_job})
            if lost and workflow.patched(FAILED_JOBS_PATCH):
                for job in lost:
                    cause = "; ".join(f.cause for f in failures if f.failed_job == job)
                    self._queue.evict_failed(job, cause, self._now())
                self._release_left_jobs()
            self._evict_failing_hooks(failures)
            if not failures:
                for output in results:
                    for job in output.gone if isinstance(output, SwitchOutput) else []:
                        self._queue.evict(
                            job, f"its processes on node {output.node} have exited", self._now()
                        )
                restored = any(
                    action.action == "restore" and action.bytes > 0
                    for r in results
                    if isinstance(r, SwitchOutput)
                    for action in r.actions
                )
                self._queue.finish_switch(self._now(), restored)
                return
            group = self._queue.state.group
            workflow.logger.warning(
                "group %s: switch to %s failed: %s", group, plan.waiter.job,
                "; ".join(f"node {f.node}: {f.cause}" for f in failures),
            )  # fmt: skip
            verdict = self._queue.switch_failed(
                [f.as_failed_move() for f in failures],
                done=[r.node for r in results if isinstance(r, SwitchOutput)],
                # A quiesce that failed moved nothing: the nodes hold what they held.
                failed=[f.node for f in failures] if results else [],
                now=self._now(),
            )
            if verdict.given_up or verdict.evicted:
                self._release_left_jobs()
                if verdict.given_up:
                    return
                continue
            pause = verdict.pause
            with contextlib.suppress(TimeoutError):
                await workflow.wait_condition(
                    lambda: not self._queue.switch_plan_stands(),
                    timeout=timedelta(seconds=pause),
                )
            # Leases run out during a long outage too.
            self._queue.expire(self._now())
            if not self._queue.switch_target_waits():
                # Nobody waits for this switch any more; the next plan starts
                # from what each node reported.
                self._queue.abort_switch("", self._now())
                return
            if not self._queue.switch_plan_stands() or plan.attempts >= SWITCH_PLAN_ATTEMPTS:
                # Paused, drained, or failing for long: step out of the switch
                # so the main loop can pause, continue as new or plan afresh.
                self._queue.set_switch_aside(self._now())
                return

    def _evict_failing_hooks(self, failures: list[MoveFailure]) -> None:
        """A job whose own hooks failed its checkpoint through every retry is
        evicted, and left out of the switch: its hooks fail its own turns
        only, never the other jobs' (its agents then stop calling them)."""
        failing = sorted({f.hook_job for f in failures if f.hook_job})
        if not failing or not workflow.patched(HOOK_FAILURES_PATCH):
            return
        for job in failing:
            cause = "; ".join(f"node {f.node}: {f.cause}" for f in failures if f.hook_job == job)
            workflow.logger.warning(
                "group %s: evicting job %s, whose workload hooks failed: %s",
                self._queue.state.group, job, cause,
            )  # fmt: skip
            self._queue.evict_failed(job, f"its workload hooks failed: {cause}", self._now())
        self._release_left_jobs()

    async def _quiesce(self, plan: SwitchPlan) -> list[MoveFailure]:
        """Stop every job that leaves several nodes on all of them first."""
        moves = plan.quiesce_moves()
        if not moves:
            return []
        stopped = await asyncio.gather(*(self._move(plan, move, "quiesce") for move in moves))
        return [r for r in stopped if isinstance(r, MoveFailure)]

    async def _move(
        self, plan: SwitchPlan, move: StoredMove, phase: SwitchPhase = "switch"
    ) -> SwitchOutput | MoveFailure:
        """Run one node's part of a switch: what it did, or why it failed."""
        agent_timeout = timedelta(seconds=self._queue.state.policy.agent_timeout_seconds)
        started = self._now()
        try:
            output: SwitchOutput = await workflow.execute_activity(
                "switch",
                SwitchInput(
                    group=self._queue.state.group,
                    epoch=plan.epoch,
                    move=move.as_move(),
                    plan=plan.number,
                    trace_context=plan.waiter.trace_context,
                    co_residency=self._queue.state.policy.co_residency,
                    phase=phase,
                    gpus=self._queue.state.policy.gpus,
                ),
                result_type=SwitchOutput,
                task_queue=node_task_queue(move.node),
                schedule_to_start_timeout=agent_timeout,
                start_to_close_timeout=timedelta(minutes=10),
                heartbeat_timeout=agent_timeout,
                retry_policy=RetryPolicy(
                    initial_interval=timedelta(milliseconds=500),
                    backoff_coefficient=2.0,
                    maximum_interval=timedelta(seconds=5),
                    maximum_attempts=SWITCH_ATTEMPTS,
                ),
            )
        except ActivityError as failure:
            cause = failure.cause
            if isinstance(cause, ActivityTimeoutError):
                reason = f"the node agent did not answer within {agent_timeout.seconds} s"
            else:
                reason = str(cause or failure)
            restore_failed = isinstance(cause, ApplicationError) and cause.type == RESTORE_FAILED
            failed_job = hook_job = ""
            if isinstance(cause, ApplicationError) and cause.type == JOB_FAILED and cause.details:
                failed_job = str(cause.details[0])
            if isinstance(cause, ApplicationError) and cause.type == HOOK_FAILED and cause.details:
                hook_job = str(cause.details[0])
            stuck_job = ""
            if (
                isinstance(cause, ApplicationError)
                and cause.type == CHECKPOINT_FAILED
                and cause.details
            ):
                stuck_job = str(cause.details[0])
            if phase == "switch":
                self._record_move(plan, move, started, None, reason)
            return MoveFailure(
                node=move.node,
                cause=reason,
                restore_failed=restore_failed,
                failed_job=failed_job,
                hook_job=hook_job,
                stuck_job=stuck_job,
            )
        if phase == "switch":
            self._record_move(plan, move, started, output, "")
        return output

    def _record_move(
        self,
        plan: SwitchPlan,
        move: StoredMove,
        started: float,
        output: SwitchOutput | None,
        error: str,
    ) -> None:
        actions = output.actions if output is not None else []
        self._queue.record_switches(
            [
                StoredSwitch(
                    node=move.node,
                    epoch=plan.epoch,
                    started_at=started,
                    finished_at=self._now(),
                    evicted=[a.job for a in actions if a.action == "checkpoint"] or move.evict,
                    admitted=move.admit if output is not None else "",
                    bytes_moved=sum(a.bytes for a in actions),
                    backend=output.backend if output is not None else "",
                    ok=output is not None,
                    error=error,
                    checkpoint_bytes={a.job: a.bytes for a in actions if a.action == "checkpoint"},
                )
            ]
        )


def _rules_of_a_new_group() -> int:
    """The rules a group decides by for as long as it runs: the newest this
    scheduler knows, asked of Temporal so that a group created by an older
    scheduler replays with the rules it was created with."""
    if not workflow.patched(POLICIES_PATCH):
        return RULES_LEGACY
    return RULES_ANTICIPATION if workflow.patched(ANTICIPATION_PATCH) else RULES_POLICIES


def _refuse_bad_phase(phase: str) -> None:
    try:
        check_phase(phase)
    except ValueError as error:
        raise QueueError(Refusal.INVALID_ARGUMENT, str(error)) from None
