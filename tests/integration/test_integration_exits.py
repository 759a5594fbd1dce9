"""A job of each framework's plug-in leaves its group when its process ends
(real processes against the real stack, sim nodes): when it crashes, and
when it is sent SIGTERM while holding its turn. The group's lease is ten
minutes, so the lease cannot be what frees the GPUs here; the time each job
took to leave is printed (seconds, from the crash or the signal)."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time

import pytest

import timeshare
from tests.conftest import REPO, SimNodes, wait_for_line
from timeshare.models import GroupPolicy

LEASE_SECONDS = 600.0
# How long the test waits for the job to leave: far below the lease.
GONE_WITHIN = 60.0
FRAMEWORKS = ["trl", "verl", "slime", "openrlhf", "skyrl"]


def job_environment(framework: str, group: str, node: str, gateway: str) -> dict[str, str]:
    env = {**os.environ, "PYTHONPATH": str(REPO), "TIMESHARE_ADDRESS": gateway,
           "TIMESHARE_NODES": node, "TIMESHARE_JOB": "job-a"}  # fmt: skip
    for variable in ("TIMESHARE_TURNS_FD", "TIMESHARE_GROUP"):
        env.pop(variable, None)
    if framework == "slime":  # one pool for both roles
        env.update(TIMESHARE_TRAINER_GROUP=group, TIMESHARE_SAMPLER_GROUP=group)
    else:
        env["TIMESHARE_GROUP"] = group
    return env


def seconds_until_gone(client: timeshare.Client, group: str, since: float) -> float:
    while time.monotonic() - since < GONE_WITHIN:
        status = client.get_group(group)
        if "job-a" not in [job.job for job in status.jobs]:
            assert status.holder != "job-a"
            return time.monotonic() - since
        time.sleep(0.05)
    raise AssertionError(f"job-a still in {group} after {GONE_WITHIN} s: {status}")


@pytest.mark.parametrize("framework", FRAMEWORKS)
@pytest.mark.parametrize("ending", ["crash", "sigterm"])
async def test_a_job_that_crashes_or_is_terminated_leaves_its_group(
    gateway: str, sim_nodes: SimNodes, unique: str, framework: str, ending: str
) -> None:
    node, group = f"n-{unique}", f"exit-{unique}"
    await sim_nodes.start(node)

    def scenario() -> float:
        with timeshare.connect(gateway) as client:
            # Another job makes the group, with a lease far longer than the test.
            policy = GroupPolicy(lease_seconds=LEASE_SECONDS, idle_lease_seconds=LEASE_SECONDS)
            other = client.join(group, "job-b", nodes=[node], policy=policy)
            process = subprocess.Popen(
                [sys.executable, "-m", "tests.exiting_job", framework,
                 "crash" if ending == "crash" else "wait"],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                text=True, cwd=REPO,
                env=job_environment(framework, group, node, gateway),
            )  # fmt: skip
            try:
                wait_for_line(process, "holding", 120)
                assert client.get_group(group).holder == "job-a"
                since = time.monotonic()
                assert process.stdin is not None
                if ending == "sigterm":
                    process.send_signal(signal.SIGTERM)
                else:
                    process.stdin.write("crash\n")
                    process.stdin.flush()
                took = seconds_until_gone(client, group, since)
                code = process.wait(30)
            finally:
                if process.poll() is None:
                    process.kill()
                    process.wait()
            assert code == (-signal.SIGTERM if ending == "sigterm" else 1), code
            other.leave()
            return took

    took = await asyncio.to_thread(scenario)
    print(f"{framework} {ending}: left its group {took:.2f} s after, lease {LEASE_SECONDS:.0f} s")
