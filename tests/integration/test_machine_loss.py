"""The whole machine lost at once: every process of `timeshare up` killed
in the same instant (Temporal, the scheduler, the gateway, the agent), then
`timeshare up` again on the same data folder. Every group resumes as it
was: the same holders with the epochs they were told, the state parked on
the node still there, and each live job's next call answered. The jobs are
clients elsewhere; they live on."""

from __future__ import annotations

import contextlib
import json
import os
import signal
from pathlib import Path

import timeshare
from timeshare.activities.backends.sim_memory import sim_state_path
from timeshare.models import GroupPolicy
from timeshare.testing.stack import processes_below, wait_gone
from timeshare.testing.up_stack import UpStack


def parked(data_dir: Path, node: str) -> dict[str, str]:
    """Where the node's simulated GPU keeps each job of each group."""
    held = json.loads(sim_state_path(data_dir, node).read_text())
    return {f"{entry['group']}/{entry['job']}": entry["location"] for entry in held}


def lose_the_machine(up: UpStack) -> None:
    assert up.process is not None
    everything = [*processes_below(up.process.pid), up.process.pid]
    for pid in everything:
        # One that ended since it was listed (a short-lived child) is lost already.
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    up.process.wait(60)
    wait_gone(everything)


def test_every_group_resumes_after_the_whole_machine_is_lost(tmp_path: Path) -> None:
    up = UpStack(tmp_path, ("--sim-state-gib=0.01", "--sim-gpus=2"))
    up.start()
    data = tmp_path / "data"
    try:
        with timeshare.connect(up.address) as client:
            # A GPU of the node each: a GPU is one group's at a time.
            first, second = GroupPolicy(gpus=[0]), GroupPolicy(gpus=[1])
            a = client.join("g1", "a", nodes=["up"], policy=first)
            b = client.join("g1", "b", nodes=["up"], policy=first)
            c = client.join("g2", "c", nodes=["up"], policy=second)
            b.acquire()
            b.yield_()
            held_by_a = a.acquire()  # b's state is parked on the node
            held_by_c = c.acquire()
            before = {group: client.get_group(group) for group in ("g1", "g2")}
            assert parked(data, "up")["g1/b"] == "host"

            lose_the_machine(up)
            up.start()

            # An operator's look afresh (the jobs' own calls, below, are sent
            # again by the client until a gateway answers).
            with timeshare.connect(up.address) as operator:
                for group, status in before.items():
                    after = operator.get_group(group)
                    assert (after.holder, after.epoch, after.jobs) == (
                        status.holder, status.epoch, status.jobs,
                    ), group  # fmt: skip
            assert parked(data, "up")["g1/b"] == "host"
            # Each job's next call is answered, with the turn it was told.
            assert a.yield_() >= 0 and c.yield_() >= 0
            resumed = b.acquire()
            assert resumed.epoch == held_by_a.epoch + 1 and parked(data, "up")["g1/b"] == "running"
            assert held_by_c.epoch == 1
            for job in (a, b, c):
                job.leave()
    finally:
        up.stop()
