"""GPU busy fraction with and without sharing, for synthetic RL jobs on the real stack.

Default profile, after the llm-d time-slicing blog: two GRPO-like jobs busy
40 % of the time on dedicated GPUs (sampler and trainer on the GPU, reward
on the CPU). Then sweeps of job counts and duty cycles, with co-residency,
with hooks asking for discard mode (the agent runs `app+sim`) and with
blocking yields: docs/benchmarks.md, "Utilisation gained".

    python -m bench utilization           # about 5 minutes
    python -m bench utilization --quick   # about 1 minute
    python -m bench utilization --pairs 4 # yield_nowait against blocking yields, 4 min
    python -m bench utilization --pairs 1 --timeline  # and every turn of each run
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Literal

from pydantic import BaseModel

from bench.parts.stack import running_stack
from timeshare.status import table
from timeshare.synthetic import SyntheticJobReport, load_report
from timeshare.testing import LocalStack
from timeshare.timeline import GPU_PHASES, chart, turns_table, utilisation

ITERATION_SECONDS = 2.5
# Sampler and trainer split the GPU time 60:40.
SAMPLE_SHARE = 0.6
# Per job, at 20 GB/s: 2 x 27 ms per switch, about 2 % of an iteration.
STATE_GIB = 0.5
BANDWIDTH_GBPS = 20.0
# Room for two jobs' state on the simulated GPU (used only where a group's
# policy allows co-residency).
CAPACITY_GIB = 2 * STATE_GIB
# Time for every job's process to start and join before the first iteration
# (a Python start on a loaded 2-core machine takes up to a few seconds).
START_LEAD_SECONDS = 5.0
Variant = Literal["", "co-resident", "discard", "blocking-yields"]


class Profile(BaseModel):
    jobs: int
    duty: float
    variant: Variant = ""

    @property
    def label(self) -> str:
        return f"util-{self.jobs}-{int(self.duty * 100)}{'-' if self.variant else ''}{self.variant}"

    def options(self) -> list[str]:
        co_residency = "auto" if self.variant == "co-resident" else "off"
        hooks = ["--hooks=discard"] if self.variant == "discard" else []
        blocking = ["--blocking-yields"] if self.variant == "blocking-yields" else []
        return [f"--co-residency={co_residency}", *hooks, *blocking]

    def phases(self) -> tuple[float, float, float]:
        gpu = ITERATION_SECONDS * self.duty
        return gpu * SAMPLE_SHARE, ITERATION_SECONDS - gpu, gpu * (1 - SAMPLE_SHARE)


class Result(BaseModel):
    profile: Profile
    baseline_util: float
    shared_util: float
    ideal_util: float
    switch_frac: float
    overhead_frac: float
    alone_iteration_s: float
    shared_iteration_s: float
    # Simulated device state moved (checkpoints and restores), per switch.
    moved_gib_per_switch: float
    # Switches made ahead of a request (prefetch), of all the group made.
    switches: int = 0
    prefetched: int = 0
    # Busy while every job runs: the run without its ends (one job starting
    # or finishing alone).
    all_running_util: float = 0.0

    @property
    def slowdown(self) -> float:
        return self.shared_iteration_s / self.alone_iteration_s


def measure(stack: LocalStack, profile: Profile, iterations: int, timeline: bool = False) -> Result:
    """``timeline``: print the run's chart and each turn (who waited, for
    which switch, how long it was held)."""
    sample, reward, train = profile.phases()
    group = profile.label
    paths = [stack.workdir / f"{group}-job-{i}.json" for i in range(profile.jobs)]
    # Every job starts from one moment, each 0.2 s after the one before,
    # however long its process took to start and join.
    start_at = time.time() + START_LEAD_SECONDS
    jobs = [
        stack.job(
            group, f"job-{i}", path, f"--iterations={iterations}",
            f"--sample-seconds={sample}", f"--reward-seconds={reward}",
            f"--train-seconds={train}", f"--start-delay-seconds={0.2 * i}",
            f"--start-at={start_at}", *profile.options(),
        )
        for i, path in enumerate(paths)
    ]  # fmt: skip
    if any(job.wait(600) for job in jobs):
        raise RuntimeError(f"a job of {group} failed; see {stack.workdir}")
    reports = [load_report(path) for path in paths]
    if timeline:
        print(f"{group}:\n{chart(reports)}\n{turns_table(reports)}", flush=True)
    figures = utilisation(reports)
    switch_frac = figures.switch_seconds / figures.span_seconds
    alone = sum(p.end - p.start for r in reports for p in r.phases) / (profile.jobs * iterations)
    shared = sum(r.finished - r.started for r in reports) / (profile.jobs * iterations)
    moved = sum(
        e["bytes"] for e in stack.record()
        if e.get("group") == group and e["event"] in ("checkpoint", "restore")
    )  # fmt: skip
    switches = stack.group(group).switches
    return Result(
        profile=profile,
        baseline_util=figures.dedicated_utilisation,
        shared_util=figures.shared_utilisation,
        ideal_util=min(1.0, profile.jobs * profile.duty) - switch_frac,
        switch_frac=switch_frac,
        overhead_frac=idle_while_waiting(reports) / figures.span_seconds - switch_frac,
        alone_iteration_s=alone,
        shared_iteration_s=shared,
        moved_gib_per_switch=moved / 2**30 / max(1, switches),
        switches=switches,
        prefetched=max(0, switches - figures.switches),
        all_running_util=busy_while_all_run(reports),
    )


def busy_while_all_run(reports: list[SyntheticJobReport]) -> float:
    """The GPU's busy fraction from the last job's start to the first job's end."""
    start = max(r.started for r in reports)
    end = min(r.finished for r in reports)
    busy = sum(
        max(0.0, min(p.end, end) - max(p.start, start))
        for r in reports for p in r.phases if p.phase in GPU_PHASES
    )  # fmt: skip
    return busy / (end - start) if end > start else 0.0


