"""The PyTorch hooks on a CPU build of torch, in jobs that run as processes
(what is checked, and where the GPU path runs: tests/unit/test_torch_hooks.py)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.unit.test_torch_hooks import torch
from timeshare.hooks.torch_offload import TorchOffloadHooks


@pytest.mark.gpu
def test_on_a_gpu_tensors_move_to_pinned_buffers_and_the_device_memory_goes_back() -> None:
    if not torch.cuda.is_available():
        pytest.skip("this torch has no CUDA")
    torch.cuda.empty_cache()
    allocated, reserved = torch.cuda.memory_allocated(), torch.cuda.memory_reserved()
    model = torch.nn.Linear(1024, 1024).cuda()
    model.register_buffer("strided", torch.randn(512, 256, device="cuda").t())
    before = {name: t.cpu() for name, t in model.state_dict().items()}
    hooks = TorchOffloadHooks([model], streams=3)
    for _ in range(2):
        hooks.evict("offload")
        assert all(t.device.type == "cpu" and t.is_pinned() for t in hooks._tensors())
        # Handed back to the driver, not only to torch's cache.
        assert torch.cuda.memory_allocated() == allocated
        assert torch.cuda.memory_reserved() == reserved
        hooks.admit()
        for name, tensor in model.state_dict().items():
            assert tensor.device.type == "cuda", name
            assert torch.equal(tensor.cpu(), before[name]), name
    assert [m.direction for m in hooks.moves] == ["evict", "admit"] * 2


def test_only_the_jobs_own_groups_are_torn_down_and_both_ranks_reduce_after_re_creation(
    tmp_path: Path,
) -> None:
    """Two real ranks (gloo): the job's group goes and comes back while the
    default group keeps working; with include_default both go and come back.
    Each all-reduce sums rank-distinct values, so only both ranks together
    give the expected sum."""
    command = [sys.executable, "-m", "tests.nccl_ranks"]
    ranks = [
        subprocess.Popen([*command, str(rank), str(tmp_path), str(tmp_path / f"rank{rank}.json")])
        for rank in range(2)
    ]
    assert [rank.wait(timeout=120) for rank in ranks] == [0, 0]
    expected = {
        "default kept": True, "default after teardown": 3.0, "old group destroyed": True,
        "new group": 30.0, "new group is new": True,
        "default destroyed": True, "re-created default": 300.0, "re-created group": 3000.0,
    }  # fmt: skip
    for rank in range(2):
        assert json.loads((tmp_path / f"rank{rank}.json").read_text()) == expected
