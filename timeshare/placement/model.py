"""The group model: a discrete-event simulation in virtual time that drives
the scheduler's own core (timeshare.scheduling.GroupCore) with job profiles.

Every scheduling decision (who goes next, when a switch is due, what it
evicts, when a holder is preempted, which job is brought in ahead of its
request) is the real core's: the model hands it the events the group
workflow would (messages, timers, switch outcomes) through its one door,
``handle``, and carries out the commands it returns as the workflow does,
so a policy the core gains is followed here unchanged. What the model adds
is time: each job runs its iteration's phases, asks for a turn before every
GPU phase and yields after it; a switch takes the device's transfer time
(device.py) plus the stack's own round trips (StackCosts), and the waiting
job runs when its acquire returns.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import assert_never

from timeshare.history import GroupHistory
from timeshare.models import GroupPolicy
from timeshare.placement.device import Device
from timeshare.placement.spec import GpuSets, JobSpec, StackCosts
from timeshare.scheduling import commands as cmd
from timeshare.scheduling import events as ev
from timeshare.scheduling.group_core import GroupCore
from timeshare.scheduling.rules import RULES_POLICIES
from timeshare.scheduling.state import GroupState, StoredPolicy, StoredSwitch, SwitchPlan

# Steady state: every job first runs this many iterations (the start-up, in
# which all jobs ask at once), then at least `iterations` more are measured.
WARMUP_ITERATIONS = 2
# A job that makes (almost) no progress is measured over this many of the
# slowest job's iterations at most.
MAX_SPAN_ITERATIONS = 400


@dataclass
class JobTrace:
    name: str
    gpus: int
    started: float = 0.0
    finished: float | None = None
    # Start of every iteration, and the end of the last one completed.
    boundaries: list[float] = field(default_factory=list)
    # Seconds of GPU work: (start, end).
    work: list[tuple[float, float]] = field(default_factory=list)


@dataclass
class GroupRun:
    """What one simulated run of a group did."""

    jobs: dict[str, JobTrace]
    gpus: int
    end: float
    peak_host_bytes: int
    switches: int
    bytes_moved: int
    history: GroupHistory | None = None


@dataclass
class _Job:
    spec: JobSpec
    trace: JobTrace
    iterations: int | None
    phase: int = 0
    done_iterations: int = 0
    requests: int = 0
    # The epoch the job was told (a resumed preempted turn keeps its first).
    epoch: int = 0
    # Seconds of work left in the current GPU phase, and when it ends.
    remaining: float = 0.0
    work_started: float | None = None
    work_token: int = 0


class GroupModel:
    def __init__(
        self,
        jobs: Sequence[JobSpec],
        gpu_sets: GpuSets,
        policy: GroupPolicy,
        costs: StackCosts,
        node: str = "set-1",
        group: str = "plan",
        record_history: bool = False,
    ) -> None:
        self.node = node
        self.costs = costs
        self.gpus = gpu_sets.gpus
        # The state a new group's workflow starts from.
        self.core = GroupCore(
            GroupState(group=group, policy=StoredPolicy.stored(policy), rules=RULES_POLICIES)
        )
        co_resident = policy.co_residency == "auto"
        self.device = Device(
            sizes={j.name: j.state_bytes for j in jobs},
            gpus={j.name: j.gpus for j in jobs},
            bandwidth=gpu_sets.bandwidth_bytes_per_second,
            room=gpu_sets.co_residency_bytes if co_resident else None,
        )
        self.specs = list(jobs)
        self.record_history = record_history
        self._events: list[tuple[float, int, Callable[[], None]]] = []
        self._order = itertools.count()
        self.now = 0.0
        self._jobs: dict[str, _Job] = {}
        self._last_epoch = 0
        self._grant_delay = self._immediate_grant_delay()
        # A look (Tick) the core asked for is on its way; a switch attempt is.
        self._looking = False
        self._switching = False
        self._timer_at: float | None = None
        self._timer_ran = -1.0
        self.switches = 0
        self.bytes_moved = 0
        self._stop: Callable[[], bool] = lambda: False

    # -- running ----------------------------------------------------------------

    def run(
        self,
        iterations: int | None,
        *,
        starts: dict[str, float] | None = None,
        steady_iterations: int = 0,
    ) -> GroupRun:
        """``iterations``: each job runs that many, then leaves. None: every
        job runs on until each has done WARMUP_ITERATIONS + ``steady_iterations``."""
        starts = starts or {}
        for spec in self.specs:
            job = _Job(spec, JobTrace(spec.name, spec.gpus), iterations)
            self._jobs[spec.name] = job
            self._at(starts.get(spec.name, 0.0), self._starter(job))
        if iterations is None:
            wanted = WARMUP_ITERATIONS + max(1, steady_iterations)
            longest = max(s.iteration_seconds for s in self.specs)
            cap = max(starts.values(), default=0.0) + longest * MAX_SPAN_ITERATIONS
            self._stop = lambda: (
                self.now > cap or all(j.done_iterations >= wanted for j in self._jobs.values())
            )
        while self._events and not self._stop():
            self.now, _, action = heapq.heappop(self._events)
            action()
        return GroupRun(
            jobs={name: job.trace for name, job in self._jobs.items()},
            gpus=self.gpus,
            end=self.now,
            peak_host_bytes=self.device.peak_host_bytes,
            switches=self.switches,
            bytes_moved=self.bytes_moved,
            history=self.core.history(self.now) if self.record_history else None,
        )

    def _starter(self, job: _Job) -> Callable[[], None]:
        return lambda: self._start(job)

    def _at(self, when: float, action: Callable[[], None]) -> None:
        heapq.heappush(self._events, (when, next(self._order), action))

    def _handle(self, event: ev.Event) -> None:
        """Hand the core an event at the model's time and carry out what it
        says, as the group workflow does; then see to a new grant."""
        for command in self.core.handle(event, self.now):
            match command:
                case cmd.Reply() | cmd.Log() | cmd.MarkPatch():
                    pass  # a job learns of its turn from the grant (_notice_grant)
                case cmd.StartReleases(releases=releases):
                    for release in releases:
                        ended = ev.ReleaseEnded(*release)
                        self._at(self.now + self.costs.message_seconds, self._event(ended))
                case cmd.Wake(at=at, at_once=at_once):
                    self._wake(at, at_once)
                case cmd.AttemptSwitch(plan=plan):
                    self._attempt(plan)
                case cmd.PauseSwitch(seconds=seconds):
                    self._at(self.now + seconds, self._event(ev.SwitchPaused()))
                case cmd.ContinueAsNew():
                    self.core = GroupCore(self.core.state)
                    self._handle(ev.RunStarted())
                case _:
                    assert_never(command)
        self._notice_grant()

    def _event(self, event: ev.Event) -> Callable[[], None]:
        return lambda: self._handle(event)

    def _wake(self, at: float | None, at_once: bool) -> None:
        """A look at once takes the workflow's planning time; the timer rings
        at the core's next deadline. Neither while a switch is under way:
        the workflow looks again when it is over."""
        if self._switching:
            return
        if at_once and not self._looking:
            self._looking = True
            self._at(self.now + self.costs.plan_seconds, self._look)
        if at is None or at <= self._timer_ran:
            return  # none, or one a timer has seen to already
        if self._timer_at is None or at < self._timer_at:
            self._timer_at = at
            self._at(max(at, self.now), self._timer)

    def _look(self) -> None:
        self._looking = False
        if not self._switching:
            self._handle(ev.Tick())

    # -- a job's life -----------------------------------------------------------

    def _start(self, job: _Job) -> None:
        job.trace.started = self.now
        job.trace.boundaries.append(self.now)
        spec = job.spec
        self._handle(ev.Join(spec.name, [self.node], _token(spec.name), spec.weight, spec.priority))
        self._phase(job)

    def _phase(self, job: _Job) -> None:
        phase = job.spec.iteration[job.phase]
        seconds = phase.seconds + self.costs.overrun_seconds
        if phase.gpu is None:
            self._at(self.now + seconds, lambda: self._phase_done(job))
            return
        job.remaining = seconds
        job.requests += 1
        request_id = f"{job.spec.name}-{job.requests}"
        self._at(
            self.now + self.costs.message_seconds,
            lambda: self._request(job, request_id, phase.phase),
        )

    def _immediate_grant_delay(self) -> float:
        """A grant made as the job's own acquire (or another's yield) arrives."""
        return max(0.0, self.costs.acquire_seconds - self.costs.message_seconds)

    def _request(self, job: _Job, request_id: str, phase: str) -> None:
        self._grant_delay = self._immediate_grant_delay()
        name = job.spec.name
        self._handle(ev.Acquire(name, _token(name), request_id, phase=phase))

    def _granted(self, job: _Job, epoch: int, told: int) -> None:
        """The job's acquire returned: it computes for the rest of its phase
        (unless that turn was taken from it meanwhile)."""
        turn = self.core.state.turn
        if turn is None or turn.epoch != epoch:
            return
        job.epoch = told
        job.work_started = self.now
        job.work_token += 1
        token = job.work_token
        self._at(self.now + job.remaining, lambda: self._work_done(job, token))

    def _work_done(self, job: _Job, token: int) -> None:
        if token != job.work_token:
            return  # preempted meanwhile; resumes with what was left
        self._stop_work(job)
        epoch = job.epoch
        self._at(self.now + self.costs.message_seconds, lambda: self._release(job, epoch))
        self._at(self.now + self.costs.yield_seconds, lambda: self._phase_done(job))

    def _stop_work(self, job: _Job) -> None:
        assert job.work_started is not None
        job.trace.work.append((job.work_started, self.now))
        job.remaining -= self.now - job.work_started
        job.work_started = None

    def _release(self, job: _Job, epoch: int) -> None:
        self._grant_delay = self._immediate_grant_delay()
        self._handle(ev.Yield(job.spec.name, _token(job.spec.name), epoch))

    def _phase_done(self, job: _Job) -> None:
        job.phase += 1
        if job.phase < len(job.spec.iteration):
            self._phase(job)
            return
        job.phase = 0
        job.done_iterations += 1
        job.trace.boundaries.append(self.now)
        if job.iterations is not None and job.done_iterations >= job.iterations:
            self._at(self.now + self.costs.message_seconds, lambda: self._leave(job))
            return
        self._phase(job)

    def _leave(self, job: _Job) -> None:
        self._handle(ev.Leave(job.spec.name, _token(job.spec.name)))
        job.trace.finished = self.now - self.costs.message_seconds + self.costs.yield_seconds

    # -- the scheduler's side ------------------------------------------------------

    def _notice_grant(self) -> None:
        """A new turn the queue granted: its job runs once its acquire returns;
        a job whose turn was taken (preempted) stops where it is."""
        for job in self._jobs.values():
            if job.work_started is not None and not self._holds(job):
                self._stop_work(job)
                job.work_token += 1
        turn = self.core.state.turn
        if turn is None or turn.epoch == self._last_epoch:
            return
        self._last_epoch = turn.epoch
        job = self._jobs[turn.job]
        told = turn.told_epoch
        epoch = turn.epoch
        self._at(self.now + self._grant_delay, lambda: self._granted(job, epoch, told))

    def _holds(self, job: _Job) -> bool:
        turn = self.core.state.turn
        return turn is not None and turn.job == job.spec.name

    def _attempt(self, plan: SwitchPlan) -> None:
        """Every node of the plan goes through, in the device's time."""
        self._switching = True
        seconds = 0.0
        restored = False
        records = []
        for move in plan.moves:
            cost = self.device.switch(move.admit, move.evict)
            seconds = max(seconds, cost.seconds)
            restored = restored or cost.restored
            self.bytes_moved += cost.bytes_moved
            records.append((move, cost))
        took = self.costs.switch_seconds + seconds
        started = self.now

        def finish() -> None:
            self.switches += 1
            history = (
                [
                    StoredSwitch(
                        node=move.node,
                        epoch=plan.epoch,
                        started_at=started,
                        finished_at=self.now,
                        evicted=list(cost.checkpointed) or move.evict,
                        admitted=move.admit,
                        bytes_moved=cost.bytes_moved,
                        backend="model",
                        checkpoint_bytes=cost.checkpointed,
                    )
                    for move, cost in records
                ]
                if self.record_history
                else []
            )
            self._grant_delay = self.costs.grant_seconds
            self._switching = False
            done = [ev.NodeSwitched(move.node, restored=restored) for move in plan.moves]
            self._handle(ev.SwitchAttempted(done=done, failed=[], records=history))

        self._at(self.now + took, finish)

    def _timer(self) -> None:
        """The workflow's durable timer: leases (jobs heartbeat, so they hold)
        and the turn limit. During a switch the workflow looks when it is over."""
        self._timer_at = None
        if self._switching:
            return  # the switch's end says when to look again
        self._timer_ran = self.now
        for name in self._jobs:
            if name in self.core.state.jobs:
                self._handle(ev.Heartbeat(name, _token(name)))
        self._grant_delay = self.costs.grant_seconds
        self._handle(ev.Tick())


def _token(job: str) -> str:
    return f"model-{job}"
