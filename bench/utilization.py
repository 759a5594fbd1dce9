"""GPU busy fraction with and without sharing, for synthetic RL jobs on the real stack.

Default profile, after the llm-d time-slicing blog: two GRPO-like jobs 40 %
busy on dedicated GPUs; then sweeps (job counts, duty, co-residency, discard
hooks, blocking yields). `--backfill`: with a backfill job; `--profile
llmd-costs`: llm-d's recorded switch costs and duty. docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import time
from typing import Literal

from pydantic import BaseModel

from bench.parts.stack import running_stack
from timeshare import timeline
from timeshare.status import table
from timeshare.synthetic import load_report
from timeshare.testing import LocalStack
from timeshare.testing.clock_skew import skewed_environment

ITERATION_SECONDS = 2.5
# Sampler and trainer split the GPU time 60:40.
SAMPLE_SHARE = 0.6
# Per job, at 20 GB/s: 2 x 27 ms per switch, about 2 % of an iteration.
STATE_GIB, BANDWIDTH_GBPS = 0.5, 20.0
# Room for two jobs' state on the simulated GPU (used only where a group's
# policy allows co-residency); with a backfill job, room for all three.
ROOM, BACKFILL_ROOM = 2, 3
# Time for every job's process to start and join before the first iteration
# (a Python start on a loaded 2-core machine takes up to a few seconds).
START_LEAD_SECONDS = 5.0
BACKFILL_STEP_SECONDS = 0.05
# A backfill job that never looks at should_yield: its turns' steps, its grace.
IGNORING_TURN_STEPS, IGNORING_GRACE_SECONDS = 40, 0.5
# llm-d's recorded veRL GRPO run: one job took 137 min for about 10.5 steps
# (a step every 13 min), 55.5 % busy; two took 189 min, 87.1 % busy, one swap
# per step and GPU. Replayed LLMD_SCALE times faster.
LLMD_SCALE = 100.0
LLMD_STEP_SECONDS, LLMD_DUTY = 13 * 60.0, 0.555
LLMD_CHECKPOINT_SECONDS, LLMD_RESTORE_SECONDS = 21.3, 2.5  # medians, recorded
RECORDED_BUSY, RECORDED_SPEEDUP = 0.871, 1.45
Variant = Literal["", "co-resident", "discard", "blocking-yields"]
Costs = Literal["blog", "llmd-costs"]
# "steps": a backfill job that steps aside at a step boundary; "ignores": one
# that never looks, preempted after a short grace.
Backfill = Literal["", "steps", "ignores"]


class Profile(BaseModel):
    jobs: int
    duty: float
    variant: Variant = ""
    costs: Costs = "blog"
    backfill: Backfill = ""
    switch_cost_aware: bool = True

    @property
    def label(self) -> str:
        parts = [self.variant, "llmd" * (self.costs == "llmd-costs"), self.backfill,
                 "unaware" * (not self.switch_cost_aware)]  # fmt: skip
        return "-".join(["util", str(self.jobs), str(int(self.duty * 100)), *filter(None, parts)])

    def options(self) -> list[str]:
        """Every job's (any may be the one whose join creates the group)."""
        v, ignores = self.variant, self.backfill == "ignores"
        return [f"--co-residency={'auto' if v == 'co-resident' else 'off'}",
                *["--hooks=discard"] * (v == "discard"),
                *["--blocking-yields"] * (v == "blocking-yields"),
                *[f"--backfill-grace-seconds={IGNORING_GRACE_SECONDS}"] * ignores,
                f"--switch-cost-aware={'on' if self.switch_cost_aware else 'off'}"]  # fmt: skip

    def backfill_options(self) -> list[str]:
        ignoring = [f"--ignore-should-yield={IGNORING_TURN_STEPS}"] * (self.backfill == "ignores")
        return ["--backfill", "--iterations=10000000", f"--step-seconds={BACKFILL_STEP_SECONDS}",
                *ignoring, *self.options()]  # fmt: skip

    def phases(self) -> tuple[float, float, float]:
        iteration = LLMD_STEP_SECONDS / LLMD_SCALE if self.costs != "blog" else ITERATION_SECONDS
        gpu = iteration * self.duty
        return gpu * SAMPLE_SHARE, iteration - gpu, gpu * (1 - SAMPLE_SHARE)

    def job_options(self) -> list[str]:
        """A regular job's iteration; llm-d's: a GPU block, then the wait for its other GPU."""
        sample, reward, train = self.phases()
        if self.costs == "llmd-costs":
            return [f"--iteration=gpu:{sample + train:.4f}:step,cpu:{reward:.4f}"]
        return [f"--sample-seconds={sample}", f"--reward-seconds={reward}",
                f"--train-seconds={train}"]  # fmt: skip


