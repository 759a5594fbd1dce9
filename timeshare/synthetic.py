"""A synthetic RL job: a sampler phase and a trainer phase on the GPU with a
CPU-only reward phase between them, in a loop, or any iteration of GPU and
CPU phases a placement profile names. As backfill, it runs short GPU steps
back to back instead, and gives its turn back at the first step boundary
after a regular job asks. It uses only the public client library, and
writes what happened as JSON for the demo, tests and benchmarks.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Iterator
from pathlib import Path

from pydantic import BaseModel, Field

import timeshare
from timeshare.hooks import WorkloadHooks, serve_hooks
from timeshare.hooks.protocol import EvictMode
from timeshare.models import GroupPolicy
from timeshare.placement.spec import Phase


class SyntheticJobSpec(BaseModel):
    group: str
    job: str
    address: str | None = None
    nodes: list[str] | None = None
    iterations: int = 5
    sample_seconds: float = 0.8
    reward_seconds: float = 1.8
    train_seconds: float = 0.6
    start_delay_seconds: float = 0.0
    # Unix seconds: the delay counts from here, once the job has joined, not
    # from the process's start (benchmarks: equal starts however long each
    # process took to import and join).
    start_at: float | None = None
    # A profile's iteration instead of sample, reward, train: phases "gpu" and
    # "cpu", each GPU phase's acquire named as the profile names it.
    iteration: list[Phase] | None = None
    # As the job joins: its weight and priority under the group's policies,
    # and whether it runs as backfill (only while no regular job holds or waits).
    weight: float = 1.0
    priority: int = 0
    # A backfill job runs `iterations` GPU steps of `step_seconds` (or until
    # stopped), checking should_yield between them; one that ignores it keeps
    # each turn for `turn_steps` steps, as a job that never looks would.
    backfill: bool = False
    step_seconds: float = 0.05
    ignore_should_yield: bool = False
    turn_steps: int = 20
    # Applied if this job's join creates the group.
    policy: GroupPolicy | None = None
    # Serve workload hooks to the agent, asking to be evicted this way.
    hooks: EvictMode | None = None
    agent_socket: str | None = None
    # Wait for each yield before the CPU phase after it (Job.yield_) instead
    # of starting that phase at once (Job.yield_nowait), and for each next
    # turn (Job.next_turn) instead of going on where nobody waits
    # (Job.next_turn_nowait).
    blocking_yields: bool = False


# What a backfill job's turns and steps are recorded (and asked for) as.
BACKFILL_PHASE = "backfill"


class TurnRecord(BaseModel):
    phase: str
    iteration: int
    epoch: int
    ticket: int
    requested: float
    granted: float
    yielded: float
    # The GPU work itself, inside the turn.
    work_start: float
    work_end: float
    waited_seconds: float
    switch_seconds: float


class PhaseRecord(BaseModel):
    phase: str
    start: float
    end: float


class SyntheticJobReport(BaseModel):
    spec: SyntheticJobSpec
    turns: list[TurnRecord] = Field(default_factory=list)
    phases: list[PhaseRecord] = Field(default_factory=list)
    started: float = 0.0
    finished: float = 0.0
    # Hook calls the agent made (with --hooks).
    evictions: int = 0
    admissions: int = 0


class SyntheticHooks(WorkloadHooks):
    """A synthetic job holds no device state: its hooks only count the calls."""

    def __init__(self, report: SyntheticJobReport) -> None:
        self.report = report

    def evict(self, mode: EvictMode) -> None:
        self.report.evictions += 1

    def admit(self) -> None:
        self.report.admissions += 1


@contextlib.contextmanager
def _hooks_served(spec: SyntheticJobSpec, report: SyntheticJobReport) -> Iterator[None]:
    if spec.hooks is None:
        yield
        return
    hooks = SyntheticHooks(report)
    # The process that acquires turns is not registered: only its hooks are.
    with serve_hooks(hooks, spec.group, spec.job, spec.agent_socket, mode=spec.hooks,
                     register=False):  # fmt: skip
        yield


def run_synthetic_job(
    spec: SyntheticJobSpec, report_path: Path | None = None
) -> SyntheticJobReport:
    report = SyntheticJobReport(spec=spec)
    if spec.start_at is None:
        time.sleep(spec.start_delay_seconds)
    with contextlib.ExitStack() as open_until_done:
        client = open_until_done.enter_context(timeshare.connect(spec.address))

        def join() -> timeshare.Job:
            return client.join(spec.group, spec.job, nodes=spec.nodes, policy=spec.policy,
                               weight=spec.weight, priority=spec.priority,
                               backfill=spec.backfill)  # fmt: skip

        job = join()
        # A restarted job process starts afresh: drop any turn a previous
        # process of the same name left behind, then take a new place.
        job.leave()
        job = join()
        # Served once joined: the agent admits hooks only with the job's token.
        open_until_done.enter_context(_hooks_served(spec, report))
        if spec.start_at is not None:
            _sleep_until(spec.job, spec.start_at + spec.start_delay_seconds)
        report.started = time.time()
        try:
            (_backfill_turns if spec.backfill else _iterations)(job, report, spec)
        finally:
            job.leave()
            report.finished = time.time()
            if report_path is not None:
                report_path.write_text(report.model_dump_json(indent=1))
    return report


def _iterations(job: timeshare.Job, report: SyntheticJobReport, spec: SyntheticJobSpec) -> None:
    phases = _phases(spec)
    steps = [(i, phase) for i in range(spec.iterations) for phase in phases]
    holding = False
    for index, (iteration, (name, on_gpu, seconds, asked_for)) in enumerate(steps):
        if on_gpu:
            # GPU phases back to back (training, then the next sampling) pass
            # the turn on in one message.
            keep = index + 1 < len(steps) and steps[index + 1][1][1]
            _gpu_phase(job, report, name, iteration, seconds, asked_for, holding, keep,
                       spec.blocking_yields)  # fmt: skip
            holding = keep
        else:
            start = time.time()
            time.sleep(seconds)
            report.phases.append(PhaseRecord(phase=name, start=start, end=time.time()))
        if (index + 1) % len(phases):
            continue
        last = report.turns[-1]
        print(
            f"{spec.job}: iteration {iteration + 1}/{spec.iterations} done "
            f"(last wait {last.waited_seconds:.2f} s, switch {last.switch_seconds:.2f} s)",
            flush=True,
        )


def _backfill_turns(job: timeshare.Job, report: SyntheticJobReport, spec: SyntheticJobSpec) -> None:
    """Turns of GPU steps back to back until ``iterations`` steps are done,
    each given back at the first step boundary after should_yield (or, with
    ``ignore_should_yield``, after ``turn_steps`` steps). A turn cut short by
    a signal is recorded up to that moment."""
    steps = 0
    while steps < spec.iterations:
        requested = time.time()
        turn = job.acquire(phase=BACKFILL_PHASE)
        work_start = time.time()
        try:
            steps += _steps_in_turn(turn, spec, spec.iterations - steps)
        finally:
            work_end = time.time()
            report.phases.append(PhaseRecord(phase=BACKFILL_PHASE, start=work_start, end=work_end))
            report.turns.append(
                TurnRecord(
                    phase=BACKFILL_PHASE, iteration=len(report.turns), epoch=turn.epoch,
                    ticket=turn.ticket, requested=requested, granted=work_start,
                    yielded=work_end, work_start=work_start, work_end=work_end,
                    waited_seconds=turn.waited_seconds, switch_seconds=turn.switch_seconds,
                )
            )  # fmt: skip
        job.yield_nowait()
    print(f"{spec.job}: {steps} backfill steps in {len(report.turns)} turns", flush=True)


def _steps_in_turn(turn: timeshare.Turn, spec: SyntheticJobSpec, left: int) -> int:
    """GPU steps until the turn should be given back; how many were done."""
    done = 0
    while done < left and not (turn.should_yield and not spec.ignore_should_yield):
        if spec.ignore_should_yield and done == spec.turn_steps:
            break
        time.sleep(spec.step_seconds)  # stands for one batch's GPU kernels
        done += 1
    return done


def _sleep_until(job: str, start: float) -> None:
    late = time.time() - start
    if late > 0:
        print(f"{job}: joined {late:.2f} s after its start time; starting now "
              "(give the jobs longer to start)", flush=True)  # fmt: skip
    time.sleep(max(0.0, -late))


def _phases(spec: SyntheticJobSpec) -> list[tuple[str, bool, float, str]]:
    """(name, on the GPU, seconds, the acquire's phase) of one iteration."""
    if spec.iteration is not None:
        return [("gpu" if p.on_gpu else "cpu", p.on_gpu, p.seconds, p.phase)
                for p in spec.iteration]  # fmt: skip
    # Each acquire names its phase, as the framework integrations do.
    return [
        ("sample", True, spec.sample_seconds, "sample"),
        ("reward", False, spec.reward_seconds, ""),
        ("train", True, spec.train_seconds, "train"),
    ]


def _gpu_phase(
    job: timeshare.Job,
    report: SyntheticJobReport,
    phase: str,
    iteration: int,
    seconds: float,
    asked_for: str = "",
    holding: bool = False,
    keep: bool = False,
    blocking_yield: bool = False,
) -> None:
    """One GPU phase in a turn of its own: asked for (or, ``holding`` the
    previous phase's turn, passed on with Job.next_turn_nowait), worked, and
    given back unless ``keep`` (the next phase is on the GPU too): by default
    without waiting for the answer, so the CPU phase after it starts at once."""
    requested = time.time()
    kept = False
    if holding:
        previous = report.turns[-1]
        if blocking_yield:
            turn = job.next_turn(phase=asked_for)
        else:
            turn = job.next_turn_nowait(phase=asked_for)
        # Kept without a message answered: the same turn goes on.
        kept = turn.epoch == previous.epoch
        previous.yielded = requested
    else:
        turn = job.acquire(phase=asked_for)
    granted = time.time()
    work_start = time.time()
    time.sleep(seconds)  # stands for the sampler's or trainer's GPU kernels
    work_end = time.time()
    yielded = work_end  # a kept turn is given back when the next phase asks
    if not keep:
        job.yield_() if blocking_yield else job.yield_nowait()
        yielded = time.time()
    report.phases.append(PhaseRecord(phase=phase, start=work_start, end=work_end))
    report.turns.append(
        TurnRecord(
            phase=phase,
            iteration=iteration,
            epoch=turn.epoch,
            ticket=turn.ticket,
            requested=requested,
            granted=granted,
            yielded=yielded,
            work_start=work_start,
            work_end=work_end,
            waited_seconds=0.0 if kept else turn.waited_seconds,
            switch_seconds=0.0 if kept else turn.switch_seconds,
        )
    )


def load_report(path: Path) -> SyntheticJobReport:
    return SyntheticJobReport.model_validate(json.loads(path.read_text()))
