"""A process that holds known random data in device memory (or, with --cpu,
in host memory), registered with the node agent, and answers commands on
stdin: "checksum" (an exact integer sum of the data), "moves" (the offload
hook's timed evictions and admissions since the last ask), "quit". With
--hooks it serves the PyTorch offload hook instead of registering plainly,
so that the agent's app layer moves the data to host memory itself, and
first measures the pinned copy ceiling on the same bytes: a pinned host
buffer filled from the device and copied back (torch, median of three), the
figure the hook's rate is judged against. For timeshare.gpu_check.switch."""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import warnings

with warnings.catch_warnings():
    warnings.simplefilter("ignore")  # torch's import of the pynvml shim warns that it is deprecated
    import torch

from timeshare.hooks import serve_hooks
from timeshare.hooks.torch_offload import TorchOffloadHooks
from timeshare.registration import register_process

CEILING_REPEATS = 3


def holder(gib: float, seed: int, device: str) -> torch.nn.Module:
    """A module whose one buffer is the data: the offload hook moves buffers."""
    count = int(gib * 2**30) // 8
    generator = torch.Generator(device=device).manual_seed(seed)
    data = torch.randint(0, 2**40, (count,), dtype=torch.int64, device=device, generator=generator)
    module = torch.nn.Module()
    module.register_buffer("data", data)
    return module


def checksum(module: torch.nn.Module) -> int:
    return int(module.get_buffer("data").sum().item())


def copy_ceiling(data: torch.Tensor) -> dict[str, float]:
    """GB/s of a pinned copy of ``data`` out of the device ("evict") and back
    in ("admit"): what an offload of these bytes could reach at best."""
    host = torch.empty(data.shape, dtype=data.dtype, pin_memory=True)
    rates: dict[str, list[float]] = {"evict": [], "admit": []}
    for _ in range(CEILING_REPEATS):
        for direction, (target, source) in (("evict", (host, data)), ("admit", (data, host))):
            torch.cuda.synchronize()
            start = time.perf_counter()
            target.copy_(source, non_blocking=True)
            torch.cuda.synchronize()
            seconds = time.perf_counter() - start
            rates[direction].append(data.numel() * data.element_size() / seconds / 1e9)
    del host
    return {direction: statistics.median(values) for direction, values in rates.items()}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--group", required=True)
    parser.add_argument("--job", required=True)
    parser.add_argument("--gib", type=float, default=4.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--cpu", action="store_true")
    parser.add_argument("--hooks", action="store_true", help="serve the PyTorch offload hook")
    args = parser.parse_args()
    module = holder(args.gib, args.seed, "cpu" if args.cpu else "cuda")
    first = checksum(module)
    hello: dict[str, object] = {"pid": os.getpid(), "checksum": first}
    hooks = None
    if args.hooks:
        if not args.cpu:
            hello["ceiling"] = copy_ceiling(module.get_buffer("data"))
        hooks = TorchOffloadHooks([module])
        serve_hooks(hooks, args.group, args.job)
    else:
        register_process(args.group, args.job)
    print(json.dumps(hello), flush=True)
    reported = 0
    for line in sys.stdin:
        command = line.strip()
        if command == "checksum":
            print(json.dumps({"checksum": checksum(module)}), flush=True)
        elif command == "moves":
            moves = hooks.moves[reported:] if hooks else []
            reported += len(moves)
            print(json.dumps({"moves": [[m.direction, m.bytes, m.seconds] for m in moves]}),
                  flush=True)  # fmt: skip
        else:
            break


if __name__ == "__main__":
    main()