def stack_options(costs: Costs, room: int) -> dict[str, object]:
    """The simulated GPU: llm-d's switch times (scaled) for each job's state, or 20 GB/s."""
    gb = STATE_GIB * 2**30 / 1e9 * LLMD_SCALE
    return {"backend": "app+sim", "state_gib": STATE_GIB, "capacity_gib": room * STATE_GIB,
            **({"bandwidth_gbps": BANDWIDTH_GBPS} if costs == "blog" else {
                "bandwidth_gbps": gb / LLMD_CHECKPOINT_SECONDS,
                "restore_bandwidth_gbps": gb / LLMD_RESTORE_SECONDS})}  # fmt: skip


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
    # Busy while every job runs (not while one job starts or finishes alone).
    all_running_util: float = 0.0
    # Backfill busy; longest regular wait behind it, longest switch in one; grace.
    backfill_util: float = 0.0
    longest_wait_s: float = 0.0
    wait_switch_s: float = 0.0
    grace_s: float = 0.0

    @property
    def slowdown(self) -> float:
        return self.shared_iteration_s / self.alone_iteration_s

    @property
    def speedup(self) -> float:  # the jobs' throughput taking turns, against one's alone
        return self.profile.jobs / self.slowdown


def measure(stack: LocalStack, profile: Profile, iterations: int, turns: bool = False) -> Result:
    """``turns``: print the run's chart and each turn (waits, switches, holds)."""
    group = profile.label
    paths = [stack.workdir / f"{group}-job-{i}.json" for i in range(profile.jobs)]
    # Every job starts at one moment (each 0.2 s after the last), however slow its start.
    start_at = time.time() + START_LEAD_SECONDS
    jobs = [stack.job(group, f"job-{i}", path, f"--iterations={iterations}", *profile.job_options(),
                      f"--start-delay-seconds={0.2 * i}", f"--start-at={start_at}",
                      *profile.options()) for i, path in enumerate(paths)]  # fmt: skip
    backfill_path = stack.workdir / f"{group}-backfill.json"
    backfill = [stack.job(group, "backfill", backfill_path, f"--start-at={start_at}",
                          *profile.backfill_options())] if profile.backfill else []  # fmt: skip
    if any(job.wait(600) for job in jobs):
        raise RuntimeError(f"a job of {group} failed; see {stack.workdir}")
    for job in backfill:
        job.terminate()  # it leaves its group and writes its record
        job.wait(60)
    regular = [load_report(path) for path in paths]
    reports = regular + [load_report(backfill_path) for _ in backfill]
    if turns:
        print(f"{group}:\n{timeline.chart(reports)}\n{timeline.turns_table(reports)}", flush=True)
    figures = timeline.utilisation(regular)
    start, end = min(r.started for r in regular), max(r.finished for r in regular)
    switch_frac = figures.switch_seconds / figures.span_seconds
    moved = sum(e["bytes"] for e in stack.record()
                if e.get("group") == group and e["event"] in ("checkpoint", "restore"))  # fmt: skip
    status = stack.group(group)
    waits = timeline.waits_behind(stack.history(group), {"backfill"}) if backfill else []
    return Result(
        profile=profile,
        baseline_util=figures.dedicated_utilisation,
        shared_util=timeline.busy_between(reports, start, end),
        ideal_util=min(1.0, profile.jobs * profile.duty) - switch_frac,
        switch_frac=switch_frac,
        overhead_frac=timeline.idle_while_waiting(regular) / figures.span_seconds - switch_frac,
        alone_iteration_s=figures.dedicated_gpu_seconds / (profile.jobs * iterations),
        shared_iteration_s=sum(r.finished - r.started for r in regular)
        / (profile.jobs * iterations),
        moved_gib_per_switch=moved / 2**30 / max(1, status.switches),
        switches=status.switches,
        prefetched=max(0, status.switches - figures.switches),
        all_running_util=timeline.busy_while_all_run(regular),
        backfill_util=timeline.busy_between(reports[profile.jobs :], start, end),
        longest_wait_s=max((wait for wait, _ in waits), default=0.0),
        wait_switch_s=max((switch for _, switch in waits), default=0.0),
        grace_s=status.policy.backfill_grace_seconds,
    )


