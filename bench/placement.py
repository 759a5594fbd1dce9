"""The placement advisor's predictions against real runs of the groups it plans, and its speed.

First the stack's own costs are measured (CALIBRATION: groups of the same
sizes as the plan's, running a reference profile of their own on the same
agents at the same time); the jobs are planned with them; the planned groups
run together on the sim stack (one sim agent per GPU set, each job a
synthetic job following its profile's iteration), and the model predicts
each group's finite run from the moment each job really started. "in-run"
repeats the prediction with the costs the planned run itself showed (plain
means over all its groups): how much of the error is the stack's latencies
drifting (the host is shared; the load average is printed), not the model.

    python -m bench placement           # 10 iterations per job, about 3 minutes
    python -m bench placement --quick   # 4 iterations, about 1.5 minutes
    python -m bench placement --speed   # how fast it models and plans: CPU only, no stack

The last line: max_util_error (largest |predicted - measured| busy fraction
of a group: 0.03 is 3 points) and max_slowdown_error (largest |predicted -
measured| / measured slowdown of a job).
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import timeshare
from bench.parts.placement_costs import CostSamples
from bench.parts.stack import running_stack
from timeshare import timeline
from timeshare.models import GroupPolicy
from timeshare.placement.evaluate import Evaluator
from timeshare.placement.figures import GroupPrediction, whole_run
from timeshare.placement.load import load_plan_input
from timeshare.placement.model import GroupModel
from timeshare.placement.plan import PlanFile, make_plan
from timeshare.placement.search import PlanError
from timeshare.placement.spec import GpuSets, JobSpec, Phase, PlanInput, StackCosts
from timeshare.status import table
from timeshare.synthetic import SyntheticJobReport, load_report
from timeshare.testing import LocalStack

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "placement" / "jobs.yaml"
# The calibration's own jobs: sample, reward, train, 2 GiB moved each way.
CALIBRATION = [Phase(gpu=0.4), Phase(cpu=1.0), Phase(gpu=0.2)]
CALIBRATION_STATE_GIB = 2.0
CALIBRATION_ITERATIONS = 5
START_SPACING_SECONDS = 0.2
# Seconds of each phase, drawn uniformly between these.
SPEED_PHASE_BOUNDS = [(0.5, 6.0), (2.0, 12.0), (0.3, 4.0)]
SPEED_SETS = GpuSets(count=100, gpu_memory_gib=80, host_memory_gib=512, bandwidth_gbps=25)


def iteration_option(phases: list[Phase]) -> str:
    parts = [
        f"gpu:{p.seconds}{f':{p.phase}' if p.phase else ''}" if p.on_gpu else f"cpu:{p.seconds}"
        for p in phases
    ]
    return "--iteration=" + ",".join(parts)


class Measured:
    def __init__(self, reports: list[SyntheticJobReport], iterations: int) -> None:
        self.reports = reports
        start = min(r.started for r in reports)
        self.busy = timeline.busy_between(reports, start, max(r.finished for r in reports))
        self.starts = {r.spec.job: r.started - start for r in reports}
        self.iteration_seconds = {
            r.spec.job: (r.finished - r.started) / iterations for r in reports
        }


def run_groups(
    stack: LocalStack,
    groups: list[tuple[str, str, list[JobSpec]]],
    iterations: int,
    co_residency: str,
) -> dict[str, tuple[list[SyntheticJobReport], timeshare.history.GroupHistory]]:
    """Run every group's jobs at once; each group's reports and history."""
    launched = []
    for group, node, jobs in groups:
        for index, job in enumerate(jobs):
            report = stack.workdir / f"{group}-{job.name}.json"
            process = stack.job(
                group, job.name, report, f"--iterations={iterations}",
                iteration_option(job.iteration), f"--weight={job.weight}",
                f"--priority={job.priority}",
                f"--co-residency={co_residency}",
                f"--start-delay-seconds={START_SPACING_SECONDS * index}", nodes=[node],
            )  # fmt: skip
            launched.append((group, report, process))
    failed = [group for group, _, process in launched if process.wait(900)]
    if failed:
        raise RuntimeError(f"jobs of {sorted(set(failed))} failed; see the logs in {stack.workdir}")
    results = {}
    with timeshare.connect(stack.address) as client:
        for group, _, _ in groups:
            reports = [load_report(r) for g, r, _ in launched if g == group]
            results[group] = (reports, client.group_history(group))
    return results


def calibrate(stack: LocalStack, plan: PlanFile, plan_input: PlanInput) -> StackCosts:
    groups = [
        (f"calibrate-{g.node}", g.node,
         [JobSpec(name=f"cal-{g.node}-{i}", state_gib=CALIBRATION_STATE_GIB, iteration=CALIBRATION)
          for i in range(len(g.jobs))])
        for g in plan.groups
    ]  # fmt: skip
    samples = CostSamples()
    bandwidth = plan_input.gpu_sets.bandwidth_bytes_per_second
    for reports, history in run_groups(stack, groups, CALIBRATION_ITERATIONS, "off").values():
        samples.add(reports, history, bandwidth)
    print(f"calibration: {samples.counts()}", flush=True)
    return samples.costs()


def predict(plan_input: PlanInput, jobs: list[JobSpec], measured: Measured, costs: StackCosts,
            iterations: int) -> GroupPrediction:  # fmt: skip
    model = GroupModel(jobs, plan_input.gpu_sets, plan_input.policy, costs)
    return whole_run(model.run(iterations, starts=measured.starts), jobs)


def costs_line(costs: StackCosts) -> str:
    return ", ".join(f"{name.removesuffix('_seconds')} {value * 1000:.0f} ms"
                     for name, value in costs.model_dump().items())  # fmt: skip


def mixed_jobs(count: int, seed: int = 7) -> list[JobSpec]:
    """RL-like jobs: sample, reward, train, with duty cycles from about 10 % to 60 %."""
    chooser = random.Random(seed)
    jobs = []
    for index in range(count):
        sample, reward, train = (chooser.uniform(*bounds) for bounds in SPEED_PHASE_BOUNDS)
        iteration = [Phase(gpu=sample), Phase(cpu=reward), Phase(gpu=train)]
        state_gib = chooser.choice([8.0, 16.0, 24.0, 40.0])
        jobs.append(JobSpec(name=f"job-{index}", state_gib=state_gib, iteration=iteration))
    return jobs


def seconds_of(action: Callable[[], object], repeat: int = 1) -> tuple[float, float]:
    """The minimum and median seconds of ``repeat`` runs."""
    seconds = []
    for _ in range(repeat):
        start = time.perf_counter()
        action()
        seconds.append(time.perf_counter() - start)
    return min(seconds), statistics.median(seconds)


def speed() -> None:
    four = mixed_jobs(4)
    model_min, model_median = seconds_of(
        lambda: GroupModel(four, SPEED_SETS, GroupPolicy(), StackCosts()).run(100), repeat=7
    )
    print(f"model, 4 jobs x 100 iterations: {model_min:.3f} s (median {model_median:.3f} s)")
    ten = PlanInput(jobs=mixed_jobs(10), gpu_sets=SPEED_SETS, max_slowdown=1.5)
    exact, _ = seconds_of(lambda: make_plan(Evaluator(ten)))
    print(f"exact search, 10 jobs: {exact:.1f} s")
    hundred = PlanInput(jobs=mixed_jobs(100), gpu_sets=SPEED_SETS, max_slowdown=1.5)
    plans: list[PlanFile] = []
    heuristic, _ = seconds_of(lambda: plans.append(make_plan(Evaluator(hundred))))
    s = plans[0].summary
    print(
        f"heuristic search, 100 jobs: {heuristic:.1f} s ({s.sets_used} sets, busy "
        f"{s.plan_util:.0%}; dedicated {s.sets_dedicated} sets, busy {s.dedicated_util:.0%})"
    )
    print(f"model_4x100_s={model_min:.3f} exact_10_s={exact:.1f} heuristic_100_s={heuristic:.1f}")


def main() -> None:
    parser = argparse.ArgumentParser(description="Placement predictions against real runs.")
    parser.add_argument("--quick", action="store_true", help="4 iterations per job, not 10")
    parser.add_argument("--file", type=Path, default=EXAMPLE, help="jobs and GPU sets (YAML)")
    parser.add_argument("--keep", type=Path, help="keep the logs and the jobs' records here")
    parser.add_argument("--speed", action="store_true", help="how fast it plans (CPU only)")
    args = parser.parse_args()
    if args.speed:
        speed()
        return
    iterations = 4 if args.quick else 10
    load_before = os.getloadavg()[0]
    plan_input = load_plan_input(args.file)
    sets = plan_input.gpu_sets
    first = make_plan(Evaluator(plan_input))
    nodes = [g.node for g in first.groups]
    if args.keep:
        args.keep.mkdir(parents=True, exist_ok=True)
    with running_stack(
        args.keep, node=nodes[0], more_nodes=nodes[1:], backend="sim",
        state_gib=CALIBRATION_STATE_GIB, bandwidth_gbps=sets.bandwidth_gbps,
        capacity_gib=sets.gpu_memory_gib,
        job_state_gib={j.name: j.state_gib or 0.0 for j in plan_input.jobs},
    ) as stack:  # fmt: skip
        costs = calibrate(stack, first, plan_input)
        print(f"measured stack costs: {costs_line(costs)}", flush=True)
        plan_input = plan_input.model_copy(update={"costs": costs})
        try:
            plan = make_plan(Evaluator(plan_input))
        except PlanError as error:
            raise SystemExit(
                f"bench.placement: with the stack's costs as measured now: {error}; "
                "the machine is busy, try again when it is quieter"
            ) from None
        for group in plan.groups:
            if group.node not in stack.nodes:
                stack.more_nodes.append(group.node)
                stack.start(stack.agent(group.node))
        by_name = {j.name: j for j in plan_input.jobs}
        groups = [(g.group, g.node, [by_name[j] for j in g.jobs]) for g in plan.groups]
        print(f"running {len(groups)} planned groups, {iterations} iterations per job",
              flush=True)  # fmt: skip
        results = run_groups(stack, groups, iterations, plan_input.policy.co_residency)
    print(f"load average (1 min) at the start {load_before:.1f}, at the end "
          f"{os.getloadavg()[0]:.1f}, on {os.cpu_count()} cores", flush=True)  # fmt: skip
    report(plan_input, plan, groups, results, iterations, costs)


def report(
    plan_input: PlanInput,
    plan: PlanFile,
    groups: list[tuple[str, str, list[JobSpec]]],
    results: dict[str, tuple[list[SyntheticJobReport], timeshare.history.GroupHistory]],
    iterations: int,
    costs: StackCosts,
) -> None:
    rows = []
    util_errors, slowdown_errors = [], []
    # The costs the planned run itself showed, over all its groups (as the
    # calibration's are over all of its own).
    samples = CostSamples()
    for reports, history in results.values():
        samples.add(reports, history, plan_input.gpu_sets.bandwidth_bytes_per_second)
    in_run = samples.costs(capped=False)
    for name, _, jobs in groups:
        reports, history = results[name]
        measured = Measured(reports, iterations)
        predicted = predict(plan_input, jobs, measured, costs, iterations)
        again = predict(plan_input, jobs, measured, in_run, iterations)
        steady = next(g for g in plan.groups if g.group == name)
        util_errors.append(abs(predicted.busy - measured.busy))
        rows.append([name, "(group busy)", f"{steady.predicted_busy:.1%}", f"{predicted.busy:.1%}",
                     f"{again.busy:.1%}", f"{measured.busy:.1%}",
                     f"{(predicted.busy - measured.busy) * 100:+.1f} pt"])  # fmt: skip
        for job in jobs:
            real = measured.iteration_seconds[job.name] / job.iteration_seconds
            guess = predicted.slowdown[job.name]
            slowdown_errors.append(abs(guess - real) / real)
            rows.append(["", job.name, f"{steady.predicted_slowdown[job.name]:.3f}x",
                         f"{guess:.3f}x", f"{again.slowdown[job.name]:.3f}x", f"{real:.3f}x",
                         f"{(guess - real) / real:+.1%}"])  # fmt: skip
    headers = ["group", "job", "plan (steady)", "predicted", "in-run costs", "measured", "error"]
    print("\n" + table(headers, rows))
    print(f"costs in the planned run: {costs_line(in_run)}")
    print(plan.summary.line())
    print(f"max_util_error={max(util_errors):.3f} max_slowdown_error={max(slowdown_errors):.3f}")


if __name__ == "__main__":
    main()
