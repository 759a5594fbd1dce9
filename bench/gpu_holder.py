"""A process that holds known random data in device memory (or, with --cpu,
in host memory), registered with the node agent, and answers commands on
stdin: "checksum" (an exact integer sum of the data), "quit". With --hooks it
serves the PyTorch offload hook instead of registering plainly, so that the
agent's app layer moves the data to host memory itself. For bench.gpu_switch."""

from __future__ import annotations

import argparse
import json
import os
import sys
import warnings

with warnings.catch_warnings():
    warnings.simplefilter("ignore")  # torch's import of the pynvml shim warns that it is deprecated
    import torch

from timeshare.hooks import serve_hooks
from timeshare.hooks.torch_offload import TorchOffloadHooks
from timeshare.registration import register_process


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
    if args.hooks:
        serve_hooks(TorchOffloadHooks([module]), args.group, args.job)
    else:
        register_process(args.group, args.job)
    print(json.dumps({"pid": os.getpid(), "checksum": first}), flush=True)
    for line in sys.stdin:
        if line.strip() == "checksum":
            print(json.dumps({"checksum": checksum(module)}), flush=True)
        else:
            break


if __name__ == "__main__":
    main()
