"""The GPU check: real device state moved by the CUDA backends, for jobs shaped
like real RL jobs.

Each job has two CUDA ranks (bench.cuda_rank), each holding known random data
in device memory and each with a DataLoader-style child that never touches
CUDA. Two such jobs take turns in one group through the embedded stack, in
these scenarios:

- cuda: the in-process driver backend moves each yielding job's memory to the host;
- freeze+cuda: the same, and every process of the job (the children too) is
  frozen once its device state is checkpointed;
- cuda-checkpoint: the `cuda-checkpoint` utility, one run per rank at once;
- co-residency: both jobs fit on the GPU, so a switch is a lock and an unlock,
  and NVML shows the waiting job's memory never leaves the device;
- hooks (GPU only): `app+cuda`, a PyTorch job whose offload hook moves its data
  to pinned host memory first (bench.gpu_holder).

After every grant each rank's data is read back and checked (CRC32), and NVML
says whether the waiting job's device memory dropped (or, co-resident,
stayed). Reports checkpoint and restore GB/s per rank (from the agent's
record of each rank's bytes and seconds) next to the pinned host<->device copy
ceiling measured in the same run (torch).

    python -m bench.gpu_switch                      # on a GPU host
    python -m bench.gpu_switch --only freeze+cuda
    python -m bench.gpu_switch --emulator --gib 0.02   # no GPU: the GPU EMULATOR
                                                       # (tests/emulator); checks the
                                                       # harness only, no GPU figure
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel

import timeshare
from bench.stack import LocalStack
from bench.stats import p50_p90_p99
from timeshare.activities.gpus import device_memory_by_pid
from timeshare.credentials import JOB_TOKEN_ENV
from timeshare.models import CoResidency, GroupPolicy
from timeshare.status import table

Expect = Literal["dropped", "stayed"]
EMULATED = "TIMESHARE_GPU_SWITCH_EMULATED"
# The emulator's scratch folder, removed by the run that execve made: the
# process that created it is gone by then.
EMULATOR_SCRATCH = "TIMESHARE_GPU_SWITCH_EMULATOR_SCRATCH"
RANKS = 2


class Scenario(BaseModel):
    name: str
    backend: str
    co_residency: CoResidency
    # What NVML should show of the waiting job's device memory after a switch.
    expect: Expect
    # A PyTorch job serving its offload hook instead of CUDA ranks (needs torch CUDA).
    torch_hooks: bool = False


SCENARIOS = [
    Scenario(name="cuda", backend="cuda", co_residency="off", expect="dropped"),
    Scenario(name="freeze+cuda", backend="freeze+cuda", co_residency="off", expect="dropped"),
    Scenario(name="cuda-checkpoint", backend="cuda-checkpoint", co_residency="off",
             expect="dropped"),
    Scenario(name="co-residency", backend="cuda", co_residency="auto", expect="stayed"),
    Scenario(name="hooks", backend="app+cuda", co_residency="off", expect="dropped",
             torch_hooks=True),
]  # fmt: skip


class Rank:
    """A process holding known data on the device (bench.cuda_rank or bench.gpu_holder)."""

    def __init__(self, command: list[str], socket: Path, token: str) -> None:
        # The job's token: the agent admits the rank into its job only with it.
        env = {**os.environ, "TIMESHARE_AGENT_SOCKET": str(socket), JOB_TOKEN_ENV: token}
        self.process = subprocess.Popen(
            command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env
        )
        hello = self.read()
        self.pid, self.expected = int(hello["pid"]), int(hello["checksum"])
        self.loader = int(hello.get("loader", 0))

    def read(self) -> dict[str, Any]:
        assert self.process.stdout is not None
        line = self.process.stdout.readline()
        if not line:
            raise RuntimeError("a rank process exited")
        reply: dict[str, Any] = json.loads(line)
        return reply

    def intact(self) -> bool:
        assert self.process.stdin is not None
        self.process.stdin.write("checksum\n")
        self.process.stdin.flush()
        return int(self.read()["checksum"]) == self.expected

    def stop(self) -> None:
        for pid in (self.loader, self.process.pid):
            if pid:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        self.process.wait()


def start_job(group: str, job: str, gib: float, seed: int, scenario: Scenario,
              socket: Path, token: str) -> list[Rank]:  # fmt: skip
    if scenario.torch_hooks:
        return [
            Rank(
                [
                    sys.executable,
                    "-m",
                    "bench.gpu_holder",
                    f"--group={group}",
                    f"--job={job}",
                    f"--gib={gib}",
                    f"--seed={seed}",
                    "--hooks",
                ],
                socket,
                token,
            )
        ]
    per_rank = int(gib * 2**30) // RANKS
    return [
        Rank([sys.executable, "-m", "bench.cuda_rank", f"--group={group}", f"--job={job}",
              f"--bytes={per_rank}", f"--seed={seed * RANKS + rank}"], socket, token)
        for rank in range(RANKS)
    ]  # fmt: skip


class Outcome(BaseModel):
    scenario: Scenario
    rows: list[list[str]]
    switch_seconds: list[float]
    verified: int
    checks: int
    # NVML's word on the waiting job's memory after each switch.
    memory_as_expected: bool
    # Per rank and switch, from the agent's record: GB/s of each checkpoint and restore.
    checkpoint_gbps: list[float]
    restore_gbps: list[float]
    ranks_reported: int


def copy_ceiling_gbps(gib: float) -> float | None:
    """Pinned host->device then device->host copy rate, torch; None without a GPU."""
    try:
        import torch
    except ImportError:
        return None
    if not torch.cuda.is_available():
        return None
    import time

    count = int(gib * 2**30)
    host = torch.empty(count, dtype=torch.uint8, pin_memory=True)
    device = torch.empty(count, dtype=torch.uint8, device="cuda")
    torch.cuda.synchronize()
    start = time.perf_counter()
    device.copy_(host, non_blocking=True)
    host.copy_(device, non_blocking=True)
    torch.cuda.synchronize()
    return 2 * count / (time.perf_counter() - start) / 1e9


def run_scenario(stack: LocalStack, scenario: Scenario, gib: float, handovers: int) -> Outcome:
    if stack.backend != scenario.backend:
        stack.backend = scenario.backend
        stack.restart("agent")
    group = f"gpu-switch-{scenario.name.replace('+', '-')}"
    jobs: list[list[Rank]] = []
    policy = GroupPolicy(co_residency=scenario.co_residency)
    with timeshare.connect(stack.address) as client:
        # Joined before the ranks start: they register with their job's token.
        handles = [client.join(group, f"job-{i}", [stack.node], policy) for i in range(2)]
        try:
            jobs = [start_job(group, f"job-{i}", gib, i, scenario, stack.socket_path,
                              handles[i].token) for i in range(2)]  # fmt: skip
            outcome = take_turns(scenario, handles, jobs, handovers, gib)
        finally:
            for ranks in jobs:
                for rank in ranks:
                    rank.stop()
    per_rank = rank_rates(stack.process_record(), group)
    outcome.checkpoint_gbps, outcome.restore_gbps = per_rank["checkpoint"], per_rank["restore"]
    outcome.ranks_reported = len(per_rank["pids"])
    return outcome


def rank_rates(record: list[dict[str, Any]], group: str) -> dict[str, list[Any]]:
    """GB/s of each rank's checkpoints and restores, by the agent's record."""
    rates: dict[str, list[Any]] = {"checkpoint": [], "restore": [], "pids": []}
    pids = set()
    for event in record:
        if event.get("group") != group or event.get("event") not in ("checkpoint", "restore"):
            continue
        if event.get("bytes") and event.get("seconds"):
            rates[event["event"]].append(event["bytes"] / event["seconds"] / 1e9)
            pids.add(event["pid"])
    rates["pids"] = sorted(pids)
    return rates


def take_turns(scenario: Scenario, handles: list[timeshare.Job], jobs: list[list[Rank]],
               handovers: int, gib: float) -> Outcome:  # fmt: skip
    rows, switch_seconds, verified, checks, held = [], [], 0, 0, []
    for turn in range(handovers + 1):
        index = turn % 2
        granted = handles[index].acquire()
        ok = [rank.intact() for rank in jobs[index]]
        verified += all(ok)
        checks += 1
        used = device_memory_by_pid()
        other = [used.get(rank.pid) or 0 for rank in jobs[1 - index]]
        if turn > 0:
            switch_seconds.append(granted.switch_seconds)
            per_rank = int(gib * 2**30) // len(other)
            if scenario.expect == "stayed":
                held.append(all(count >= per_rank for count in other))
            else:
                held.append(all(count == 0 for count in other))
        memory = ", ".join(f"{count / 2**30:.2f}" for count in other)
        rows.append([str(turn), f"job-{index}", f"{granted.switch_seconds:.3f}",
                     "ok" if all(ok) else "MISMATCH", f"{memory} GiB"])  # fmt: skip
        handles[index].yield_()
    for handle in handles:
        handle.leave()
    return Outcome(scenario=scenario, rows=rows, switch_seconds=switch_seconds,
                   verified=verified, checks=checks, memory_as_expected=all(held),
                   checkpoint_gbps=[], restore_gbps=[], ranks_reported=0)  # fmt: skip


def report(outcomes: list[Outcome], gib: float, emulated: bool, ceiling: float | None) -> None:
    for outcome in outcomes:
        s = outcome.scenario
        print(f"\n{s.name}: backend {s.backend}, co-residency {s.co_residency}, "
              f"{gib:g} GiB per job")  # fmt: skip
        print(table(["turn", "job", "switch s", "data", "waiting job's ranks on the device"],
                    outcome.rows))  # fmt: skip
    where = "GPU EMULATOR: not a GPU figure" if emulated else "GPU"
    print(f"\n{gib:g} GiB per job, {RANKS} ranks ({where}); pinned copy ceiling "
          f"{'n/a' if ceiling is None else f'{ceiling:.2f} GB/s'}")  # fmt: skip
    prefix = "emulated_" if emulated else ""
    for outcome in outcomes:
        s = outcome.scenario
        p50 = p50_p90_p99(outcome.switch_seconds)[0]
        rates = [
            f"{prefix}{name}_gbps_per_rank_p50={p50_p90_p99(values)[0]:.2f}" if values
            else f"{prefix}{name}_gbps_per_rank_p50=n/a"
            for name, values in (("checkpoint", outcome.checkpoint_gbps),
                                 ("restore", outcome.restore_gbps))
        ]  # fmt: skip
        print(
            f"scenario={s.name} backend={s.backend} handovers={len(outcome.switch_seconds)} "
            f"verified={outcome.verified}/{outcome.checks} "
            f"memory_{s.expect}={str(outcome.memory_as_expected).lower()} "
            f"ranks_reported={outcome.ranks_reported} switch_p50_s={p50:.3f} "
            + " ".join(rates)
            + ("" if ceiling is None else f" copy_ceiling_gbps={ceiling:.2f}")
        )


def on_the_emulator() -> None:
    """Run this benchmark again, on the GPU emulator (built from C with gcc)."""
    from tests import emulator

    lib_dir = emulator.build(emulator.default_build_dir())
    root = Path(tempfile.mkdtemp(prefix="gpu-switch-emulator-"))
    env = emulator.environment(lib_dir, root / "state", root / "calls.jsonl", gpu_memory=8 << 30)
    env[EMULATED] = "1"
    env[EMULATOR_SCRATCH] = str(root)
    os.execve(sys.executable, [sys.executable, "-m", "bench.gpu_switch", *sys.argv[1:]],
              {**os.environ, **env})  # fmt: skip


def main() -> None:
    try:
        run(parse_arguments())
    finally:
        scratch = os.environ.get(EMULATOR_SCRATCH)
        if scratch:
            shutil.rmtree(scratch, ignore_errors=True)


def parse_arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="Device state moved by the CUDA backends.")
    parser.add_argument("--gib", type=float, default=4.0, help="device memory per job")
    parser.add_argument("--handovers", type=int, default=10)
    parser.add_argument("--emulator", action="store_true", help="no GPU: the GPU emulator")
    parser.add_argument("--only", help="run only this scenario")
    return parser.parse_args()


def run(args: argparse.Namespace) -> None:
    emulated = os.environ.get(EMULATED) == "1"
    if args.emulator and not emulated:
        on_the_emulator()
    chosen = [s for s in SCENARIOS if args.only in (None, s.name)]
    if emulated:
        # The emulator runs no PyTorch CUDA: the hooks scenario needs a GPU.
        chosen = [s for s in chosen if not s.torch_hooks]
    outcomes = []
    with tempfile.TemporaryDirectory() as scratch:
        # The agent records each rank's bytes and seconds (--record).
        stack = LocalStack(Path(scratch), backend=chosen[0].backend)
        try:
            stack.start_all()
            for scenario in chosen:
                outcomes.append(run_scenario(stack, scenario, args.gib, args.handovers))
        finally:
            stack.stop_all()
    ceiling = None if emulated else copy_ceiling_gbps(min(args.gib, 1.0))
    report(outcomes, args.gib, emulated, ceiling)


if __name__ == "__main__":
    main()
