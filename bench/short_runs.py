"""Many short runs of three jobs taking turns against `timeshare up`: turns lost, each job's errors.

Each run is a new group whose jobs join with no node named and take ten
turns of 20 ms, each job in a thread; a fresh `timeshare up` is started every
``--fresh-every`` runs, and the run after it starts as soon as it is ready.
Every job's failure is printed with its run; the last line sums them up.
"""

from __future__ import annotations

import argparse
import threading
import time
import traceback
from pathlib import Path

from pydantic import BaseModel

import timeshare
from timeshare.testing.up_stack import fresh_up

JOB_SECONDS = 300.0


class JobOutcome(BaseModel):
    job: str
    turns: int
    # The job's failure, as its client raised it (empty: none).
    error: str = ""


class RunOutcome(BaseModel):
    run: int
    group: str
    # The run started as soon as a fresh stack said it was ready.
    after_ready: bool
    jobs: list[JobOutcome]

    def turns(self) -> int:
        return sum(job.turns for job in self.jobs)

    def errors(self) -> list[JobOutcome]:
        return [job for job in self.jobs if job.error]


def take_turns(address: str, group: str, job: str, turns: int, turn_seconds: float) -> JobOutcome:
    """One job as a user writes it: join (its node left to the gateway), take
    its turns, leave. A failure ends the job and is kept with where it was raised."""
    taken = 0
    try:
        with timeshare.connect(address) as client:
            handle = client.join(group, job)
            for _ in range(turns):
                with handle.turn():
                    time.sleep(turn_seconds)
                taken += 1
            handle.leave()
    except Exception as error:
        return JobOutcome(job=job, turns=taken, error=describe(error))
    return JobOutcome(job=job, turns=taken)


def describe(error: BaseException) -> str:
    where = traceback.extract_tb(error.__traceback__)[-1:]
    origin = f" (at {where[0].filename}:{where[0].lineno})" if where else ""
    return f"{type(error).__name__}: {error}{origin}"


def run_group(address: str, run: int, group: str, jobs: int, turns: int, turn_seconds: float,
              after_ready: bool = False) -> RunOutcome:  # fmt: skip
    """Every job in a thread of its own, started together."""
    names = [f"job-{index}" for index in range(jobs)]
    outcomes: dict[str, JobOutcome] = {}
    start = threading.Barrier(len(names))

    def job(name: str) -> None:
        try:
            start.wait()
            outcomes[name] = take_turns(address, group, name, turns, turn_seconds)
        except BaseException as error:  # kept: a job's thread must not die unheard
            outcomes[name] = JobOutcome(job=name, turns=0, error=describe(error))

    threads = [threading.Thread(target=job, args=(name,), daemon=True) for name in names]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + JOB_SECONDS
    for thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()))
    late = f"still running after {JOB_SECONDS:g} s"
    results = [outcomes.get(name) or JobOutcome(job=name, turns=0, error=late) for name in names]
    return RunOutcome(run=run, group=group, after_ready=after_ready, jobs=results)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--fresh-every", type=int, default=10,
                        help="a new `timeshare up` every this many runs (0: one)")  # fmt: skip
    parser.add_argument("--jobs", type=int, default=3)
    parser.add_argument("--turns", type=int, default=10, help="turns per job")
    parser.add_argument("--turn-seconds", type=float, default=0.02)
    parser.add_argument("--quick", action="store_true", help="6 runs, a fresh stack every 3")
    parser.add_argument("--state-gib", type=float,
                        help="each job's simulated device state (GiB)")  # fmt: skip
    parser.add_argument("--logs", type=Path, help="keep each stack's log in this folder")
    args = parser.parse_args()
    if args.quick:
        args.runs, args.fresh_every = 6, 3
    per_stack = args.fresh_every if args.fresh_every > 0 else args.runs
    started, expected = time.monotonic(), args.jobs * args.turns
    outcomes: list[RunOutcome] = []
    stacks = 0
    options = () if args.state_gib is None else (f"--sim-state-gib={args.state_gib:g}",)
    while len(outcomes) < args.runs:
        with fresh_up(options, args.logs) as stack:
            stacks += 1
            first = len(outcomes) + 1
            for run in range(first, first + min(per_stack, args.runs - len(outcomes))):
                outcome = run_group(stack.address, run, f"short-{stack.gateway_port}-{run}",
                                    args.jobs, args.turns, args.turn_seconds,
                                    after_ready=run == first)  # fmt: skip
                when = " (first after ready)" if outcome.after_ready else ""
                print(f"run {run}{when}: group {outcome.group} turns={outcome.turns()} "
                      f"expected={expected}", flush=True)  # fmt: skip
                for job in outcome.errors():
                    print(f"run {run} {job.job} after {job.turns} turns: {job.error}", flush=True)
                outcomes.append(outcome)
    after_ready = [outcome for outcome in outcomes if outcome.after_ready]
    lost = sum(expected - outcome.turns() for outcome in outcomes)
    print(f"runs={len(outcomes)} lost_turns={lost} "
          f"errors={sum(len(outcome.errors()) for outcome in outcomes)} fresh_stacks={stacks} "
          f"runs_after_ready={len(after_ready)} "
          f"lost_turns_after_ready={sum(expected - o.turns() for o in after_ready)} "
          f"seconds={time.monotonic() - started:.0f}")  # fmt: skip


if __name__ == "__main__":
    main()
