"""One RL-shaped job of the blog scenario (timeshare.gpu_check.blog): a PyTorch
process with its state on the GPU that loops like an RL job,

- sampling: real kernels (matmuls) on the GPU for --sample-seconds;
- reward: host work for --reward-seconds, the GPU idle;
- training: real kernels on the GPU for --train-seconds;

and, with --group, takes a turn (acquire ... yield) for each GPU phase and
checks its own data after every grant. With --hooks it serves the PyTorch
offload hook (the `app` layer moves its tensors); otherwise it registers
plainly (the driver moves its memory).

On the GPU emulator (--emulated) torch has no CUDA: the state is a CPU
tensor plus device memory the emulated driver holds (filled and checked as
timeshare.gpu_check.cuda_rank does), and a GPU phase is a sleep of the same
length. Its figures are the harness's, never a GPU's.

Prints one JSON line per GPU phase ({"phase", "start", "end", "intact",
"switch_seconds": what its grant waited for a switch}) and
a last line {"iterations", "iteration_seconds", "checks", "verified"}.

    python -m timeshare.gpu_check.blog_job --gib 2 --iterations 6 [--group G --job J]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time
import warnings
from collections.abc import Callable, Iterator
from typing import Any

from timeshare.gpu_check import cuda_rank

# A square matmul of this side takes about a millisecond on a current GPU:
# small enough that a phase ends within a few ms of its length.
MATMUL_SIDE = 4096


def import_torch() -> Any:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch's import of the pynvml shim warns of deprecation
        import torch
    return torch


class DeviceState:
    """The job's data, and a check that it reads back as written: a PyTorch
    module's buffer (on the emulator, where PyTorch may be missing, only with
    --hooks) and, on the emulator, device memory of the emulated driver."""

    def __init__(self, gib: float, seed: int, emulated: bool, hooks: bool) -> None:
        self.module: Any = None
        self.expected = 0
        if hooks or not emulated:
            from timeshare.gpu_check.torch_holder import holder

            self.module = holder(gib, seed, "cpu" if emulated else "cuda")
            self.expected = self.checksum()
        self.pointer: int | None = None
        self.count = int(gib * 2**30)
        self.seed = seed
        if emulated:
            self.pointer = driver_memory(self.count, seed)
            self.driver_expected = cuda_rank.expected_checksum(self.count, seed)
            self.buffer = bytearray(min(cuda_rank.READ_CHUNK, self.count))

    def checksum(self) -> int:
        from timeshare.gpu_check.torch_holder import checksum

        return checksum(self.module)

    def intact(self) -> bool:
        if self.module is not None and self.checksum() != self.expected:
            return False
        if self.pointer is None:
            return True
        return cuda_rank.read_back(self.pointer, self.count, self.buffer) == self.driver_expected


def driver_memory(count: int, seed: int) -> int:
    """Device memory on the (emulated) driver, filled with the seeded pattern."""
    from cuda.bindings import driver

    (result,) = driver.cuInit(0)
    cuda_rank.check(result, "cuInit")
    result, device = driver.cuDeviceGet(0)
    cuda_rank.check(result, "cuDeviceGet")
    result, context = driver.cuDevicePrimaryCtxRetain(device)
    cuda_rank.check(result, "cuDevicePrimaryCtxRetain")
    (result,) = driver.cuCtxSetCurrent(context)
    cuda_rank.check(result, "cuCtxSetCurrent")
    result, pointer = driver.cuMemAlloc(count)
    cuda_rank.check(result, "cuMemAlloc")
    cuda_rank.fill(int(pointer), count, seed)
    return int(pointer)


def gpu_work(seconds: float, emulated: bool) -> Callable[[], None]:
    """A phase of real kernels on the GPU lasting about ``seconds``."""
    if emulated:
        return lambda: time.sleep(seconds)
    torch = import_torch()
    left = torch.randn(MATMUL_SIDE, MATMUL_SIDE, device="cuda")
    right = torch.randn(MATMUL_SIDE, MATMUL_SIDE, device="cuda")

    def work() -> None:
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            for _ in range(8):
                torch.matmul(left, right)
            torch.cuda.synchronize()

    return work


def emit(entry: dict[str, Any]) -> None:
    print(json.dumps(entry), flush=True)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m timeshare.gpu_check.blog_job")
    parser.add_argument("--gib", type=float, default=2.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--iterations", type=int, default=6)
    parser.add_argument("--sample-seconds", type=float, default=0.6)
    parser.add_argument("--train-seconds", type=float, default=0.4)
    parser.add_argument("--reward-seconds", type=float, default=1.5)
    parser.add_argument("--group", help="take turns in this group (alone without it)")
    parser.add_argument("--job")
    parser.add_argument("--address", help="the gateway (default TIMESHARE_ADDRESS)")
    parser.add_argument("--hooks", action="store_true", help="serve the PyTorch offload hook")
    parser.add_argument("--emulated", action="store_true", help="on the GPU emulator")
    args = parser.parse_args(argv)
    if (args.group is None) != (args.job is None):
        parser.error("--group and --job go together")
    state = DeviceState(args.gib, args.seed, args.emulated, args.hooks)
    phases = {
        "rollout": gpu_work(args.sample_seconds, args.emulated),
        "train": gpu_work(args.train_seconds, args.emulated),
    }
    turn, leave = turns(args, state)
    emit({"pid": os.getpid(), "ready": True})
    checks = verified = 0
    started = time.perf_counter()
    for _ in range(args.iterations):
        for phase, work in phases.items():
            with turn(phase) as granted:
                intact = state.intact()
                checks, verified = checks + 1, verified + intact
                start = time.time()
                work()
                emit({"phase": phase, "start": start, "end": time.time(), "intact": intact,
                      "switch_seconds": getattr(granted, "switch_seconds", 0.0)})  # fmt: skip
            if phase == "rollout":
                time.sleep(args.reward_seconds)  # scoring on the host: the GPU is free
    seconds = (time.perf_counter() - started) / max(1, args.iterations)
    leave()
    emit({"iterations": args.iterations, "iteration_seconds": seconds, "checks": checks,
          "verified": verified})  # fmt: skip


def turns(args: argparse.Namespace,
          state: DeviceState) -> tuple[Callable[[str], Any], Callable[[], None]]:  # fmt: skip
    """A turn per GPU phase through the group, or none when alone; and how to leave."""
    if args.group is None:

        @contextlib.contextmanager
        def alone(phase: str) -> Iterator[None]:
            yield

        return alone, lambda: None
    import timeshare
    from timeshare.hooks import serve_hooks
    from timeshare.models import GroupPolicy
    from timeshare.registration import register_process

    client = timeshare.connect(args.address) if args.address else timeshare.connect()
    # Co-residency off: two jobs' state would fit on one GPU, and nothing would move.
    job = client.join(args.group, args.job, policy=GroupPolicy(co_residency="off"))
    server = None
    if args.hooks:
        from timeshare.hooks.torch_offload import TorchOffloadHooks

        server = serve_hooks(TorchOffloadHooks([state.module]), args.group, args.job)
    else:
        register_process(args.group, args.job)

    def leave() -> None:
        job.leave()
        if server is not None:
            server.close()
        client.close()

    return (lambda phase: job.turn(phase=phase)), leave


if __name__ == "__main__":
    try:
        main()
    except KeyboardInterrupt:
        sys.exit(130)
    # Everything is reported and the job has left: end here, before the interpreter's
    # teardown meets threads that torch, gRPC and the driver still hold (seen to abort
    # with "terminate called without an active exception").
    sys.stdout.flush()
    os._exit(0)
