"""The GPU check: real device state moved by the `cuda` backend.

Two processes each fill several GB of device memory with known random data
and take turns in one group through the embedded stack. After every grant the
data is verified (an exact checksum), and the evicted job's device memory is
checked to have dropped (NVML). Reports checkpoint+restore GB/s per switch
and, in the same run, pinned host<->device copy GB/s (torch) as the ceiling.

    python -m bench.gpu_switch                      # on a GPU host, backend cuda
    python -m bench.gpu_switch --backend cuda-checkpoint
    python -m bench.gpu_switch --cpu --gib 0.05     # no GPU: freeze backend, host
                                                    # memory; checks the harness only
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
from typing import Any

import timeshare
from activities.gpus import device_memory_by_pid
from bench.stack import LocalStack
from bench.stats import p50_p90_p99
from timeshare.status import table

GROUP = "gpu-switch"


class Holder:
    def __init__(self, job: str, gib: float, seed: int, cpu: bool, socket: Path) -> None:
        command = [sys.executable, "-m", "bench.gpu_holder", f"--group={GROUP}", f"--job={job}",
                   f"--gib={gib}", f"--seed={seed}"] + (["--cpu"] if cpu else [])  # fmt: skip
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
    args = parser.parse_args()
    backend = "freeze" if args.cpu else args.backend
    with tempfile.TemporaryDirectory() as scratch:
        stack = LocalStack(Path(scratch), backend=backend)
        holders: list[Holder] = []
        try:
            stack.start_all()
            socket = Path(scratch) / "agent.sock"
            holders = [Holder(f"job-{i}", args.gib, i, args.cpu, socket) for i in range(2)]
            rows, switch_seconds, verified, dropped = run(stack, holders, args.handovers, args.cpu)
        finally:
            for holder in holders:
                holder.stop()
            stack.stop_all()
    ceiling = None if args.cpu else copy_ceiling_gbps(min(args.gib, 1.0))
    p50 = p50_p90_p99(switch_seconds)[0]
    moved_gbps = 2 * args.gib * 2**30 / p50 / 1e9 if p50 > 0 else 0.0
    print()
    print(table(["turn", "job", "switch s", "checksum", "evicted job's device memory"], rows))
    note = " (CPU harness check: no device memory moved)" if args.cpu else ""
    print(f"backend {backend}, {args.gib:g} GiB per job{note}")
    print(
        f"handovers={len(switch_seconds)} verified={verified} memory_dropped={dropped} "
        f"switch_p50_s={p50:.3f} checkpoint_restore_gbps={moved_gbps:.2f} "
        f"copy_ceiling_gbps={ceiling if ceiling is None else round(ceiling, 2)}"
    )


def run(
    stack: LocalStack, holders: list[Holder], handovers: int, cpu: bool
) -> tuple[list[list[str]], list[float], int, str]:
    rows, switch_seconds, verified, dropped_checks = [], [], 0, []
    with timeshare.connect(stack.address) as client:
        jobs = [client.join(GROUP, f"job-{i}", [stack.node]) for i in range(2)]
        for turn in range(handovers + 1):
            index = turn % 2
            granted = jobs[index].acquire()
            ok = holders[index].checksum() == holders[index].expected
            verified += ok
            other = holders[1 - index]
            other_bytes = device_memory_by_pid().get(other.pid) if not cpu else None
            if turn > 0:
                switch_seconds.append(granted.switch_seconds)
                if other_bytes is not None:
                    dropped_checks.append(other_bytes == 0)
            memory = "n/a (CPU)" if other_bytes is None else f"{other_bytes / 2**30:.2f} GiB"
            checked = "ok" if ok else "MISMATCH"
            rows.append(
                [str(turn), f"job-{index}", f"{granted.switch_seconds:.3f}", checked, memory]
            )
            jobs[index].yield_()
        for job in jobs:
            job.leave()
    dropped = "n/a" if not dropped_checks else str(all(dropped_checks)).lower()
    return rows, switch_seconds, verified, dropped


if __name__ == "__main__":
    main()
