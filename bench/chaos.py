"""Faults against a running stack, random or scripted: requests lost, double grants, overlaps.

Groups of jobs take turns on three simulated nodes while a seeded random
schedule SIGKILLs and restarts the scheduler worker, the gateway, the node
agents, job processes and the Temporal dev server (same SQLite file and
port); then the jobs finish their turns. What counts: bench.parts.chaos_check.

    python -m bench chaos --minutes N [--replicas N] [--workdir DIR]   # more: --help
    python -m bench chaos --scripted [--runs N | --quick]   # bench.parts.chaos_faults

With ``--replicas N``: N scheduler workers and N gateways; a fault kills one
replica while the others serve (a job goes on through another gateway).

Exit status 1 if any acquire was lost, any turn granted twice, any node held
two jobs' state, any group stuck, or any live job failed otherwise. For a
stuck group the run saves its history beside the records and prints the
nondeterminism errors the schedulers logged (bench.parts.chaos_stuck).
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from collections import Counter
from math import nan
from pathlib import Path

from bench.parts import chaos_check as check
from bench.parts import chaos_stuck
from bench.parts.chaos_faults import KINDS, SCRIPTED, Fault, inject, run_scripted
from bench.parts.chaos_pool import JobPool, JobSettings
from bench.parts.stack import running_stack
from bench.parts.stats import percentile
from timeshare.errors import TimeshareError
from timeshare.status import table
from timeshare.testing import LocalStack, overlaps

NODES = ["node-0", "node-1", "node-2"]
# Far longer than any outage the faults cause (up to 8 s down, then the
# restart): a live job must never lose its lease (see docs/reliability.md).
# A killed job replaced under a new name holds its group up this long.
LEASE_SECONDS = 30.0
AGENT_TIMEOUT_SECONDS = 5.0
# Often, so that runs end and waiting acquires move to the next run under faults too.
CONTINUE_AS_NEW_EVERY = 50
FAULT_GAP_SECONDS = (3.0, 9.0)
# Once the faults stop, every group must have served its waiters within this
# (a dead holder's lease, then a few switches): a group still with waiters
# after it is stuck.
SETTLE_SECONDS = LEASE_SECONDS + 60.0


def job_nodes(group: int, job: int) -> list[str]:
    """Two of the three nodes, a different pair for neighbouring jobs."""
    return [NODES[(group + job) % len(NODES)], NODES[(group + job + 1) % len(NODES)]]


def log(started: float, message: str) -> None:
    print(f"[{time.time() - started:7.1f} s] {message}", file=sys.stderr, flush=True)


def keep_up(stack: LocalStack, seconds: float, started: float, crashes: list[str]) -> None:
    """Wait, restarting any part that exits by itself (each one is a finding)."""
    until = time.time() + seconds
    while True:
        for name, process in list(stack.processes.items()):
            if process.poll() is not None:
                crashes.append(f"{name} exited by itself with code {process.returncode}")
                log(started, f"{crashes[-1]}; restarting it")
                stack.start(name)
        if time.time() >= until:
            return
        time.sleep(min(0.2, max(0.0, until - time.time())))


def run_faults(
    stack: LocalStack,
    pool: JobPool,
    kinds: list[str],
    rng: random.Random,
    started: float,
    crashes: list[str],
) -> list[Fault]:
    faults: list[Fault] = []
    until = pool.settings.until
    while True:
        gap = rng.uniform(*FAULT_GAP_SECONDS)
        if time.time() + gap >= until:
            keep_up(stack, max(0.0, until - time.time()), started, crashes)
            return faults
        keep_up(stack, gap, started, crashes)
        kind = rng.choice(kinds)
        if kind == "job" and not pool.running():
            continue
        fault = inject(kind, stack, pool, rng)
        faults.append(fault)
        log(started, f"fault {len(faults)}: kill -9 {fault.target}; {fault.outcome}; "
                     f"{check.turns_completed(pool.processes)} turns so far")  # fmt: skip


def groups_with_waiters(stack: LocalStack, groups: list[str]) -> list[str]:
    found = []
    for group in groups:
        try:
            status = stack.group(group)
        except TimeshareError as error:
            found.append(f"{group}: {error}")
            continue
        if status.queue:
            found.append(
                f"{group}: {status.state} {status.degraded_cause}, holder "
                f"{status.holder or 'none'}, waiting {', '.join(status.queue)}"
            )
    return found


def settle(
    stack: LocalStack, pool: JobPool, groups: list[str], started: float, crashes: list[str]
) -> list[str]:
    """Let the jobs finish their last turns; return the groups stuck with waiters."""
    deadline = time.time() + SETTLE_SECONDS
    while time.time() < deadline:
        keep_up(stack, 1.0, started, crashes)
        if not pool.running() and not groups_with_waiters(stack, groups):
            return []
    return groups_with_waiters(stack, groups)


def p50_and_max(values: list[float]) -> list[str]:
    return [f"{percentile(values, 50):.2f}", f"{max(values, default=nan):.2f}"]


def fault_table(faults: list[Fault], grants: list[float]) -> str:
    """Recovery by kind of fault: from the kill, and from the part being ready again."""
    rows = []
    for kind in KINDS:
        of_kind = [f for f in faults if f.kind == kind]
        rows.append([
            kind, str(len(of_kind)),
            *p50_and_max(check.recovery_seconds([f.at for f in of_kind], grants)),
            *p50_and_max(check.recovery_seconds([f.back_at for f in of_kind], grants)),
        ])  # fmt: skip
    headers = ["fault (kill -9)", "injected", "to next grant p50 s", "max s",
               "from restart p50 s", "max s"]  # fmt: skip
    return table(headers, rows)


def report(
    faults: list[Fault],
    pool: JobPool,
    stack: LocalStack,
    stuck: list[str],
    crashes: list[str],
    why_stuck: list[str],
) -> bool:
    """Print the figures; True if the run is clean."""
    processes = pool.processes
    grants = check.grant_times(processes)
    lost = check.lost(processes)
    double = check.double_grants(processes, time.time())
    errors = check.errors(processes)
    overlapping = overlaps(stack.record())
    print()
    print(fault_table(faults, grants))
    killed = sum(1 for p in processes if p.killed_at is not None)
    print(f"job processes: {len(processes)} started, {killed} killed and replaced")
    for title, items in (
        ("lost acquires", lost), ("double grants", double), ("stuck groups", stuck),
        ("why stuck", why_stuck), ("errors of live jobs", errors),
        ("parts that exited by themselves", crashes),
    ):  # fmt: skip
        for item in items:
            print(f"{title}: {item}")
    p50, worst = p50_and_max(check.recovery_seconds([f.at for f in faults], grants))
    print(
        f"turns={check.turns_completed(processes)} faults={len(faults)} lost={len(lost)} "
        f"double_grants={len(double)} overlaps={overlapping} stuck={len(stuck)} "
        f"recovery_p50_s={p50} recovery_max_s={worst}"
    )
    return not (lost or double or overlapping or stuck or errors or crashes)


def run(args: argparse.Namespace) -> bool:
    rng = random.Random(args.seed)
    groups = [f"chaos-{g}" for g in range(args.groups)]
    started = time.time()
    settings = JobSettings(
        until=0.0, work_seconds=0.3, gap_seconds=0.2, lease_seconds=LEASE_SECONDS,
        agent_timeout_seconds=AGENT_TIMEOUT_SECONDS, continue_as_new_every=CONTINUE_AS_NEW_EVERY,
    )  # fmt: skip
    crashes: list[str] = []
    # Each group has a GPU of its own on every node (a GPU is one group's at a time).
    with running_stack(
        args.workdir, node=NODES[0], more_nodes=NODES[1:], bandwidth_gbps=5.0,
        sim_gpus=args.groups, schedulers=args.replicas, gateways=args.replicas,
    ) as stack:  # fmt: skip
        pool = JobPool(stack, settings)
        try:
            pool.settings.until = time.time() + args.minutes * 60
            for g, group in enumerate(groups):
                for j in range(args.jobs_per_group):
                    pool.start(group, f"g{g}-j{j}", job_nodes(g, j), [g])
            # The records under the workdir carry Unix times; this line ties them to the log's.
            log(started, f"stack and {len(pool.processes)} jobs started; faults for "
                         f"{args.minutes:g} min (t=0 is Unix time {started:.3f}; records in "
                         f"{stack.workdir})")  # fmt: skip
            faults = run_faults(stack, pool, args.kinds.split(","), rng, started, crashes)
            log(started, f"time's up after {len(faults)} faults; the jobs finish their last turns")
            stuck = settle(stack, pool, groups, started, crashes)
            why_stuck = explain_stuck(stack, groups, stuck)
        finally:
            pool.stop()
        stack.stop_all()  # before the report; the records stay until the with ends
        counts = Counter(f.kind for f in faults)
        log(started, "faults: " + ", ".join(f"{kind} {counts[kind]}" for kind in KINDS))
        return report(faults, pool, stack, stuck, crashes, why_stuck)


def explain_stuck(stack: LocalStack, groups: list[str], stuck: list[str]) -> list[str]:
    """For a stuck group: its history saved while Temporal still runs, and
    what the schedulers logged about the tasks that failed."""
    names = [g for g in groups if any(line.startswith(f"{g}:") for line in stuck)]
    if not names:
        return []
    logs = [stack.workdir / f"{part}.log" for part in stack.scheduler_parts]
    saved = chaos_stuck.save_histories(stack.temporal, names, stack.workdir)
    return saved + chaos_stuck.explain(logs)


def scripted(runs: int) -> bool:
    """Each scripted fault ``runs`` times; True if nothing was lost or overlapped."""
    rows, lost, overlapping = [], 0, 0
    for name in SCRIPTED:
        results = []
        for run in range(runs):
            result = run_scripted(name)
            print(f"{name} #{run + 1}: next grant after {result.seconds_to_next_grant:.2f} s, lost "
                  f"{result.lost_requests}, overlaps {result.overlaps}", flush=True)  # fmt: skip
            results.append(result)
        median = statistics.median(r.seconds_to_next_grant for r in results)
        lost += sum(r.lost_requests + len(r.failed_jobs) for r in results)
        overlapping += sum(r.overlaps for r in results)
        rows.append([name, str(runs), f"{median:.2f}",
                     str(sum(r.lost_requests for r in results)),
                     str(sum(r.overlaps for r in results))])  # fmt: skip
    print()
    print(table(["fault", "runs", "median s to next grant", "requests lost", "overlaps"], rows))
    print(f"faults={len(SCRIPTED)} runs={runs} lost_requests={lost} overlaps={overlapping}")
    return lost == overlapping == 0


def main() -> None:
    parser = argparse.ArgumentParser(description="Faults against a running stack.")
    parser.add_argument("--minutes", type=float, help="how long random faults go on")
    parser.add_argument("--scripted", action="store_true", help="each scripted fault in turn")
    parser.add_argument("--runs", type=int, default=5, help="--scripted: runs of each fault")
    parser.add_argument("--quick", action="store_true", help="--scripted: one run of each")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--groups", type=int, default=3)
    parser.add_argument("--jobs-per-group", type=int, default=3)
    parser.add_argument("--kinds", default=",".join(KINDS),
                        help="faults to inject (default %(default)s)")  # fmt: skip
    parser.add_argument("--workdir", type=Path, help="keep logs and records here")
    parser.add_argument("--replicas", type=int, default=1,
                        help="scheduler workers and gateways, each")  # fmt: skip
    args = parser.parse_args()
    if args.scripted == (args.minutes is not None):
        parser.error("give either --minutes (random faults) or --scripted")
    if args.scripted:
        sys.exit(0 if scripted(1 if args.quick else args.runs) else 1)
    if args.replicas < 1:
        parser.error("--replicas: at least 1")
    if unknown := set(args.kinds.split(",")) - set(KINDS):
        parser.error(f"--kinds: unknown {', '.join(sorted(unknown))}; choose from {KINDS}")
    if args.workdir is not None:
        args.workdir.mkdir(parents=True, exist_ok=True)
    sys.exit(0 if run(args) else 1)


if __name__ == "__main__":
    main()
