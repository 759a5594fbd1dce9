"""A process that holds known random data in device memory (or, with --cpu,
in host memory), registered with the node agent, and answers commands on
stdin: "checksum" (an exact integer sum of the data), "quit". For
bench.gpu_switch."""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from timeshare.registration import register_process


def allocate(gib: float, seed: int, cpu: bool) -> tuple[Any, Any]:
    """The data, and a function giving its checksum."""
    count = int(gib * 2**30) // 8
    if cpu:
        import numpy as np

        data = np.random.default_rng(seed).integers(0, 2**40, size=count, dtype=np.int64)
        return data, lambda: int(data.sum(dtype=np.int64))
    import torch

    generator = torch.Generator(device="cuda").manual_seed(seed)
    tensor = torch.randint(
        0, 2**40, (count,), dtype=torch.int64, device="cuda", generator=generator
    )
    return tensor, lambda: int(tensor.sum().item())


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--group", required=True)
    parser.add_argument("--job", required=True)
    parser.add_argument("--gib", type=float, default=4.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--cpu", action="store_true")
    args = parser.parse_args()
    _data, checksum = allocate(args.gib, args.seed, args.cpu)
    first = checksum()
    register_process(args.group, args.job)
    print(json.dumps({"pid": os.getpid(), "checksum": first}), flush=True)
    for line in sys.stdin:
        if line.strip() == "checksum":
            print(json.dumps({"checksum": checksum()}), flush=True)
        else:
            break


if __name__ == "__main__":
    main()