def run_profiles(
    profiles: list[Profile], iterations: int, turns: bool, room: int, skew: float = 0.0
) -> list[Result]:
    """Each profile in turn, on one stack (every profile of one kind of costs);
    ``skew``: the gateway's wall clock runs that many seconds ahead (negative: behind)."""
    results = []
    options = stack_options(profiles[0].costs, room)
    if skew:
        options["part_env"] = {"gateway": skewed_environment(skew, {})}
    with running_stack(None, **options) as stack:
        for profile in profiles:
            results.append(r := measure(stack, profile, iterations, turns))
            print(f"{profile.label}: {r.baseline_util:.0%} -> {r.shared_util:.0%}", flush=True)
    return results


def sweep(quick: bool) -> list[Profile]:
    """The default profile, job counts, duty cycles, variants (not quick: blocking yields)."""
    counts = [(2, 0.25), (3, 0.4), (3, 0.25)] + ([] if quick else [(4, 0.4), (4, 0.25)])
    variants: list[tuple[int, Variant]] = [(2, "co-resident"), (3, "co-resident"), (2, "discard")]
    variants += [] if quick else [(2, "blocking-yields")]
    return [Profile(jobs=2, duty=0.4), *(Profile(jobs=n, duty=d) for n, d in counts),
            *(Profile(jobs=n, duty=0.4, variant=v) for n, v in variants)]  # fmt: skip


def cost_runs(costs: Costs, backfill: bool) -> list[Profile]:
    """Two jobs (llm-d's: also cost-unaware), then (``backfill``) with a backfill job: the
    blog's state moved at each switch, then co-resident; then one ignoring should_yield."""
    llmd = costs == "llmd-costs"
    mine = Profile(jobs=2, duty=LLMD_DUTY if llmd else 0.4, costs=costs)
    runs = [mine, *[mine.model_copy(update={"switch_cost_aware": False})] * llmd]
    pairs = [mine] if llmd else [mine, mine.model_copy(update={"variant": "co-resident"})]
    more = [p for m in pairs for p in [m, m.model_copy(update={"backfill": "steps"})]][1:]
    more += [] if llmd else [mine.model_copy(update={"backfill": "ignores"})]
    return runs + more * backfill


def describe(profile: Profile, iterations: int, room: int) -> str:
    sample, reward, train = profile.phases()
    if profile.costs == "llmd-costs":
        return (f"llmd-costs profile, SIMULATED, {LLMD_SCALE:g}x faster than llm-d's recorded "
                f"run: 2 jobs; per iteration (a recorded step) {sample + train:.2f} s on the GPU, "
                f"{reward:.2f} s off it (duty {profile.duty:.1%}); checkpoint "
                f"{LLMD_CHECKPOINT_SECONDS / LLMD_SCALE:.3f} s, restore "
                f"{LLMD_RESTORE_SECONDS / LLMD_SCALE:.3f} s; {iterations} iterations")  # fmt: skip
    return (f"default profile: 2 jobs; per iteration sample {sample:.2f} s + train {train:.2f} s "
            f"on the GPU, reward {reward:.2f} s on the CPU (duty 40 %); {STATE_GIB} GiB of state "
            f"per job at {BANDWIDTH_GBPS:g} GB/s (SIMULATED GPU, room for "
            f"{room} jobs' state where co-residency is on); "
            f"{iterations} iterations per job")  # fmt: skip


def print_rows(results: list[Result]) -> None:
    rows = [[
        str(r.profile.jobs), f"{r.profile.duty:.0%}", r.profile.variant or "-",
        r.profile.backfill or "-", "on" if r.profile.switch_cost_aware else "off",
        f"{r.baseline_util:.0%}", f"{r.shared_util:.1%}", f"{r.ideal_util:.0%}",
        f"{r.switch_frac:.1%}", f"{r.overhead_frac:.1%}", f"{r.alone_iteration_s:.2f}",
        f"{r.shared_iteration_s:.2f}", f"{r.slowdown:.2f}x", f"{r.moved_gib_per_switch:.2f}",
        f"{r.switches} ({r.prefetched})", f"{r.all_running_util:.0%}",
        f"{r.backfill_util:.1%}" if r.profile.backfill else "-"] for r in results]  # fmt: skip
    headers = ["jobs", "duty", "variant", "backfill", "cost-aware", "busy alone", "busy shared",
               "ideal", "switching", "sched. overhead", "iter alone s", "iter shared s",
               "slowdown", "GiB moved/switch", "switches (ahead)", "busy, all running",
               "backfill busy"]  # fmt: skip
    print("\n" + table(headers, rows))


