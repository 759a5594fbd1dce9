"""The ``switch`` and ``release`` activities: one node's part of a hand-over,
and letting a job that left its group go. A thin executor: every decision is
the node's core's (timeshare/node/core.py), which this turns each request,
reading and backend outcome into an event for, and whose commands it carries
out in order, all in one place (``_carry_out``).

An agent serves every group whose jobs use its node. Its switches and
releases run one at a time on each GPU, whatever their groups: two of them
touching the same GPU at once could each find the device free for the job it
admits, and each check the host's free memory before the other has moved
anything."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import defaultdict
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import assert_never

from opentelemetry import propagate, trace
from temporalio import activity
from temporalio.exceptions import ApplicationError

from timeshare.activities.backends.base import (
    Backend,
    BackendError,
    HookFailed,
    JobFailed,
    NoDeviceRoom,
    Released,
)
from timeshare.activities.backends.processes import ProcessTable
from timeshare.background import background
from timeshare.instruments import record_switch
from timeshare.models import (
    BackendAction,
    ReleaseInput,
    ReleaseOutput,
    SwitchInput,
    SwitchOutput,
)
from timeshare.node import commands as cmd
from timeshare.node import events as ev
from timeshare.node.core import NodeCore
from timeshare.node.state import NodeState

HEARTBEAT_SECONDS = 1.0
log = logging.getLogger("timeshare.agent")
tracer = trace.get_tracer("timeshare.agent")


@dataclass
class Outcome:
    """What carrying out one request's commands came to."""

    actions: list[BackendAction] = field(default_factory=list)
    switched: cmd.AnswerSwitch | None = None
    released: Released | None = None
    too_late_for: int = 0


