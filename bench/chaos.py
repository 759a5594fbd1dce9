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
nondeterminism errors the schedulers logged; every group a scheduler healed
(a history it could not replay) is printed and counted as ``healed``
(bench.parts.chaos_stuck).
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import tempfile
import time
from collections import Counter
from math import nan
from pathlib import Path

from bench.parts import chaos_check as check
from bench.parts import chaos_stuck
from bench.parts.chaos_conditions import (
    DESCRIPTIONS,
    FAULT_GAP_SECONDS,
    WINDOW_SECONDS,
    Chaos,
    links_for,
)
from bench.parts.chaos_faults import KILLS, KINDS, SCRIPTED, inject, run_scripted
from bench.parts.chaos_pool import JobPool, JobSettings
from bench.parts.fault import Fault
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
    chaos: Chaos,
    kinds: list[str],
    rng: random.Random,
    started: float,
    crashes: list[str],
    most: int = 0,
    in_turn: bool = False,
) -> list[Fault]:
    """Faults of ``kinds`` at drawn moments until the time is up (or
    ``most`` faults, if above 0): each of a drawn kind, or ``in_turn``
    each kind in the order given."""
    stack, pool = chaos.stack, chaos.pool
    faults: list[Fault] = []
    until = pool.settings.until
    while True:
        gap = rng.uniform(*chaos.gaps)
        if time.time() + gap >= until or (most and len(faults) >= most):
            keep_up(stack, max(0.0, until - time.time()), started, crashes)
            return faults
        keep_up(stack, gap, started, crashes)
        kind = kinds[len(faults) % len(kinds)] if in_turn else rng.choice(kinds)
        if kind == "job" and not pool.running():
            continue
        fault = inject(kind, chaos, rng)
        faults.append(fault)
        what = f"kill -9 {fault.target}" if kind in KILLS else f"{kind} on {fault.target}"
        log(started, f"fault {len(faults)}: {what}; {fault.outcome}; "
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


def p50_p99_and_max(values: list[float]) -> list[str]:
    return [f"{percentile(values, 50):.2f}", f"{percentile(values, 99):.2f}",
            f"{max(values, default=nan):.2f}"]  # fmt: skip


def fault_table(faults: list[Fault], grants: list[float]) -> str:
    """Recovery by kind of fault: from the kill, and from the part being ready again."""
    rows = []
    for kind in KINDS:
        of_kind = [f for f in faults if f.kind == kind]
        rows.append([
            kind, str(len(of_kind)),
            *p50_p99_and_max(check.recovery_seconds([f.at for f in of_kind], grants)),
            *p50_p99_and_max(check.recovery_seconds([f.back_at for f in of_kind], grants)),
        ])  # fmt: skip
    headers = ["fault", "injected", "to next grant p50 s", "p99 s", "max s",
               "from its end p50 s", "p99 s", "max s"]  # fmt: skip
    return table(headers, rows)


def report(
    faults: list[Fault],
    pool: JobPool,
    stack: LocalStack,
    stuck: list[str],
    crashes: list[str],
    why_stuck: list[str],
    healed: list[str],
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
        ("why stuck", why_stuck), ("healing", healed), ("errors of live jobs", errors),
        ("parts that exited by themselves", crashes),
    ):  # fmt: skip
        for item in items:
            print(f"{title}: {item}")
    p50, worst = p50_and_max(check.recovery_seconds([f.at for f in faults], grants))
    print(
        f"turns={check.turns_completed(processes)} faults={len(faults)} lost={len(lost)} "
        f"double_grants={len(double)} overlaps={overlapping} stuck={len(stuck)} "
        f"healed={chaos_stuck.heals_made(healed)} "
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
    kinds = args.kinds.split(",")
    scratch = tempfile.TemporaryDirectory()
    # Each group has a GPU of its own on every node (a GPU is one group's at a time).
    stack = LocalStack(
        args.workdir or Path(scratch.name), node=NODES[0], more_nodes=NODES[1:],
        bandwidth_gbps=5.0, sim_gpus=args.groups, schedulers=args.replicas,
        gateways=args.replicas,
    )  # fmt: skip
    # The gateways and the agents reach Temporal through links a fault can slow or cut.
    linked = any(kind in ("slow-link", "lossy-link") for kind in kinds)
    links = links_for(stack) if linked else {}
    with scratch, stack:
        pool = JobPool(stack, settings)
        chaos = Chaos(stack, pool, links, gaps=drawn(args.gap, FAULT_GAP_SECONDS),
                      window=drawn(args.window, WINDOW_SECONDS))  # fmt: skip
        try:
            pool.settings.until = time.time() + args.minutes * 60
            for g, group in enumerate(groups):
                for j in range(args.jobs_per_group):
                    pool.start(group, f"g{g}-j{j}", job_nodes(g, j), [g])
            # The records under the workdir carry Unix times; this line ties them to the log's.
            log(started, f"stack and {len(pool.processes)} jobs started; faults for "
                         f"{args.minutes:g} min (t=0 is Unix time {started:.3f}; records in "
                         f"{stack.workdir})")  # fmt: skip
            faults = run_faults(chaos, kinds, rng, started, crashes, args.faults, args.in_turn)
            log(started, f"time's up after {len(faults)} faults; the jobs finish their last turns")
            stuck = settle(stack, pool, groups, started, crashes)
            why_stuck = explain_stuck(stack, groups, stuck)
        finally:
            pool.stop()
            # Before the links close: an agent whose link to Temporal is gone
            # takes seconds to stop.
            stack.stop_all()  # before the report; the records stay until the with ends
            for link in links.values():
                link.close()
        counts = Counter(f.kind for f in faults)
        log(started, "faults: " + ", ".join(f"{kind} {counts[kind]}" for kind in KINDS))
        healed = chaos_stuck.heals(scheduler_logs(stack))
        return report(faults, pool, stack, stuck, crashes, why_stuck, healed)


def drawn(given: list[float] | None, default: tuple[float, float]) -> tuple[float, float]:
    """A range given on the command line (two numbers), else the default."""
    return (given[0], given[1]) if given else default


def explain_stuck(stack: LocalStack, groups: list[str], stuck: list[str]) -> list[str]:
    """For a stuck group: its history saved while Temporal still runs, and
    what the schedulers logged about the tasks that failed."""
    names = [g for g in groups if any(line.startswith(f"{g}:") for line in stuck)]
    if not names:
        return []
    saved = chaos_stuck.save_histories(stack.temporal, names, stack.workdir)
    return saved + chaos_stuck.explain(scheduler_logs(stack))


def scheduler_logs(stack: LocalStack) -> list[Path]:
    return [stack.workdir / f"{part}.log" for part in stack.scheduler_parts]


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


KILL_DESCRIPTIONS = {
    "scheduler": "kill -9 of a scheduler worker (one replica of several), started again after "
    "0-8 s",
    "gateway": "kill -9 of a gateway (one replica of several), started again after 0-8 s",
    "agent": "kill -9 of one node's agent, started again after 0-8 s",
    "job": "kill -9 of a job process, replaced at once under its name or a new one",
    "temporal": "kill -9 of the Temporal dev server, started again on the same SQLite file "
    "after 0-8 s",
}


def kinds_listing() -> str:
    described = {**KILL_DESCRIPTIONS, **DESCRIPTIONS}
    return "\n".join(f"{kind:12} {described[kind]}" for kind in KINDS)


def main() -> None:
    parser = argparse.ArgumentParser(description="Faults against a running stack.")
    parser.add_argument("--minutes", type=float, help="how long random faults go on")
    parser.add_argument("--scripted", action="store_true", help="each scripted fault in turn")
    parser.add_argument("--runs", type=int, default=5, help="--scripted: runs of each fault")
    parser.add_argument("--quick", action="store_true", help="--scripted: one run of each")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--groups", type=int, default=3)
    parser.add_argument("--jobs-per-group", type=int, default=3)
    parser.add_argument("--kinds", nargs="?", const="", default=",".join(KINDS),
                        help="faults to inject, comma-separated (default: all); alone, "
                             "list them")  # fmt: skip
    parser.add_argument("--in-turn", action="store_true",
                        help="each of --kinds in the order given, instead of drawn")  # fmt: skip
    parser.add_argument(
        "--gap",
        type=float,
        nargs=2,
        metavar=("LEAST", "MOST"),
        help="seconds between faults, drawn from this range (default 3 9)",
    )
    parser.add_argument("--window", type=float, nargs=2, metavar=("LEAST", "MOST"),
                        help="seconds a condition lasts, drawn from this range (default 3 8; "
                             "the clock skew twice that)")  # fmt: skip
    parser.add_argument("--faults", type=int, default=0,
                        help="stop injecting after this many (default 0: until the time is "
                             "up)")  # fmt: skip
    parser.add_argument("--workdir", type=Path, help="keep logs and records here")
    parser.add_argument("--replicas", type=int, default=1,
                        help="scheduler workers and gateways, each")  # fmt: skip
    args = parser.parse_args()
    if args.kinds == "":
        print(kinds_listing())
        sys.exit(0)
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
