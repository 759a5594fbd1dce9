"""The GPU check: real device state moved by the `cuda` backend.

Two processes each fill several GB of device memory with known random data
and take turns in one group through the embedded stack, in three scenarios:

- checkpoint: the CUDA backend alone moves each yielding job's memory to the host;
- hooks: `app+cuda`, each job's PyTorch offload hook first moves its data to
  pinned host memory, then the CUDA checkpoint moves what is left;
- co-residency: both jobs fit on the GPU together, so a switch is a lock and
  an unlock, and NVML shows the waiting job's memory never leaves the device.

After every grant the data is verified (an exact checksum), and NVML says
whether the waiting job's device memory dropped (or, co-resident, stayed).
Reports checkpoint+restore GB/s per switch and, in the same run, pinned
host<->device copy GB/s (torch) as the ceiling.

    python -m bench.gpu_switch                      # on a GPU host, backend cuda
    python -m bench.gpu_switch --backend cuda-checkpoint
    python -m bench.gpu_switch --cpu --gib 0.05     # no GPU: host memory, the freeze
                                                    # backend (and, for co-residency,
                                                    # a SIMULATED GPU beside it);
                                                    # checks the harness only
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel

import timeshare
from bench.stack import LocalStack
from bench.stats import p50_p90_p99
from timeshare.activities.gpus import device_memory_by_pid
from timeshare.models import CoResidency, GroupPolicy
from timeshare.status import table

Expect = Literal["dropped", "stayed"]


class Scenario(BaseModel):
    name: str
    backend: str
    co_residency: CoResidency
    hooks: bool
    # What NVML should show of the waiting job's device memory after a switch.
    expect: Expect
    # The simulated GPU's room beside the freeze backend (CPU harness only).
    sim_capacity_gib: float | None = None


def scenarios(backend: str, cpu: bool, gib: float) -> list[Scenario]:
    base = "freeze" if cpu else backend
    # Without a GPU, co-residency needs a device that knows its free memory: a simulated one.
    shared = "freeze+sim" if cpu else backend
    return [
        Scenario(name="checkpoint", backend=base, co_residency="off", hooks=False,
                 expect="dropped"),
        Scenario(name="hooks", backend=f"app+{base}", co_residency="off", hooks=True,
                 expect="dropped"),
        Scenario(name="co-residency", backend=shared, co_residency="auto", hooks=False,
                 expect="stayed", sim_capacity_gib=2 * gib if cpu else None),
    ]  # fmt: skip


class Holder:
    def __init__(self, group: str, job: str, gib: float, seed: int, cpu: bool, hooks: bool,
                 socket: Path) -> None:  # fmt: skip
        command = [sys.executable, "-m", "bench.gpu_holder", f"--group={group}", f"--job={job}",
                   f"--gib={gib}", f"--seed={seed}"] + (["--cpu"] if cpu else []) + (
                   ["--hooks"] if hooks else [])  # fmt: skip
        env = {**os.environ, "TIMESHARE_AGENT_SOCKET": str(socket)}
        self.process = subprocess.Popen(
            command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env
        )
        hello = self.read()
        self.pid, self.expected = int(hello["pid"]), int(hello["checksum"])

    def read(self) -> dict[str, Any]:
        assert self.process.stdout is not None
        line = self.process.stdout.readline()
        if not line:
            raise RuntimeError("a holder process exited")
        reply: dict[str, Any] = json.loads(line)
        return reply

    def checksum(self) -> int:
        assert self.process.stdin is not None
        self.process.stdin.write("checksum\n")
        self.process.stdin.flush()
        return int(self.read()["checksum"])

    def stop(self) -> None:
        self.process.kill()
        self.process.wait()


class Outcome(BaseModel):
    scenario: Scenario
    rows: list[list[str]]
    switch_seconds: list[float]
    verified: int
    # NVML's word on the waiting job's memory after each switch; "n/a" on the CPU.
    memory_as_expected: str
    # Device state the simulated GPU moved (CPU harness of co-residency only).
    sim_moved_bytes: int | None = None


def copy_ceiling_gbps(gib: float) -> float | None:
    """Pinned host->device then device->host copy rate, torch; None without a GPU."""
    try:
        import torch
    except ImportError:
        return None
    if not torch.cuda.is_available():
        return None
    count = int(gib * 2**30)
    host = torch.empty(count, dtype=torch.uint8, pin_memory=True)
    device = torch.empty(count, dtype=torch.uint8, device="cuda")
    torch.cuda.synchronize()
    start = time.perf_counter()
    device.copy_(host, non_blocking=True)
    host.copy_(device, non_blocking=True)
    torch.cuda.synchronize()
    return 2 * count / (time.perf_counter() - start) / 1e9


def main() -> None:
    parser = argparse.ArgumentParser(description="Device state moved by a real backend.")
    parser.add_argument("--backend", default="cuda")
    parser.add_argument("--gib", type=float, default=4.0, help="device memory per job")
    parser.add_argument("--handovers", type=int, default=10)
    parser.add_argument("--cpu", action="store_true", help="no GPU: host memory, freeze backend")
    parser.add_argument("--only", help="run only this scenario (checkpoint, hooks, co-residency)")
    args = parser.parse_args()
    chosen = [s for s in scenarios(args.backend, args.cpu, args.gib) if args.only in (None, s.name)]
    outcomes = []
    with tempfile.TemporaryDirectory() as scratch:
        # The simulated GPU (CPU harness of co-residency) holds each job's data size.
        stack = LocalStack(Path(scratch), backend=chosen[0].backend, state_gib=args.gib)
        try:
            stack.start_all()
            for scenario in chosen:
                outcomes.append(run_scenario(stack, scenario, args.gib, args.handovers, args.cpu))
        finally:
            stack.stop_all()
    ceiling = None if args.cpu else copy_ceiling_gbps(min(args.gib, 1.0))
    report(outcomes, args.gib, args.cpu, ceiling)


def run_scenario(
    stack: LocalStack, scenario: Scenario, gib: float, handovers: int, cpu: bool
) -> Outcome:
    """Point the agent at the scenario's backend, start two holders, take turns."""
    if (stack.backend, stack.capacity_gib) != (scenario.backend, scenario.sim_capacity_gib):
        stack.backend, stack.capacity_gib = scenario.backend, scenario.sim_capacity_gib
        stack.restart("agent")
    group = f"gpu-switch-{scenario.name}"
    holders: list[Holder] = []
    try:
        holders = [Holder(group, f"job-{i}", gib, i, cpu, scenario.hooks, stack.socket_path)
                   for i in range(2)]  # fmt: skip
        outcome = take_turns(stack, scenario, group, holders, handovers, cpu, gib)
    finally:
        for holder in holders:
            holder.stop()
    if cpu and scenario.sim_capacity_gib is not None:
        moved = [e for e in stack.record() if e.get("group") == group and "bytes" in e
                 and e["event"] in ("checkpoint", "restore")]  # fmt: skip
        outcome.sim_moved_bytes = sum(e["bytes"] for e in moved)
    return outcome


