"""What a simulated run predicts: the group's GPU busy fraction and each
job's slowdown (its iteration in the group over its iteration alone, with no
scheduler at all), over the steady state or over a whole finite run."""

from __future__ import annotations

from collections.abc import Sequence

from pydantic import BaseModel

from timeshare.placement.model import WARMUP_ITERATIONS, GroupRun, JobTrace
from timeshare.placement.spec import GIB, JobSpec


class GroupPrediction(BaseModel):
    jobs: list[str]
    # Share of the set's GPU-seconds in which a job computed.
    busy: float
    slowdown: dict[str, float]
    # The most host memory the group's parked states held at once.
    peak_host_gib: float
    switches_per_minute: float

    @property
    def worst_slowdown(self) -> float:
        return max(self.slowdown.values())


def _overlap(intervals: Sequence[tuple[float, float]], start: float, end: float) -> float:
    return sum(max(0.0, min(end, b) - max(start, a)) for a, b in intervals)


def _busy(run: GroupRun, start: float, end: float) -> float:
    if end <= start:
        return 0.0
    work = sum(_overlap(t.work, start, end) * t.gpus for t in run.jobs.values())
    return work / (run.gpus * (end - start))


def _figures(
    run: GroupRun, specs: Sequence[JobSpec], start: float, end: float, slowdown: dict[str, float]
) -> GroupPrediction:
    minutes = (end - start) / 60
    return GroupPrediction(
        jobs=[s.name for s in specs],
        busy=_busy(run, start, end),
        slowdown=slowdown,
        peak_host_gib=run.peak_host_bytes / GIB,
        switches_per_minute=run.switches / minutes if minutes > 0 else 0.0,
    )


def steady_state(run: GroupRun, specs: Sequence[JobSpec]) -> GroupPrediction:
    """Between the moment every job is past its start-up and the end of the run:
    each job's iterations in that window, and the busy fraction they add up to."""
    traces = run.jobs
    start = max(t.boundaries[min(WARMUP_ITERATIONS, len(t.boundaries) - 1)]
                for t in traces.values())  # fmt: skip
    end = run.end
    iteration = {s.name: _steady_iteration(traces[s.name], start, end) for s in specs}
    figures = _figures(run, specs, start, end, {
        s.name: iteration[s.name] / s.iteration_seconds for s in specs})  # fmt: skip
    # Each iteration holds the same GPU seconds, so the busy fraction is the
    # sum of the jobs' rates: exact over whole iterations, whatever the window.
    figures.busy = sum(s.gpu_seconds * s.gpus / iteration[s.name] for s in specs) / run.gpus
    return figures


def _steady_iteration(trace: JobTrace, start: float, end: float) -> float:
    inside = [b for b in trace.boundaries if start <= b <= end]
    if len(inside) >= 2:
        return (inside[-1] - inside[0]) / (len(inside) - 1)
    # Not one whole iteration in the window: at least the window itself.
    return end - start


def whole_run(run: GroupRun, specs: Sequence[JobSpec]) -> GroupPrediction:
    """From the first job's start to the last one's end, as a benchmark measures
    finite jobs: each job's slowdown is its run over its iterations alone."""
    traces = run.jobs
    start = min(t.started for t in traces.values())
    end = max(t.finished or run.end for t in traces.values())
    slowdown = {}
    for spec in specs:
        trace = traces[spec.name]
        iterations = max(1, len(trace.boundaries) - 1)
        took = (trace.finished or run.end) - trace.started
        slowdown[spec.name] = took / (iterations * spec.iteration_seconds)
    return _figures(run, specs, start, end, slowdown)
