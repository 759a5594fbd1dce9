"""The PyTorch hooks on a CPU build of torch (no GPU here). torch cannot pin
memory without CUDA, so the offload hook falls back to ordinary host memory:
what is checked is that every tensor's storage really moves to a host buffer
and back, that the buffer is reused at the next eviction, that the tensors
keep their identity, and that the job continues bit for bit as if nothing
had happened. The pinned path, the copies on several streams and the device
memory handed back run on a GPU host (`TIMESHARE_GPU_TESTS=1 pytest -m gpu`,
torch with CUDA), and at full size in timeshare/gpu_check/switch.py's hooks scenario.

Here the tests that start no process; the others are in
tests/integration/test_torch_hooks.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from timeshare.hooks.nccl import NcclHooks
from timeshare.hooks.torch_offload import TorchOffloadHooks

torch = pytest.importorskip("torch")


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