class SwitchActivities:
    def __init__(
        self,
        node: str,
        backend: Backend,
        processes: ProcessTable | None = None,
        state_path: Path | None = None,
    ) -> None:
        self.node = node
        self.backend = backend
        self.processes = processes or ProcessTable()
        self._state_path = state_path
        saved = load_state(state_path) if state_path is not None else None
        self.core = NodeCore(
            NodeState.restarted(node, saved, frozenset(self.processes.released_at_load))
        )
        self.processes.decided_by(self.core.released)
        self.processes.on_register.append(self._registered)
        self.backend.attach_host_ledger(self)
        self._background: set[asyncio.Task[None]] = set()
        # One switch or release at a time on each GPU, whatever its group.
        self._gpu_locks: defaultdict[int, asyncio.Lock] = defaultdict(asyncio.Lock)
        self.waiting = 0  # switches and releases waiting for the node (for tests)
        # Called with (group, job) once a job that left is released here.
        self.on_release: list[Callable[[str, str], Awaitable[None]]] = []

    # -- the activities --------------------------------------------------------------

    @activity.defn
    async def switch(self, input: SwitchInput) -> SwitchOutput:
        """Make room for the admitted job and restore it: every other job of
        the group resident here is checkpointed or, with co-residency, locked
        where the admitted job fits beside it."""
        group, started = input.group, time.monotonic()
        self.core.handle(ev.GpusClaimed(group, list(input.gpus), input.move.node))
        async with self._these_gpus(group):
            asked = ev.SwitchAsked(input, self.backend.co_residency())
            # The span joins the trace of the acquire this switch serves.
            with tracer.start_as_current_span(
                "timeshare.switch",
                context=propagate.extract(input.trace_context),
                attributes={
                    "timeshare.group": group,
                    "timeshare.node": self.node,
                    "timeshare.epoch": input.epoch,
                    "timeshare.admit": input.move.admit,
                    "timeshare.backend": self.backend.name,
                },
            ):
                async with _heartbeating():
                    outcome = await self._carry_out(self.core.handle(asked))
            output = self._switch_output(input, outcome, started)
        record_switch(group, output)
        return output

    @activity.defn
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
        self.core.handle(ev.GpusClaimed(group, gpus))
        async with self._these_gpus(group):
            asked = ev.ReleaseAsked(group, job, gpus, incarnation)
            outcome = await self._carry_out(self.core.handle(asked))
        if outcome.too_late_for:
            summary = (
                f"job {group}/{job} not released on node {self.node}: it joined its group "
                f"again after the membership this release was for ({outcome.too_late_for}) ended"
            )
            log.info("%s", summary)
            return ReleaseOutput(node=self.node, job=job, summary=summary)
        released = outcome.released or Released()
        output = ReleaseOutput(
            node=self.node, job=job, running=released.running,
            checkpointed=released.checkpointed, failed=released.failed,
            summary=release_summary(group, job, self.node, released),
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

    # -- what the kernel and the backend tell ---------------------------------------

    def _registered(self, group: str, job: str, new: bool) -> None:
        self._carry_out_now(self.core.handle(ev.ProcessRegistered(group, job, new)))

    def processes_exited(self, group: str, job: str) -> bool:
        """Every process the job registered here exited: whether it is still
        a member here, to be evicted from its group (workers/agent/exit_watch.py)."""
        commands = self.core.handle(ev.ProcessesExited(group, job))
        self._carry_out_now(commands)
        return any(isinstance(command, cmd.EvictWhenGone) for command in commands)

    def hold(self, asked: ev.HostAsked) -> None:
        """The host memory a checkpoint needs (the backend asks before it
        locks anything); raises BackendError where the core refuses it."""
        for command in self.core.handle(asked):
            if isinstance(command, cmd.Refuse):
                raise BackendError(command.message)

    def free(self, group: str, job: str) -> None:
        self._carry_out_now(self.core.handle(ev.HostDone(group, job)))

    # -- the one executor of the core's commands ------------------------------------

    async def _carry_out(self, commands: list[cmd.Command]) -> Outcome:
        """In order; a command that yields an event has the core's answer to
        it carried out next. A Refuse ends the request with its failure."""
        work, outcome = list(commands), Outcome()
        while work:
            command = work.pop(0)
            match command:
                case cmd.ReadRoom():
                    work[:0] = self.core.handle(await self._read_room(command))
                case cmd.Act():
                    work[:0] = self.core.handle(await self._act(command, outcome))
                case cmd.ReleaseProcesses():
                    released = await self._release_processes(command, outcome)
                    work[:0] = self.core.handle(released) if released is not None else []
                case cmd.Refuse(type=kind, message=message, details=details):
                    raise ApplicationError(
                        message, *details, type=kind or None, non_retryable=command.non_retryable
                    )
                case cmd.AnswerSwitch():
                    outcome.switched = command
                case cmd.AnswerRelease(too_late_for=late):
                    outcome.too_late_for = late
                case _:
                    self._carry_out_now([command])
        return outcome

    def _carry_out_now(self, commands: list[cmd.Command]) -> None:
        """Commands that take no time (what a registration or a host hold asks)."""
        for command in commands:
            match command:
                case cmd.Place(group=group, gpus=gpus):
                    self.backend.place(group, gpus)
                case cmd.MeetNewcomer(group=group, job=job):
                    task = asyncio.get_running_loop().create_task(self._meet(group, job))
                    self._background.add(task)
                    task.add_done_callback(self._background.discard)
                case cmd.Persist():
                    self._persist()
                case cmd.Log(message=message, warning=warning):
                    (log.warning if warning else log.info)("%s", message)
                case cmd.ReserveHost() | cmd.FreeHost() | cmd.EvictWhenGone():
                    pass  # the core's record holds them; the exit watch reads the last
                case (
                    cmd.ReadRoom()
                    | cmd.Act()
                    | cmd.ReleaseProcesses()
                    | cmd.Refuse()
                    | cmd.AnswerSwitch()
                    | cmd.AnswerRelease()
                ):
                    raise RuntimeError(
                        f"the node's core asked for work outside a request: {command}"
                    )
                case _:
                    assert_never(command)

    async def _read_room(self, command: cmd.ReadRoom) -> ev.RoomRead | ev.RoomUnread:
        group, admit = command.group, command.admit
        try:
            seen = await self.backend.resident_jobs(group)
            if not command.shared:
                return ev.RoomRead(group, seen)
            admission = await self.backend.admission_footprint(group, admit)
            footprints = {job: await self.backend.footprint(group, job) for job in [admit, *seen]}
            free = await self.backend.free_memory(group)
        except BackendError as error:
            return ev.RoomUnread(group, _failure(error))
        return ev.RoomRead(group, seen, admission, free, footprints)

    async def _act(self, command: cmd.Act, outcome: Outcome) -> ev.ActionDone | ev.ActionFailed:
        """One step on a job; a failure names the job, so that the core can
        say whose state could not move."""
        group, job, step = command.group, command.job, command.step
        phase = "restore" if step == "restore" else "checkpoint"
        with tracer.start_as_current_span(f"timeshare.{phase}") as span:
            try:
                done = await self._step(group, job, step)
            except BackendError as error:
                span.set_status(trace.StatusCode.ERROR, str(error))
                return ev.ActionFailed(group, job, step, _failure(error))
            # A co-resident job is locked, not checkpointed; name what was done.
            span.update_name(f"timeshare.{done.action}")
            span.set_attributes({"timeshare.job": done.job, "timeshare.bytes": done.bytes})
        outcome.actions.append(done)
        return ev.ActionDone(group, done)

    async def _step(self, group: str, job: str, step: cmd.Step) -> BackendAction:
        mode = self.backend.evict_mode(group, job) or "offload"
        match step:
            case "lock":
                return await self.backend.lock(group, job)
            case "checkpoint":
                return await self.backend.checkpoint(group, job, mode)
            case "quiesce":
                return await self.backend.quiesce(group, job, mode)
            case "restore":
                return await self.backend.restore(group, job)
            case _:
                assert_never(step)

    async def _release_processes(
        self, command: cmd.ReleaseProcesses, outcome: Outcome
    ) -> ev.ProcessesReleased | ev.ReleaseFailed | None:
        """The backend lets the job's processes go; a job that left while
        parked is only logged (None: the core need not hear of it)."""
        group, job = command.group, command.job
        try:
            released = await self.backend.release(group, job, command.restore)
        except BackendError as error:
            if command.leaver:
                log.warning("restoring %s/%s, which left while parked: %s", group, job, error)
                return None
            return ev.ReleaseFailed(group, job, _failure(error))
        if command.leaver:
            log.info("%s", release_summary(group, job, self.node, released))
            return None
        outcome.released = released
        return ev.ProcessesReleased(group, job, command.restore)

    async def _meet(self, group: str, job: str) -> None:
        async with self._these_gpus(group):
            await self._carry_out(self.core.handle(ev.NewcomerTurn(group, job)))

    # -- what the executor keeps --------------------------------------------------------

    @contextlib.asynccontextmanager
    async def _these_gpus(self, group: str) -> AsyncIterator[None]:
        """The locks of the group's GPUs, taken in index order (two groups
        that share a GPU never wait for each other's locks crosswise)."""
        async with contextlib.AsyncExitStack() as held:
            self.waiting += 1
            try:
                for gpu in self.core.gpus_of(group, len(self.backend.gpus())):
                    await held.enter_async_context(self._gpu_locks[gpu])
            finally:
                self.waiting -= 1
            yield

    def _persist(self) -> None:
        if self._state_path is not None:
            save_state(self._state_path, self.core.state.durable())

    def _switch_output(self, input: SwitchInput, outcome: Outcome, started: float) -> SwitchOutput:
        answer = outcome.switched
        assert answer is not None, "a switch the core never answered"
        group = input.group
        if answer.quiesce:
            activity.logger.info(
                "group %s epoch %d: node %s stopped %s before the checkpoint",
                group, input.epoch, self.node, answer.others,
            )  # fmt: skip
        else:
            activity.logger.info(
                "group %s epoch %d: node %s admitted %s (evicted %s; co-resident %s)",
                group, input.epoch, self.node, answer.admit or "nobody",
                answer.evicted or "nothing", answer.kept or "none",
            )  # fmt: skip
        jobs = [job for job in [answer.admit, *answer.others] if job]
        return SwitchOutput(
            node=self.node,
            backend=self.backend.name,
            actions=outcome.actions,
            seconds=time.monotonic() - started,
            gone=[job for job in jobs if self.processes.gone(group, job)],
            co_resident=answer.kept,
        )


def release_summary(group: str, job: str, node: str, released: Released) -> str:
    parts = [f"job {group}/{job} released on node {node}:"]
    running, checkpointed, failed = released.running, released.checkpointed, released.failed
    parts.append(f"processes {running} run again" if running else "no process left stopped")
    if checkpointed:
        parts.append(
            f"; {checkpointed} left checkpointed but not stopped: their CUDA calls block "
            "until it comes back, and they may exit, which frees their host memory"
        )
    if failed:
        parts.append(f"; {failed} are in the driver's FAILED state: kill them")
    if released.done:
        parts.append(f" ({'; '.join(released.done)})")
    return " ".join(parts).replace(" ;", ";")


def load_state(path: Path) -> NodeState | None:
    try:
        return NodeState.model_validate_json(path.read_text()) if path.exists() else None
    except (OSError, ValueError) as error:
        log.warning("the node's record in %s is unreadable (%s); starting afresh", path, error)
        return None


def save_state(path: Path, state: NodeState) -> None:
    partial = path.with_name(path.name + ".partial")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        partial.write_text(state.model_dump_json())
        partial.replace(path)
    except OSError as error:
        log.warning(
            "cannot keep the node's record in %s (%s): after a restart of this agent, jobs "
            "that left may be stopped again; give the agent a writable socket directory",
            path, error,
        )  # fmt: skip


def _failure(error: BackendError) -> ev.Failure:
    """What the core reads of a backend's error: which of the kinds it tells
    apart (models.FailureKind follows from it), and the job it names."""
    kinds = (JobFailed, NoDeviceRoom, HookFailed)
    kind = next((k.__name__ for k in kinds if isinstance(error, k)), BackendError.__name__)
    return ev.Failure(kind, str(error), getattr(error, "job", ""))


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

    async with background(beat()):
        yield
