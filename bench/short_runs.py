"""Many short runs of three jobs taking turns against `timeshare up`: turns lost, each job's errors.

Each run is a new group of jobs (three by default) that join with no node
named, as `timeshare.connect().join(group, job)` does, and take ten turns of
20 ms each, each job in a thread of its own. A fresh `timeshare up` (fresh
ports, fresh data directory) is started every ``--fresh-every`` runs, and
the run after it starts as soon as the stack has said it is ready. Every
job's failure is printed with its run; the last line sums them up.

    python -m bench short_runs                          # 200 runs, a fresh stack every 10
    python -m bench short_runs --quick                  # 6 runs, a fresh stack every 3
    python -m bench short_runs --runs 50 --fresh-every 0   # one stack for all
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from bench.parts.short_runs import RunOutcome, UpStack, fresh_up, run_group


def print_run(outcome: RunOutcome, expected: int) -> None:
    when = " (first after ready)" if outcome.after_ready else ""
    print(
        f"run {outcome.run}{when}: group {outcome.group} turns={outcome.turns()} "
        f"expected={expected}",
        flush=True,
    )
    for job in outcome.errors():
        print(f"run {outcome.run} {job.job} after {job.turns} turns: {job.error}", flush=True)


def run_on(
    stack: UpStack, first: int, runs: int, args: argparse.Namespace, fresh: bool
) -> list[RunOutcome]:
    outcomes = []
    for run in range(first, first + runs):
        outcome = run_group(
            stack.address, run, f"short-{stack.gateway_port}-{run}", args.jobs, args.turns,
            args.turn_seconds, after_ready=fresh and run == first,
        )  # fmt: skip
        print_run(outcome, args.jobs * args.turns)
        outcomes.append(outcome)
    return outcomes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument(
        "--fresh-every", type=int, default=10,
        help="start a fresh `timeshare up` every this many runs (0: one stack for all)",
    )  # fmt: skip
    parser.add_argument("--jobs", type=int, default=3)
    parser.add_argument("--turns", type=int, default=10, help="turns per job")
    parser.add_argument("--turn-seconds", type=float, default=0.02)
    parser.add_argument("--quick", action="store_true", help="6 runs, a fresh stack every 3")
    parser.add_argument(
        "--state-gib", type=float,
        help="each job's simulated device state (default: `timeshare up`'s own)",
    )  # fmt: skip
    parser.add_argument("--logs", type=Path, help="keep each stack's log in this folder")
    args = parser.parse_args()
    if args.quick:
        args.runs, args.fresh_every = 6, 3
    per_stack = args.fresh_every if args.fresh_every > 0 else args.runs
    started = time.monotonic()
    outcomes: list[RunOutcome] = []
    stacks = 0
    options = () if args.state_gib is None else (f"--sim-state-gib={args.state_gib:g}",)
    while len(outcomes) < args.runs:
        with fresh_up(options, args.logs) as stack:
            stacks += 1
            count = min(per_stack, args.runs - len(outcomes))
            outcomes += run_on(stack, len(outcomes) + 1, count, args, fresh=True)
    expected = args.jobs * args.turns
    lost = sum(expected - outcome.turns() for outcome in outcomes)
    errors = sum(len(outcome.errors()) for outcome in outcomes)
    after_ready = [outcome for outcome in outcomes if outcome.after_ready]
    lost_after_ready = sum(expected - outcome.turns() for outcome in after_ready)
    print(
        f"runs={len(outcomes)} lost_turns={lost} errors={errors} fresh_stacks={stacks} "
        f"runs_after_ready={len(after_ready)} lost_turns_after_ready={lost_after_ready} "
        f"seconds={time.monotonic() - started:.0f}"
    )


if __name__ == "__main__":
    main()
