"""One rank of a two-rank job for tests/integration/test_torch_hooks.py: real
torch.distributed process groups (gloo on CPU) torn down and re-created by
NcclHooks, with an all-reduce of rank-distinct values after each step, so a
group that lost a rank or a rank that reduced alone shows in the sums. Writes
what it saw as JSON.

    python -m tests.nccl_ranks RANK STORE_DIR OUT"""

from __future__ import annotations

import json
import sys
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from timeshare.hooks.nccl import NcclHooks

WORLD = 2


def main() -> None:
    rank, store, out = int(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3])
    seen: dict[str, Any] = {}
    job: dict[str, Any] = {"generation": 0}

    def init_default() -> None:
        rendezvous = store / f"default-{job['generation']}"
        dist.init_process_group(
            "gloo",
            init_method=f"file://{rendezvous}",
            rank=rank,
            world_size=WORLD,
            timeout=timedelta(seconds=30),
        )

    def create_own() -> None:
        job["group"] = dist.new_group(list(range(WORLD)))

    def create_all() -> None:
        job["generation"] += 1
        init_default()
        create_own()

    def reduce(group: Any, scale: float) -> float:
        # Rank r contributes (r + 1) * scale: only both ranks together sum to 3 * scale.
        value = torch.tensor([(rank + 1) * scale])
        dist.all_reduce(value, group=group)
        return float(value.item())

    init_default()
    create_own()
    before = job["group"]
    own = NcclHooks(create_own, lambda: [job["group"]])
    own.evict("offload")
    seen["default kept"] = dist.is_initialized()
    seen["default after teardown"] = reduce(None, 1)
    seen["old group destroyed"] = before not in dist.distributed_c10d._world.pg_map
    own.admit()
    seen["new group"] = reduce(job["group"], 10)
    seen["new group is new"] = job["group"] is not before

    everything = NcclHooks(create_all, lambda: [job["group"]], include_default=True)
    everything.evict("offload")
    seen["default destroyed"] = not dist.is_initialized()
    everything.admit()
    seen["re-created default"] = reduce(None, 100)
    seen["re-created group"] = reduce(job["group"], 1000)
    dist.destroy_process_group()
    out.write_text(json.dumps(seen))


if __name__ == "__main__":
    main()
