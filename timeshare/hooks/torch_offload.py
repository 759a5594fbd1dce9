"""A hook for PyTorch jobs: move given modules (parameters, their gradients,
buffers) and optimizer state to host memory on eviction and back to where
each tensor was on admission, then hand the freed device memory back to the
driver (empty the CUDA cache), so that a checkpointing backend stacked under
it (`app+cuda`) moves only the CUDA context.

Tensors keep their identity: each one's storage is swapped (``tensor.data``),
so references the job holds stay valid. Host copies are pinned where CUDA is
available (faster copies both ways); a CPU-only build of torch cannot pin, and
then uses ordinary memory. Both modes keep every value: nothing in a module
can be rebuilt in general.

Named torch_offload so that it never shadows the ``torch`` package."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import torch

from timeshare.hooks import WorkloadHooks
from timeshare.hooks.protocol import EvictMode


class TorchOffloadHooks(WorkloadHooks):
    def __init__(self, modules: Sequence[Any], optimizers: Sequence[Any] = ()) -> None:
        self.modules = list(modules)
        self.optimizers = list(optimizers)
        self.pinned = torch.cuda.is_available()
        # Where each moved tensor lived: it goes back there on admission.
        self._homes: list[tuple[Any, Any]] = []

    def evict(self, mode: EvictMode) -> None:
        if self._homes:
            return
        for tensor in self._tensors():
            self._homes.append((tensor, self._home(tensor)))
            tensor.data = self._to_host(tensor.data)
        # The copies run on each source device's stream: wait on every device
        # a tensor left, not only the current one, before its memory is reused.
        self._synchronize()
        if self.pinned:
            torch.cuda.empty_cache()

    def admit(self) -> None:
        for tensor, device in self._homes:
            tensor.data = self._to_device(tensor.data, device)
        self._synchronize()
        self._homes = []

    def moved_bytes(self) -> int:
        """Bytes now held in host memory for the job."""
        return sum(t.data.numel() * t.data.element_size() for t, _ in self._homes)

    def devices(self) -> list[Any]:
        """The CUDA devices the moved tensors came from."""
        found = {device for _, device in self._homes if device.type == "cuda"}
        return sorted(found, key=str)

    def _synchronize(self) -> None:
        for device in self.devices():
            torch.cuda.synchronize(device)

    def _home(self, tensor: Any) -> Any:
        return tensor.device

    def _to_device(self, data: Any, device: Any) -> Any:
        return data.to(device, non_blocking=self.pinned)

    def _to_host(self, data: Any) -> Any:
        host = torch.empty(data.shape, dtype=data.dtype, device="cpu", pin_memory=self.pinned)
        host.copy_(data, non_blocking=self.pinned)
        return host

    def _tensors(self) -> Iterator[Any]:
        seen: set[int] = set()
        candidates: list[Any] = []
        for module in self.modules:
            for parameter in module.parameters():
                # A gradient lives with its parameter: move the parameter first.
                candidates += [parameter, parameter.grad]
            candidates += list(module.buffers())
        for optimizer in self.optimizers:
            for state in optimizer.state.values():
                candidates += [value for value in state.values() if torch.is_tensor(value)]
        for tensor in candidates:
            if tensor is not None and id(tensor) not in seen:
                seen.add(id(tensor))
                yield tensor