def take_turns(
    stack: LocalStack, scenario: Scenario, group: str, holders: list[Holder], handovers: int,
    cpu: bool, gib: float,
) -> Outcome:  # fmt: skip
    rows, switch_seconds, verified, checks = [], [], 0, []
    policy = GroupPolicy(co_residency=scenario.co_residency)
    with timeshare.connect(stack.address) as client:
        jobs = [client.join(group, f"job-{i}", [stack.node], policy) for i in range(2)]
        for turn in range(handovers + 1):
            index = turn % 2
            granted = jobs[index].acquire()
            ok = holders[index].checksum() == holders[index].expected
            verified += ok
            other = holders[1 - index]
            other_bytes = device_memory_by_pid().get(other.pid, 0) if not cpu else None
            if turn > 0:
                switch_seconds.append(granted.switch_seconds)
                if other_bytes is not None:
                    held = other_bytes >= int(gib * 2**30)
                    checks.append(held if scenario.expect == "stayed" else other_bytes == 0)
            memory = "n/a (CPU)" if other_bytes is None else f"{other_bytes / 2**30:.2f} GiB"
            checked = "ok" if ok else "MISMATCH"
            rows.append(
                [str(turn), f"job-{index}", f"{granted.switch_seconds:.3f}", checked, memory]
            )
            jobs[index].yield_()
        for job in jobs:
            job.leave()
    as_expected = "n/a" if not checks else str(all(checks)).lower()
    return Outcome(scenario=scenario, rows=rows, switch_seconds=switch_seconds,
                   verified=verified, memory_as_expected=as_expected)  # fmt: skip


def report(outcomes: list[Outcome], gib: float, cpu: bool, ceiling: float | None) -> None:
    summary = []
    for outcome in outcomes:
        scenario = outcome.scenario
        print(f"\n{scenario.name}: backend {scenario.backend}, co-residency "
              f"{scenario.co_residency}, {gib:g} GiB per job")  # fmt: skip
        print(table(["turn", "job", "switch s", "checksum", "waiting job's device memory"],
                    outcome.rows))  # fmt: skip
        p50 = p50_p90_p99(outcome.switch_seconds)[0]
        moves = p50 > 0 and scenario.expect == "dropped" and not cpu
        moved_gbps = 2 * gib * 2**30 / p50 / 1e9 if moves else 0.0
        summary.append((outcome, p50, moved_gbps))
    note = " (CPU harness check: no device memory moved)" if cpu else ""
    print(f"\n{gib:g} GiB per job{note}; copy ceiling "
          f"{'n/a' if ceiling is None else f'{ceiling:.2f} GB/s'}")  # fmt: skip
    for outcome, p50, moved_gbps in summary:
        sim = (
            "" if outcome.sim_moved_bytes is None else f" sim_moved_bytes={outcome.sim_moved_bytes}"
        )
        print(
            f"scenario={outcome.scenario.name} backend={outcome.scenario.backend} "
            f"handovers={len(outcome.switch_seconds)} verified={outcome.verified} "
            f"memory_{outcome.scenario.expect}={outcome.memory_as_expected} "
            f"switch_p50_s={p50:.3f} checkpoint_restore_gbps={moved_gbps:.2f}{sim}"
        )


if __name__ == "__main__":
    main()