def idle_while_waiting(reports: list[SyntheticJobReport], step: float = 0.001) -> float:
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


def run_profiles(profiles: list[Profile], iterations: int, timeline: bool = False) -> list[Result]:
    """Each profile in turn, on one stack."""
    results = []
    with running_stack(
        backend="app+sim", state_gib=STATE_GIB, bandwidth_gbps=BANDWIDTH_GBPS,
        capacity_gib=CAPACITY_GIB,
    ) as stack:  # fmt: skip
        for profile in profiles:
            results.append(measure(stack, profile, iterations, timeline))
            r = results[-1]
            print(f"{profile.jobs} jobs at {profile.duty:.0%} {profile.variant}: "
                  f"{r.baseline_util:.0%} -> {r.shared_util:.0%}", flush=True)  # fmt: skip
    return results


def compare_yields(pairs: int, iterations: int, timeline: bool = False) -> None:
    """The default profile with Job.yield_nowait and with blocking yields,
    alternately ``pairs`` times on one stack: a ratio on a noisy machine."""
    default, blocking = Profile(jobs=2, duty=0.4), Profile(jobs=2, duty=0.4,
                                                           variant="blocking-yields")  # fmt: skip
    results = run_profiles([default, blocking] * pairs, iterations, timeline)
    rows = []
    for name, runs in (("yield_nowait", results[0::2]), ("blocking yields", results[1::2])):
        rows.append([
            name, " ".join(f"{r.shared_util:.3f}" for r in runs),
            f"{statistics.median(r.shared_util for r in runs):.3f}",
            f"{statistics.median(r.all_running_util for r in runs):.3f}",
            f"{statistics.median(r.shared_iteration_s for r in runs):.3f}",
        ])  # fmt: skip
    print("\n" + table(["yields", "busy shared, each run", "median", "median busy, all running",
                        "median iteration s"], rows))  # fmt: skip
    nowait = statistics.median(r.shared_util for r in results[0::2])
    waited = statistics.median(r.shared_util for r in results[1::2])
    print(f"pairs={pairs} nowait_util={nowait:.3f} blocking_util={waited:.3f} "
          f"gain={nowait - waited:+.3f}")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description="GPU busy fraction with and without sharing.")
    parser.add_argument("--quick", action="store_true", help="fewer iterations and profiles")
    parser.add_argument("--pairs", type=int, metavar="N", help="only the default profile, with "
                        "yield_nowait and with blocking yields, alternately N times")  # fmt: skip
    parser.add_argument("--timeline", action="store_true", help="print each run's chart and "
                        "turns (waits, switches, holds)")  # fmt: skip
    args = parser.parse_args()
    iterations = 4 if args.quick else 10
    if args.pairs:
        compare_yields(args.pairs, iterations, args.timeline)
        return
    profiles = [Profile(jobs=2, duty=0.4)]
    sweep = [(2, 0.25), (3, 0.4), (3, 0.25)] if args.quick else [
        (2, 0.25), (3, 0.4), (3, 0.25), (4, 0.4), (4, 0.25)]  # fmt: skip
    profiles += [Profile(jobs=n, duty=d) for n, d in sweep]
    profiles += [
        Profile(jobs=2, duty=0.4, variant="co-resident"),
        Profile(jobs=3, duty=0.4, variant="co-resident"),
        Profile(jobs=2, duty=0.4, variant="discard"),
    ]
    if not args.quick:
        # The default profile as before Job.yield_nowait, side by side.
        profiles.append(Profile(jobs=2, duty=0.4, variant="blocking-yields"))
    sample, reward, train = profiles[0].phases()
    print(
        f"default profile: 2 jobs; per iteration sample {sample:.2f} s + train {train:.2f} s "
        f"on the GPU, reward {reward:.2f} s on the CPU (duty 40 %); "
        f"{STATE_GIB} GiB of state per job at {BANDWIDTH_GBPS:g} GB/s (SIMULATED GPU, "
        f"room for {CAPACITY_GIB / STATE_GIB:g} jobs' state where co-residency is on); "
        f"{iterations} iterations per job",
        flush=True,
    )
    results = run_profiles(profiles, iterations, args.timeline)
    rows = [
        [
            str(r.profile.jobs), f"{r.profile.duty:.0%}", r.profile.variant or "-",
            f"{r.baseline_util:.0%}",
            f"{r.shared_util:.0%}", f"{r.ideal_util:.0%}", f"{r.switch_frac:.1%}",
            f"{r.overhead_frac:.1%}", f"{r.alone_iteration_s:.2f}", f"{r.shared_iteration_s:.2f}",
            f"{r.slowdown:.2f}x", f"{r.moved_gib_per_switch:.2f}",
            f"{r.switches} ({r.prefetched})", f"{r.all_running_util:.0%}",
        ]
        for r in results
    ]  # fmt: skip
    headers = ["jobs", "duty", "variant", "busy alone", "busy shared", "ideal", "switching",
               "sched. overhead", "iter alone s", "iter shared s", "slowdown",
               "GiB moved/switch", "switches (ahead)", "busy, all running"]  # fmt: skip
    print("\n" + table(headers, rows))
    d = results[0]
    by_variant = {
        r.profile.variant: r for r in results if r.profile.jobs == 2 and r.profile.duty == 0.4
    }
    print(
        f"baseline_util={d.baseline_util:.3f} shared_util={d.shared_util:.3f} "
        f"ideal_util={d.ideal_util:.3f} switch_frac={d.switch_frac:.3f} slowdown={d.slowdown:.3f} "
        f"all_running_util={d.all_running_util:.3f} prefetched={d.prefetched}/{d.switches} "
        f"co_resident_util={by_variant['co-resident'].shared_util:.3f} "
        f"co_resident_switch_frac={by_variant['co-resident'].switch_frac:.3f} "
        f"discard_util={by_variant['discard'].shared_util:.3f} "
        f"discard_switch_frac={by_variant['discard'].switch_frac:.3f}"
        + (
            f" blocking_yields_util={by_variant['blocking-yields'].shared_util:.3f}"
            if "blocking-yields" in by_variant
            else ""
        )
    )


if __name__ == "__main__":
    main()
