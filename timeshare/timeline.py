"""What synthetic jobs' records and a group's history say: a timeline people
can read, the GPU busy fraction with and without sharing, and how long jobs
waited behind others."""

from __future__ import annotations

from collections.abc import Sequence

from pydantic import BaseModel

from timeshare.history import GroupHistory
from timeshare.status import table
from timeshare.synthetic import BACKFILL_PHASE, SyntheticJobReport

GPU_PHASES = ("sample", "train", "gpu", BACKFILL_PHASE)
CHART_WIDTH = 72
CHART_MARKS = {"sample": "S", "train": "T", "gpu": "G", BACKFILL_PHASE: "B", "reward": "-",
               "cpu": "-", "wait": "."}  # fmt: skip


class UtilisationFigures(BaseModel):
    jobs: int
    span_seconds: float
    gpu_busy_seconds: float
    # Every job alone on a GPU of its own, idle during its CPU phases.
    dedicated_gpu_seconds: float
    dedicated_utilisation: float
    # All jobs taking turns on one GPU.
    shared_gpu_seconds: float
    shared_utilisation: float
    switches: int
    switch_seconds: float
    wait_seconds: float


def utilisation(reports: Sequence[SyntheticJobReport]) -> UtilisationFigures:
    start = min(r.started for r in reports)
    end = max(r.finished for r in reports)
    busy = sum(p.end - p.start for r in reports for p in r.phases if p.phase in GPU_PHASES)
    dedicated = sum(p.end - p.start for r in reports for p in r.phases)
    turns = [t for r in reports for t in r.turns]
    span = end - start
    return UtilisationFigures(
        jobs=len(reports),
        span_seconds=span,
        gpu_busy_seconds=busy,
        dedicated_gpu_seconds=dedicated,
        dedicated_utilisation=busy / dedicated if dedicated else 0.0,
        shared_gpu_seconds=span,
        shared_utilisation=busy / span if span else 0.0,
        switches=sum(1 for t in turns if t.switch_seconds > 0),
        switch_seconds=sum(t.switch_seconds for t in turns),
        wait_seconds=sum(t.granted - t.requested for t in turns),
    )


def busy_between(reports: Sequence[SyntheticJobReport], start: float, end: float) -> float:
    """The GPU's busy fraction from ``start`` to ``end``, every job's GPU phases counted."""
    busy = sum(
        max(0.0, min(p.end, end) - max(p.start, start))
        for r in reports for p in r.phases if p.phase in GPU_PHASES
    )  # fmt: skip
    return busy / (end - start) if end > start else 0.0


def busy_while_all_run(reports: Sequence[SyntheticJobReport]) -> float:
    """The GPU's busy fraction from the last job's start to the first job's end."""
    return busy_between(reports, max(r.started for r in reports), min(r.finished for r in reports))


def idle_while_waiting(reports: Sequence[SyntheticJobReport], step: float = 0.001) -> float:
    """Seconds in which some job waited for the GPU and none computed on it:
    switch time plus scheduler overhead."""
    start = min(r.started for r in reports)
    end = max(r.finished for r in reports)
    slots = int((end - start) / step) + 1
    waiting = bytearray(slots)
    working = bytearray(slots)
    for report in reports:
        for turn in report.turns:
            for marks, (a, b) in ((waiting, (turn.requested, turn.granted)),
                                  (working, (turn.work_start, turn.work_end))):  # fmt: skip
                for slot in range(int((a - start) / step), min(slots, int((b - start) / step))):
                    marks[slot] = 1
    return sum(1 for w, g in zip(waiting, working, strict=True) if w and not g) * step


def waits_behind(history: GroupHistory, jobs: set[str]) -> list[tuple[float, float]]:
    """For each request another job made while one of ``jobs`` held the GPUs:
    the seconds until the GPUs next went to a job not in ``jobs`` after that
    turn ended (what it waited for that holder, not for others queued ahead
    of it), and the seconds of the switch in that hand-over."""
    others = sorted((t for t in history.turns if t.job not in jobs and t.granted_at > 0),
                    key=lambda t: t.granted_at)  # fmt: skip
    waits = []
    for held in (t for t in history.turns if t.job in jobs):
        end = held.released_at or history.captured_at
        handed = next((t for t in others if t.granted_at >= end), None)
        asked = [t.requested_at for t in others if held.granted_at <= t.requested_at < end]
        if handed is not None:
            waits += [(handed.granted_at - at, handed.switch_seconds) for at in asked]
    return waits


def chart(reports: Sequence[SyntheticJobReport]) -> str:
    """One row per job: S sampling, T training, G a profile's GPU phase, B
    backfill steps (on the GPU), - reward (CPU), . waiting."""
    start = min(r.started for r in reports)
    span = max(r.finished for r in reports) - start
    scale = CHART_WIDTH / span if span else 1.0
    width = max(len(r.spec.job) for r in reports)
    rows = []
    for report in reports:
        cells = [" "] * CHART_WIDTH
        intervals = [(t.requested, t.granted, "wait") for t in report.turns]
        intervals += [(p.start, p.end, p.phase) for p in report.phases]
        for begin, finish, kind in intervals:
            first = int((begin - start) * scale)
            last = max(first + 1, int((finish - start) * scale))
            for column in range(first, min(last, CHART_WIDTH)):
                cells[column] = CHART_MARKS[kind]
        rows.append(f"{report.spec.job.rjust(width)} |{''.join(cells)}|")
    axis = f"{'':>{width}} 0 s{'':>{CHART_WIDTH - 8}}{span:5.1f} s"
    return "\n".join([*rows, axis])


def turns_table(reports: Sequence[SyntheticJobReport]) -> str:
    start = min(r.started for r in reports)
    turns = sorted(
        ((t, r.spec.job) for r in reports for t in r.turns), key=lambda pair: pair[0].epoch
    )
    rows = [
        [
            f"{t.granted - start:6.2f}",
            job,
            f"{t.phase} #{t.iteration + 1}",
            str(t.epoch),
            f"{t.granted - t.requested:.3f}",
            f"{t.switch_seconds:.3f}",
            f"{t.yielded - t.granted:.3f}",
        ]
        for t, job in turns
    ]
    headers = ["granted at s", "job", "phase", "epoch", "waited s", "switch s", "held s"]
    return table(headers, rows)


def summary(figures: UtilisationFigures) -> str:
    """The run as the jobs saw it. A group's report (`timeshare report`)
    counts from the scheduler's record instead, so each line says what it
    counts where the two differ: the report's busy share is the time a job
    held the GPUs, and its switches are every switch, those done ahead of a
    request (prefetch) too."""
    return "\n".join(
        [
            f"GPU busy {figures.gpu_busy_seconds:.1f} s of work by {figures.jobs} jobs",
            f"  without sharing: {figures.jobs} GPUs, {figures.dedicated_gpu_seconds:.1f} "
            f"GPU-seconds, busy {figures.dedicated_utilisation:.0%}",
            f"  with timeshare:  1 GPU,  {figures.shared_gpu_seconds:.1f} GPU-seconds, "
            f"busy {figures.shared_utilisation:.0%} (the jobs' GPU phases over the run)",
            f"  {figures.switches} switches a job waited for took {figures.switch_seconds:.2f} s "
            f"in all; jobs waited {figures.wait_seconds:.1f} s for turns",
        ]
    )
