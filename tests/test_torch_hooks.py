"""The PyTorch hooks on a CPU build of torch (no GPU here). torch cannot pin
memory without CUDA, so the offload hook falls back to ordinary host memory:
what is checked is that every tensor's storage really moves to a host buffer
and back, that the buffer is reused at the next eviction, that the tensors
keep their identity, and that the job continues bit for bit as if nothing
had happened. The pinned path, the copies on several streams and the device
memory handed back run on a GPU host (`TIMESHARE_GPU_TESTS=1 pytest -m gpu`,
torch with CUDA), and at full size in bench/gpu_switch.py's hooks scenario."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from timeshare.hooks.nccl import NcclHooks  # noqa: E402
from timeshare.hooks.torch_offload import TorchOffloadHooks  # noqa: E402


def trainer(seed: int) -> tuple[Any, Any]:
    torch.manual_seed(seed)
    model = torch.nn.Sequential(
        torch.nn.Linear(16, 32), torch.nn.BatchNorm1d(32), torch.nn.ReLU(), torch.nn.Linear(32, 4)
    )
    return model, torch.optim.Adam(model.parameters(), lr=1e-2)


def step(model: Any, optimizer: Any, batch: int) -> None:
    generator = torch.Generator().manual_seed(batch)
    inputs = torch.randn(8, 16, generator=generator)
    optimizer.zero_grad(set_to_none=False)
    model(inputs).square().mean().backward()
    optimizer.step()


def everything(model: Any, optimizer: Any) -> list[Any]:
    hooks = TorchOffloadHooks([model], [optimizer])
    return list(hooks._tensors())


def test_every_tensor_moves_out_and_back_bit_for_bit() -> None:
    model, optimizer = trainer(0)
    step(model, optimizer, 0)
    tensors = everything(model, optimizer)
    # Parameters, their gradients, BatchNorm's buffers, Adam's moments and steps.
    assert len(tensors) > 3 * len(list(model.parameters()))
    before = [(t, t.clone(), t.data_ptr()) for t in tensors]
    hooks = TorchOffloadHooks([model], [optimizer])
    assert not hooks.pinned  # a CPU-only build cannot pin: ordinary host memory
    hooks.evict("offload")
    assert hooks.moved_bytes() == sum(t.numel() * t.element_size() for t in tensors)
    for tensor, _copy, address in before:
        assert tensor.data_ptr() != address  # its storage now lives in a new host buffer
    hooks.admit()
    for tensor, copy, _address in before:
        assert torch.equal(tensor, copy) and tensor.dtype == copy.dtype
    assert hooks.moved_bytes() == 0


def test_a_job_evicted_between_steps_trains_exactly_as_one_left_alone() -> None:
    alone, alone_optimizer = trainer(1)
    shared, shared_optimizer = trainer(1)
    hooks = TorchOffloadHooks([shared], [shared_optimizer])
    for batch in range(4):
        step(alone, alone_optimizer, batch)
        step(shared, shared_optimizer, batch)
        hooks.evict("discard" if batch % 2 else "offload")  # both keep every value
        hooks.admit()
    for kept, moved in zip(alone.state_dict().values(), shared.state_dict().values(), strict=True):
        assert torch.equal(kept, moved)


def test_host_buffers_are_reused_by_the_next_eviction_and_every_move_is_timed() -> None:
    model, optimizer = trainer(4)
    step(model, optimizer, 0)
    hooks = TorchOffloadHooks([model], [optimizer])
    total = sum(t.numel() * t.element_size() for t in hooks._tensors())
    hooks.evict("offload")
    # Held here, the first eviction's buffers cannot be freed and handed out again
    # by chance: only a reused buffer has the same address next time.
    first = [(tensor, tensor.data) for tensor, _ in hooks._homes]
    hooks.admit()
    step(model, optimizer, 1)
    hooks.evict("offload")
    assert [tensor.data_ptr() for tensor, _ in first] == [data.data_ptr() for _, data in first]
    hooks.admit()
    assert [(m.direction, m.bytes) for m in hooks.moves] == [
        ("evict", total), ("admit", total), ("evict", total), ("admit", total),
    ]  # fmt: skip
    assert all(m.seconds > 0 for m in hooks.moves)


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


class TwoDeviceOffload(TorchOffloadHooks):
    """Tensors that count as living on cuda:0 and cuda:1 (in turn) while
    staying in host memory: this CPU build of torch has no device to copy
    to. What is checked is which devices are synchronised."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self._next = 0

    def _home(self, tensor: Any) -> Any:
        self._next += 1
        return torch.device(f"cuda:{self._next % 2}")

    def _allocate_on(self, device: Any, like: Any) -> Any:
        return torch.empty_like(like)


def test_every_device_the_tensors_used_is_synchronised_both_ways(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    synchronised: list[str] = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda d=None: synchronised.append(str(d)))
    model, optimizer = trainer(3)
    hooks = TwoDeviceOffload([model], [optimizer])
    hooks.evict("offload")
    assert synchronised == ["cuda:0", "cuda:1"]
    hooks.admit()
    assert synchronised == ["cuda:0", "cuda:1"] * 2


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


def test_the_default_group_is_refused_unless_the_job_includes_it(tmp_path: Path) -> None:
    dist = torch.distributed
    dist.init_process_group(
        "gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1
    )
    try:
        hooks = NcclHooks(lambda: None, lambda: [dist.group.WORLD])
        with pytest.raises(ValueError, match="pass include_default=True"):
            hooks.evict("offload")
        assert dist.is_initialized()
    finally:
        dist.destroy_process_group()
