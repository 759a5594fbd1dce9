"""One fault at a time in a running stack: time to the next grant, requests lost, overlaps.

Faults injected into a running stack, and what they cost.

Each scenario starts a stack of separate processes and four synthetic jobs in
one group, injects one fault, and lets the jobs finish. It reports the time
from the fault to the next grant, the requests lost (turns a surviving job
never got) and the overlaps the simulated GPU saw.

    python -m bench faults            # every fault, 5 runs each
    python -m bench faults --quick    # every fault once
"""

from __future__ import annotations

import argparse
import signal
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from pydantic import BaseModel

from timeshare.models import GroupStatus
from timeshare.status import table
from timeshare.synthetic import load_report
from timeshare.testing import LocalStack, overlaps

Jobs = dict[str, subprocess.Popen[bytes]]
# The jobs a fault killed (not expected to finish), and when it struck.
Fault = tuple[set[str], float]
GROUP = "faults"
JOBS = [f"job-{i}" for i in range(4)]
ITERATIONS = 2  # a sample and a train turn each
JOB_OPTIONS = [
    f"--iterations={ITERATIONS}", "--sample-seconds=0.3", "--reward-seconds=0.1",
    "--train-seconds=0.3", "--agent-timeout-seconds=3",
]  # fmt: skip


class FaultResult(BaseModel):
    fault: str
    seconds_to_next_grant: float
    lost_requests: int
    overlaps: int
    failed_jobs: list[str]


def kill_scheduler_mid_switch(stack: LocalStack, jobs: Jobs) -> Fault:
    stack.wait_for(GROUP, "switching")
    return restart(stack, "scheduler")


def restart_temporal_while_jobs_wait(stack: LocalStack, jobs: Jobs) -> Fault:
    wait_for_waiters(stack, 1)
    return restart(stack, "temporal", signal.SIGTERM)


def kill_agent_mid_checkpoint(stack: LocalStack, jobs: Jobs) -> Fault:
    stack.wait_for(GROUP, "switching")
    return restart(stack, "agent")


def kill_holder_and_waiter(stack: LocalStack, jobs: Jobs) -> Fault:
    status = wait_for_waiters(stack, 1)
    victims = {status.holder, status.queue[0]}
    at = time.time()
    for victim in victims:
        jobs[victim].send_signal(signal.SIGKILL)
    return victims, at


def restart_gateway_under_waiters(stack: LocalStack, jobs: Jobs) -> Fault:
    wait_for_waiters(stack, 3)
    return restart(stack, "gateway")


def restart(
    stack: LocalStack, part: str, signum: int = signal.SIGKILL, downtime: float = 0.0
) -> Fault:
    at = time.time()
    stack.restart(part, signum, downtime)
    return set(), at


def wait_for_waiters(stack: LocalStack, count: int, timeout: float = 60) -> GroupStatus:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        status = stack.group(GROUP)
        if status.holder and len(status.queue) >= count:
            return status
        time.sleep(0.02)
    raise RuntimeError(f"never saw {count} waiters")


FAULTS: dict[str, Callable[[LocalStack, Jobs], Fault]] = {
    "scheduler killed mid-switch": kill_scheduler_mid_switch,
    "Temporal restarted while jobs wait": restart_temporal_while_jobs_wait,
    "agent killed mid-checkpoint": kill_agent_mid_checkpoint,
    "holder and a waiter killed": kill_holder_and_waiter,
    "gateway restarted under 3 waiters": restart_gateway_under_waiters,
}


def run_fault(name: str, workdir: Path) -> FaultResult:
    stack = LocalStack(workdir, state_gib=0.2, bandwidth_gbps=1.0)
    try:
        stack.start_all()
        reports = {job: workdir / f"{job}.json" for job in JOBS}
        # A short lease only where a dead client must lose it: a lease shorter
        # than an outage of the scheduler or of Temporal would evict live jobs
        # whose heartbeats could not get through.
        lease = 3 if name == "holder and a waiter killed" else 15
        options = [*JOB_OPTIONS, f"--lease-seconds={lease}"]
        jobs = {job: stack.job(GROUP, job, reports[job], *options) for job in JOBS}
        # The first job creates the group with its policy before the others join.
        stack.wait_for(GROUP, "held")
        victims, fault_at = FAULTS[name](stack, jobs)
        codes = {job: process.wait(300) for job, process in jobs.items()}
    finally:
        stack.stop_all()
    survivors = [job for job in JOBS if job not in victims]
    failed = [job for job in survivors if codes[job] != 0]
    turns = {job: load_report(reports[job]).turns for job in survivors if job not in failed}
    grants_after = [
        t.granted for job_turns in turns.values() for t in job_turns if t.granted > fault_at
    ]
    expected = ITERATIONS * 2
    return FaultResult(
        fault=name,
        seconds_to_next_grant=min(grants_after) - fault_at if grants_after else float("nan"),
        lost_requests=sum(expected - len(turns.get(job, [])) for job in survivors),
        overlaps=overlaps(stack.record()),
        failed_jobs=failed,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description="Faults injected into a running stack.")
    parser.add_argument("--quick", action="store_true", help="one run per fault")
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    runs = 1 if args.quick else args.runs
    rows, lost, overlapping = [], 0, 0
    for name in FAULTS:
        results = []
        for run in range(runs):
            with tempfile.TemporaryDirectory() as scratch:
                result = run_fault(name, Path(scratch))
            print(
                f"{name} #{run + 1}: next grant after {result.seconds_to_next_grant:.2f} s, "
                f"lost {result.lost_requests}, overlaps {result.overlaps}",
                flush=True,
            )
            results.append(result)
        median = statistics.median(r.seconds_to_next_grant for r in results)
        lost += sum(r.lost_requests + len(r.failed_jobs) for r in results)
        overlapping += sum(r.overlaps for r in results)
        rows.append([name, str(runs), f"{median:.2f}",
                     str(sum(r.lost_requests for r in results)),
                     str(sum(r.overlaps for r in results))])  # fmt: skip
    print()
    print(table(["fault", "runs", "median s to next grant", "requests lost", "overlaps"], rows))
    print(f"faults={len(FAULTS)} runs={runs} lost_requests={lost} overlaps={overlapping}")


if __name__ == "__main__":
    main()
