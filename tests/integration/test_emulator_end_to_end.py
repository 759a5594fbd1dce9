"""End to end on the GPU emulator: a real `timeshare agent --backend cuda`
process (the real cuda-bindings and pynvml, on the emulated driver), the real
scheduler, gateway and Temporal, and two RL jobs each with two CUDA ranks and a
child that never touches CUDA, handing the node over at least ten times. The
emulator's call log is the witness: no two jobs' state was ever on the GPU at
once, and no process without CUDA was ever acted on."""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import timeshare
from tests.conftest import REPO
from tests.polling import wait_until
from timeshare.gpu_check import emulator
from timeshare.gpu_check.emulator import CHECKPOINTED
from timeshare.gpu_check.emulator.rig import Emulator
from timeshare.models import GroupPolicy
from timeshare.testing import LocalStack

GROUP = "e2e-cuda"
JOBS = ("job-a", "job-b")
TURNS = 6  # each: 12 turns, at least 10 hand-overs
ACTING = {
    f"cuCheckpointProcess{name}" for name in ("GetState", "Lock", "Checkpoint", "Restore", "Unlock")
}
Interval = tuple[float, float]


def on_device(log: list[emulator.LogEntry], pid: int) -> list[Interval]:
    """When the process's state was in device memory: from its cuInit, off at
    each checkpoint's end, on again at each restore's beginning."""
    intervals: list[Interval] = []
    since: float | None = None
    for entry in log:
        if entry["call"] == "cuInit" and entry["caller"] == pid and entry["phase"] == "begin":
            since = entry["t"]
        elif entry["pid"] != pid:
            continue
        elif entry["call"] == "restoreThread.checkpoint" and entry["phase"] == "end":
            if entry["result"] == 0 and since is not None:
                intervals.append((since, entry["t"]))
                since = None
        elif entry["call"] == "restoreThread.restore" and entry["phase"] == "begin":
            since = entry["t"] if since is None else since
    if since is not None:
        intervals.append((since, float("inf")))
    return intervals


def overlapping(
    a: list[Interval], b: list[Interval], after: float, before: float = float("inf")
) -> list[tuple[Interval, Interval]]:
    return [
        (x, y)
        for x, y in itertools.product(a, b)
        if max(x[0], y[0], after) < min(x[1], y[1], before)
    ]


def test_two_cuda_jobs_hand_over_ten_times_through_a_real_agent(
    tmp_path: Path, gpu_emulator: Emulator
) -> None:
    emu = gpu_emulator
    stack = LocalStack(tmp_path, backend="cuda", agent_env=emu.env)
    processes: list[subprocess.Popen[bytes]] = []
    try:
        stack.start_all()
        with timeshare.connect(stack.address) as client:
            # A gate holds the node until both jobs' ranks are up and parked,
            # so every hand-over after it is one the scheduler made.
            gate = client.join(
                GROUP, "gate", nodes=[stack.node], policy=GroupPolicy(co_residency="off")
            )
            gate.acquire()
            for job in JOBS:
                command = [
                    sys.executable,
                    "-m",
                    "tests.emulator_rl_job",
                    stack.address,
                    GROUP,
                    job,
                    stack.node,
                    str(stack.socket_path),
                    str(tmp_path),
                    str(TURNS),
                ]
                with (tmp_path / f"{job}.log").open("wb") as output:
                    processes.append(subprocess.Popen(
                        command, cwd=REPO, env={**os.environ, **emu.env}, stdout=output,
                        stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                    ))  # fmt: skip
            ready = [tmp_path / f"{job}-rank{i}.ready" for job in JOBS for i in range(2)]
            wait_until(lambda: all(path.exists() for path in ready), "every rank to start", 120)
            ranks = [int(json.loads(path.read_text())["pid"]) for path in ready]
            wait_until(
                lambda: all(emu.state(pid) == (0, CHECKPOINTED) for pid in ranks),
                "the ranks that came in during the gate's turn to be checkpointed",
                seconds=120,
            )
            wait_until(lambda: len(stack.group(GROUP).queue) == 2, "both jobs to wait", 120)
            after_gate = time.monotonic()
            gate.yield_()
            gate.leave()
            codes = [process.wait(300) for process in processes]
        assert codes == [0, 0], [(tmp_path / f"{j}.log").read_text()[-2000:] for j in JOBS]
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
        stack.stop_all()

    reports: dict[str, Any] = {
        job: json.loads((tmp_path / f"{job}.json").read_text()) for job in JOBS
    }
    turns = sorted((t["epoch"], job) for job in JOBS for t in reports[job]["turns"])
    assert len(turns) == 2 * TURNS
    handovers = sum(1 for (_, a), (_, b) in itertools.pairwise(turns) if a != b)
    assert handovers >= 10

    log = emulator.read_log(emu.log)
    children = [pid for job in JOBS for pid in reports[job]["children"]]
    assert children, "each job had a child without CUDA"
    touched = [e for e in log if e["call"] in ACTING and e["pid"] in children]
    assert touched == [], "a process without CUDA was acted on"
    acted = {e["pid"] for e in log if e["call"] == "cuCheckpointProcessCheckpoint"}
    assert acted == {pid for job in JOBS for pid in reports[job]["ranks"]}

    state = {job: [i for pid in reports[job]["ranks"] for i in on_device(log, pid)] for job in JOBS}
    # Until a job leaves. A job that left is released: its state is restored
    # where it fits while its ranks wind down. And the log has no exits: ranks
    # that exit before the switch their last yield asked for are never
    # checkpointed, so their state reads as on the GPU for ever after.
    left = {job: reports[job]["turns"][-1]["yielded"] for job in JOBS}
    first_left = min(left.values())
    assert overlapping(state["job-a"], state["job-b"], after_gate, first_left) == []
    # And every turn while the other was a member had its own ranks' state on
    # the GPU, the other's off it.
    for job, other in (JOBS, tuple(reversed(JOBS))):
        for turn in reports[job]["turns"]:
            window = [(turn["granted"], turn["yielded"])]
            assert overlapping(window, state[other], after_gate, left[other]) == [], (job, turn)
