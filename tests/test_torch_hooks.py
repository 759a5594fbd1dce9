"""The PyTorch hooks on a CPU build of torch (no GPU here). torch cannot pin
memory without CUDA, so the offload hook falls back to ordinary host memory:
what is checked is that every tensor's storage really moves to a fresh host
buffer and back, that the tensors keep their identity, and that the job
continues bit for bit as if nothing had happened. The pinned path and the
move off a GPU run in bench/gpu_switch.py on a GPU host."""

from __future__ import annotations

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


def test_process_groups_are_torn_down_on_eviction_and_made_again_on_admission(
    tmp_path: Path,
) -> None:
    dist = torch.distributed
    store = f"file://{tmp_path / 'store'}"

    def create() -> None:
        (tmp_path / "store").unlink(missing_ok=True)
        dist.init_process_group("gloo", init_method=store, rank=0, world_size=1)

    create()
    model, optimizer = trainer(2)
    hooks = NcclHooks(create, inner=TorchOffloadHooks([model], [optimizer]))
    try:
        hooks.evict("offload")
        assert not dist.is_initialized()
        hooks.admit()
        assert dist.is_initialized()
        summed = torch.ones(3)
        dist.all_reduce(summed)  # the new group works
        assert summed.tolist() == [1.0, 1.0, 1.0]
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