def print_costs(costs: Costs, results: list[Result]) -> None:
    """cost_runs' figures: with backfill against without, waits, llm-d's recorded figures."""
    alone, *others = results
    print(f"busy_shared={alone.shared_util:.3f} iteration_s={alone.shared_iteration_s:.3f} "
          f"speedup={alone.speedup:.2f}" + "".join(
              f" recorded_busy={RECORDED_BUSY} recorded_speedup={RECORDED_SPEEDUP} "
              f"unaware_busy_shared={r.shared_util:.3f} unaware_iteration_s="
              f"{r.shared_iteration_s:.3f} unaware_speedup={r.speedup:.2f}"
              for r in others if not r.profile.switch_cost_aware))  # fmt: skip
    for r in others:
        waits = (f"longest_wait_behind_backfill_s={r.longest_wait_s:.3f} "
                 f"grace_plus_switch_s={r.grace_s + r.wait_switch_s:.3f}")  # fmt: skip
        if r.profile.backfill == "steps":
            (base,) = [
                b for b in results if b.profile == r.profile.model_copy(update={"backfill": ""})
            ]
            ratio = r.shared_iteration_s / base.shared_iteration_s
            print(f"with backfill ({BACKFILL_STEP_SECONDS * 1000:g} ms steps, "
                  f"{r.profile.variant or 'state moved at each switch'}): busy_shared="
                  f"{r.shared_util:.3f} backfill_busy={r.backfill_util:.3f} "
                  f"regular_iteration_ratio={ratio:.3f} {waits}")  # fmt: skip
        elif r.profile.backfill == "ignores":
            print(f"backfill ignoring should_yield, grace {r.grace_s:g} s: {waits}")
    if costs == "llmd-costs":
        print("A replay of llm-d's recorded switch costs and duty, scaled in time, by synthetic "
              "jobs on a SIMULATED GPU: not a run of veRL; the recorded figures stand beside it "
              "for scale, not as a like-for-like race.")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description="GPU busy fraction with and without sharing.")
    parser.add_argument("--quick", action="store_true", help="fewer iterations and profiles")
    parser.add_argument("--timeline", action="store_true", help="print each run's turns")
    parser.add_argument("--profile", choices=["blog", "llmd-costs"], default="blog", help="llmd-"
                        "costs: llm-d's recorded switch costs and duty, scaled")  # fmt: skip
    parser.add_argument("--backfill", action="store_true", help="two jobs without, then with a "
                        "backfill job in their group")  # fmt: skip
    parser.add_argument("--gateway-clock-skew", type=float, default=0.0, metavar="SECONDS",
                        help="the gateway's wall clock this far ahead (negative: behind) of "
                             "Temporal's (default 0)")  # fmt: skip
    args = parser.parse_args()
    iterations = 4 if args.quick else 10
    plain = args.profile == "blog" and not args.backfill
    profiles = sweep(args.quick) if plain else cost_runs(args.profile, args.backfill)
    room = BACKFILL_ROOM if args.backfill and args.profile == "blog" else ROOM
    print(describe(profiles[0], iterations, room), flush=True)
    if args.gateway_clock_skew:
        print(f"the gateway's clock runs {args.gateway_clock_skew:+g} s off Temporal's", flush=True)
    results = run_profiles(profiles, iterations, args.timeline, room, args.gateway_clock_skew)
    # One that ignores should_yield steps on, unfrozen, when preempted: its busy is not GPU time.
    print_rows([r for r in results if r.profile.backfill != "ignores"])
    if not plain:
        return print_costs(args.profile, results)
    d = results[0]
    print(f"baseline_util={d.baseline_util:.3f} shared_util={d.shared_util:.3f} ideal_util="
          f"{d.ideal_util:.3f} switch_frac={d.switch_frac:.3f} slowdown={d.slowdown:.3f} "
          f"all_running_util={d.all_running_util:.3f} prefetched={d.prefetched}/{d.switches}"
          + "".join(f" {v}_util={r.shared_util:.3f} {v}_switch_frac={r.switch_frac:.3f}"
                    for r in results if (v := r.profile.variant.replace("-", "_"))
                    and r.profile.jobs == 2))  # fmt: skip


if __name__ == "__main__":
    main()
