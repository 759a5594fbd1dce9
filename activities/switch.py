"""The ``switch`` and ``release`` activities: one node's part of a
hand-over, and letting a job that left its group go.

An agent serves every group whose jobs use its node. Its switches and
releases run one at a time, whatever their groups: two of them touching the
same GPU at once could each find the device free for the job it admits, and
each check the host's free memory before the other has moved anything."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time
from collections import defaultdict
from collections.abc import AsyncIterator, Awaitable, Callable

from opentelemetry import propagate, trace
from temporalio import activity
from temporalio.exceptions import ApplicationError

from timeshare.activities.backends.base import (
    Backend,
    BackendError,
    HookFailed,
    JobFailed,
    NoDeviceRoom,
)
from timeshare.activities.backends.processes import ProcessTable
from timeshare.activities.residency import RoomPlan, extra, plan_room
from timeshare.hooks.protocol import EvictMode
from timeshare.instruments import record_switch
from timeshare.models import (
    CHECKPOINT_FAILED,
    HOOK_FAILED,
    JOB_FAILED,
    NO_DEVICE_ROOM,
    RESTORE_FAILED,
    BackendAction,
    ReleaseInput,
    ReleaseOutput,
    SwitchInput,
    SwitchOutput,
)

HEARTBEAT_SECONDS = 1.0
log = logging.getLogger("timeshare.agent")
tracer = trace.get_tracer("timeshare.agent")
PHASE_OF_FAILURE = {CHECKPOINT_FAILED: "checkpoint", RESTORE_FAILED: "restore"}


class SwitchActivities:
    def __init__(self, node: str, backend: Backend, processes: ProcessTable | None = None) -> None:
        self.node = node
        self.backend = backend
        self.processes = processes or ProcessTable()
        # The job each group last admitted here: a process of any other job of
        # the group that registers meanwhile is checkpointed at once.
        self._admitted: dict[str, str] = {}
        self._background: set[asyncio.Task[None]] = set()
        self.processes.on_register.append(self._registered)
        # One switch or release at a time on each GPU, whatever its group
        # (groups that claim other GPUs of the node switch meanwhile), and
        # never a switch older than its group's last: an attempt Temporal
        # already gave up on must not move state after the next plan has.
        self._gpu_locks: defaultdict[int, asyncio.Lock] = defaultdict(asyncio.Lock)
        # The GPUs each group's policy claims here (none named: all of them).
        self._claims: dict[str, list[int]] = {}
        self.waiting = 0  # switches and releases waiting for the node (for tests)
        self._latest_plan: dict[str, int] = {}
        # Called with (group, job) once a job that left is released here.
        self.on_release: list[Callable[[str, str], Awaitable[None]]] = []
        # Whether each group's last switch here kept jobs co-resident, and
        # when each job last ran here: the least recently used leaves first.
        self._co_residency: dict[str, bool] = {}
        self._clock = itertools.count(1)
        self._last_ran: dict[tuple[str, str], int] = {}
        # Jobs that left while another job of their group held the device here,
        # co-residency off: their state waits in host memory for the GPU to be free.
        self._parked_leavers: defaultdict[str, set[str]] = defaultdict(set)
        # Per (group, job), the latest membership (incarnation) a switch here
        # named, and the one whose release last ran here: a job may leave and
        # join again while its release is on its way, and a late release must
        # not let go of the processes of the job that is back.
        self._member_incarnation: dict[tuple[str, str], int] = {}
        self._released_incarnation: dict[tuple[str, str], int] = {}

    @activity.defn(name="switch")
    async def switch(self, input: SwitchInput) -> SwitchOutput:
        """Make room for the admitted job and restore it: every other job of
        the group resident here is checkpointed or, with co-residency, locked
        where the admitted job fits beside it."""
        move = input.move
        if move.node != self.node:
            raise ApplicationError(
                f"switch for node {move.node!r} reached the agent of node {self.node!r}",
                non_retryable=True,
            )
        self._claims[input.group] = list(input.gpus)
        async with self._these_gpus(input.group):
            if input.plan < self._latest_plan.get(input.group, 0):
                raise ApplicationError(
                    f"switch plan {input.plan} of group {input.group!r} was superseded by plan "
                    f"{self._latest_plan[input.group]}",
                    type="Superseded",
                    non_retryable=True,
                )
            self._latest_plan[input.group] = input.plan
            # The span joins the trace of the acquire this switch serves.
            with tracer.start_as_current_span(
                "timeshare.switch",
                context=propagate.extract(input.trace_context),
                attributes={
                    "timeshare.group": input.group,
                    "timeshare.node": self.node,
                    "timeshare.epoch": input.epoch,
                    "timeshare.admit": move.admit,
                    "timeshare.backend": self.backend.name,
                },
            ):
                output = await self._switch(input)
            record_switch(input.group, output)
            return output

    def _gpus_of(self, group: str) -> list[int]:
        claimed = self._claims.get(group)
        if claimed:
            return sorted(claimed)
        # All of the node's GPUs; a node that cannot count them is one GPU.
        return list(range(max(1, len(self.backend.gpus()))))

    @contextlib.asynccontextmanager
    async def _these_gpus(self, group: str) -> AsyncIterator[None]:
        """The locks of the group's GPUs, taken in index order (two groups
        that share a GPU never wait for each other's locks crosswise)."""
        async with contextlib.AsyncExitStack() as held:
            self.waiting += 1
            try:
                for gpu in self._gpus_of(group):
                    await held.enter_async_context(self._gpu_locks[gpu])
            finally:
                self.waiting -= 1
            yield

    async def _switch(self, input: SwitchInput) -> SwitchOutput:
        move, group = input.move, input.group
        started = time.monotonic()
        self.backend.place(group, input.gpus)
        if move.admit:
            # Admitted: a member again, whatever it did before.
            self.processes.mark_released(group, move.admit, False)
        self._note_members(group, input.incarnations)
        if input.phase == "quiesce":
            return await self._quiesce(input, started)
        shared = input.co_residency == "auto" and self.backend.co_residency()
        self._co_residency[group] = shared
        async with _heartbeating():
            try:
                others, room = await self._room(input, shared)
            except BackendError as error:
                raise ApplicationError(str(error), type=CHECKPOINT_FAILED) from None
            # A job that left keeps running beside the admitted one if it fits:
            # nobody would ever unlock it.
            kept = [job for job in room.keep if not self.processes.released(group, job)]
            actions = [
                await _step(self.backend.lock(group, job), CHECKPOINT_FAILED, job) for job in kept
            ]
            actions += [
                await _step(
                    self.backend.checkpoint(group, job, self._mode(group, job)),
                    CHECKPOINT_FAILED,
                    job,
                )
                for job in room.evict
            ]
            if move.admit:
                actions.append(
                    await _step(self.backend.restore(group, move.admit), RESTORE_FAILED, move.admit)
                )
        activity.logger.info(
            "group %s epoch %d: node %s admitted %s (evicted %s; co-resident %s)",
            group,
            input.epoch,
            self.node,
            move.admit or "nobody",
            room.evict or "nothing",
            room.keep or "none",
        )
        if move.admit:
            self._admitted[group] = move.admit
            self._last_ran[(group, move.admit)] = next(self._clock)
        else:
            self._admitted.pop(group, None)
            await self._restore_parked_leavers(group)
        return self._output(input, started, actions, others, room.keep)

    async def _room(self, input: SwitchInput, shared: bool) -> tuple[list[str], RoomPlan]:
        """The group's other jobs here, and which of them leave the device."""
        move, group = input.move, input.group
        if not move.admit:
            # The job leaves with its ranks elsewhere; nobody needs the room.
            others = sorted(move.evict)
            return others, RoomPlan(evict=[] if shared else others, keep=others if shared else [])
        # Evict what the backend itself sees resident too, not only what the
        # scheduler believes: after an agent restart the two can differ.
        seen = await self.backend.resident_jobs(group)
        others = sorted((set(move.evict) | set(seen)) - {move.admit})
        if not shared:
            return others, RoomPlan(evict=others, keep=[])
        return others, await self._plan_room(group, move.admit, others, seen)

    async def _quiesce(self, input: SwitchInput, started: float) -> SwitchOutput:
        """Stop the leaving jobs here, state left on the device, so that none
        of their ranks runs on once the checkpoint starts on any node."""
        group = input.group
        async with _heartbeating():
            actions = [
                await _step(
                    self.backend.quiesce(group, job, self._mode(group, job)),
                    CHECKPOINT_FAILED,
                    job,
                )
                for job in sorted(input.move.evict)
            ]
        activity.logger.info(
            "group %s epoch %d: node %s stopped %s before the checkpoint",
            group, input.epoch, self.node, input.move.evict,
        )  # fmt: skip
        return self._output(input, started, actions, input.move.evict, [])

    def _output(
        self,
        input: SwitchInput,
        started: float,
        actions: list[BackendAction],
        others: list[str],
        kept: list[str],
    ) -> SwitchOutput:
        jobs = [job for job in [input.move.admit, *others] if job]
        return SwitchOutput(
            node=self.node,
            backend=self.backend.name,
            actions=actions,
            seconds=time.monotonic() - started,
            gone=[job for job in jobs if self.processes.gone(input.group, job)],
            co_resident=kept,
        )

    async def _plan_room(
        self, group: str, admit: str, others: list[str], seen: list[str]
    ) -> RoomPlan:
        """Lock the others where the admitted job fits beside them; evict,
        least recently run first, only what it needs room for."""
        need = extra(
            await self.backend.admission_footprint(group, admit),
            await self.backend.footprint(group, admit),
        )
        free = await self.backend.free_memory(group)
        on_device = sorted(
            (job for job in others if job in seen),
            key=lambda job: self._last_ran.get((group, job), 0),
        )
        footprints = {job: await self.backend.footprint(group, job) for job in on_device}
        room = plan_room(need, free, on_device, footprints)
        # Jobs the scheduler still names but that are off the device already:
        # a checkpoint of them is a no-op, and never co-residency.
        return RoomPlan(evict=room.evict + [j for j in others if j not in seen], keep=room.keep)

    def _note_members(self, group: str, incarnations: dict[str, int]) -> None:
        """Jobs the scheduler names as members: one whose earlier membership
        was released here is the group's again (its processes are switched)."""
        for job, incarnation in incarnations.items():
            key = (group, job)
            self._member_incarnation[key] = max(self._member_incarnation.get(key, 0), incarnation)
            if incarnation > self._released_incarnation.get(key, 0):
                self.processes.mark_released(group, job, False)

    def _mode(self, group: str, job: str) -> EvictMode:
        return self.backend.evict_mode(group, job) or "offload"

    @activity.defn(name="release")
    async def release(self, input: ReleaseInput) -> ReleaseOutput:
        """The job left its group (leave, eviction, lease, exit): its
        processes here run again, never left stopped without an owner."""
        async with _heartbeating():
            return await self.release_job(
                input.group, input.job, input.gpus, input.reason, input.incarnation
            )

    async def release_job(
        self,
        group: str,
        job: str,
        gpus: list[int] | None = None,
        reason: str = "",
        incarnation: int = 0,
    ) -> ReleaseOutput:
        """``incarnation``: the membership that ended (0: whichever is here)."""
        if gpus is not None:
            self._claims[group] = list(gpus)
        async with self._these_gpus(group):
            if gpus is not None:
                self.backend.place(group, gpus)
            if incarnation and self._member_incarnation.get((group, job), 0) > incarnation:
                return self._release_too_late(group, job, incarnation)
            key = (group, job)
            self._released_incarnation[key] = max(
                self._released_incarnation.get(key, 0), incarnation
            )
            # Marked first: no switch freezes it again from here on.
            self.processes.mark_released(group, job)
            holder = self._admitted.get(group)
            # Co-residency off: the device is the holder's alone, so what the
            # job left parked waits in host memory until the GPU is free.
            restore = holder in (None, job) or self._co_residency.get(group, False)
            try:
                released = await self.backend.release(group, job, restore)
            except BackendError as error:
                raise ApplicationError(
                    f"releasing {group}/{job} on node {self.node}: {error}", type="ReleaseFailed"
                ) from None
            if restore:
                self._parked_leavers[group].discard(job)
            else:
                self._parked_leavers[group].add(job)
            if holder == job:
                self._admitted.pop(group)
                await self._restore_parked_leavers(group)
        output = ReleaseOutput(
            node=self.node, job=job, running=released.running,
            checkpointed=released.checkpointed, failed=released.failed,
            summary=release_summary(group, job, self.node, released.running,
                                    released.checkpointed, released.failed, released.done),
        )  # fmt: skip
        (log.warning if output.checkpointed or output.failed else log.info)(
            "%s%s", output.summary, f" ({reason})" if reason else ""
        )
        for listener in self.on_release:
            try:
                await listener(group, job)
            except Exception as error:  # the claim is pruned at the next conflicting join
                log.warning("after releasing %s/%s: %s", group, job, error)
        return output

    def _release_too_late(self, group: str, job: str, incarnation: int) -> ReleaseOutput:
        summary = (
            f"job {group}/{job} not released on node {self.node}: it joined its group again "
            f"after the membership this release was for ({incarnation}) ended"
        )
        log.info("%s", summary)
        return ReleaseOutput(node=self.node, job=job, summary=summary)

    async def _restore_parked_leavers(self, group: str) -> None:
        """The group's GPUs here are free: jobs that left while another held
        them get their state back (their processes' CUDA calls go on)."""
        for job in sorted(self._parked_leavers.pop(group, set())):
            try:
                released = await self.backend.release(group, job)
            except BackendError as error:
                log.warning("restoring %s/%s, which left while parked: %s", group, job, error)
                continue
            log.info("%s", release_summary(group, job, self.node, released.running,
                                          released.checkpointed, released.failed,
                                          released.done))  # fmt: skip

    def _registered(self, group: str, job: str) -> None:
        holder = self._admitted.get(group)
        if holder is not None and holder != job:
            task = asyncio.get_running_loop().create_task(self._lock_newcomer(group, job))
            self._background.add(task)
            task.add_done_callback(self._background.discard)

    async def _lock_newcomer(self, group: str, job: str) -> None:
        async with self._these_gpus(group):
            if self.processes.released(group, job):
                return  # a process of a job that left registered again (agent restart)
            if self._admitted.get(group) not in (None, job):
                try:
                    if self._co_residency.get(group):
                        await self.backend.lock(group, job)
                    else:
                        await self.backend.checkpoint(group, job, self._mode(group, job))
                except BackendError as error:
                    log.warning("could not lock newcomer %s/%s: %s", group, job, error)


def release_summary(
    group: str,
    job: str,
    node: str,
    running: list[int],
    checkpointed: list[int],
    failed: list[int],
    done: list[str],
) -> str:
    parts = [f"job {group}/{job} released on node {node}:"]
    parts.append(f"processes {running} run again" if running else "no process left stopped")
    if checkpointed:
        parts.append(
            f"; {checkpointed} left checkpointed but not stopped: their CUDA calls block "
            "until it comes back, and they may exit, which frees their host memory"
        )
    if failed:
        parts.append(f"; {failed} are in the driver's FAILED state: kill them")
    if done:
        parts.append(f" ({'; '.join(done)})")
    return " ".join(parts).replace(" ;", ";")


async def _step(action: Awaitable[BackendAction], failure_type: str, job: str) -> BackendAction:
    """One backend action of a switch on ``job``; a failure names the job in
    its details, so that the workflow knows whose state could not move."""
    with tracer.start_as_current_span(f"timeshare.{PHASE_OF_FAILURE[failure_type]}") as span:
        try:
            done = await action
        except JobFailed as failed:
            span.set_status(trace.StatusCode.ERROR, str(failed))
            # Terminal: the workflow evicts the job named in the details.
            raise ApplicationError(
                str(failed), failed.job, type=JOB_FAILED, non_retryable=True
            ) from None
        except NoDeviceRoom as refused:
            span.set_status(trace.StatusCode.ERROR, str(refused))
            # Nothing was restored and retrying finds the same: the workflow
            # tells it by the second detail and answers the waiting job.
            raise ApplicationError(
                str(refused), refused.job, NO_DEVICE_ROOM, type=RESTORE_FAILED, non_retryable=True
            ) from None
        except HookFailed as failed:
            span.set_status(trace.StatusCode.ERROR, str(failed))
            if failure_type != CHECKPOINT_FAILED:
                # An admit hook: the job's own turn fails (RestoreFailed aborts it).
                raise ApplicationError(str(failed), type=failure_type) from None
            # Retried like any failed checkpoint; then the workflow evicts the
            # job named in the details, whose own hooks hold the switch up.
            raise ApplicationError(str(failed), failed.job, type=HOOK_FAILED) from None
        except BackendError as error:
            span.set_status(trace.StatusCode.ERROR, str(error))
            raise ApplicationError(str(error), job, type=failure_type) from None
        # A co-resident job is locked, not checkpointed; name what was done.
        span.update_name(f"timeshare.{done.action}")
        span.set_attributes({"timeshare.job": done.job, "timeshare.bytes": done.bytes})
        return done


@contextlib.asynccontextmanager
async def _heartbeating() -> AsyncIterator[None]:
    """Heartbeat while the backend works, so a dead agent is noticed within
    the heartbeat timeout rather than the activity's whole time limit. The
    first beat waits a period: a switch that ends sooner (most do) sends
    none, and its completion does not queue behind a heartbeat call."""
    timeout = activity.info().heartbeat_timeout
    period = min(HEARTBEAT_SECONDS, timeout.total_seconds() / 3) if timeout else HEARTBEAT_SECONDS

    async def beat() -> None:
        while True:
            await asyncio.sleep(period)
            activity.heartbeat()

    task = asyncio.create_task(beat())
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
