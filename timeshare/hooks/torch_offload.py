"""A hook for PyTorch jobs: move given modules (parameters, their gradients,
buffers) and optimizer state to host memory on eviction and back to where
each tensor was on admission, then hand the freed device memory back to the
driver (empty the CUDA cache), so that a checkpointing backend stacked under
it (`app+cuda`) moves only the CUDA context.

Tensors keep their identity: each one's storage is swapped (``tensor.data``),
so references the job holds stay valid. Both modes keep every value: nothing
in a module can be rebuilt in general.

Speed, where CUDA is available: each tensor's host copy lives in a pinned
buffer allocated at its first eviction and reused at every later one (pinning
gigabytes takes longer than copying them, and pageable copies run at a
fraction of the link), and the copies are issued without blocking, split in
slices over several CUDA streams per device, then waited for once. The host
memory the buffers hold stays with the job while it lives. A CPU-only build of
torch cannot pin: it copies into ordinary, equally reused, host buffers.

Each eviction and admission is timed (``moves``): timeshare.gpu_check.switch reports
its rate next to a pinned copy measured in the same process.

Named torch_offload so that it never shadows the ``torch`` package."""

from __future__ import annotations

import time
import weakref
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import torch

from timeshare.hooks import WorkloadHooks
from timeshare.hooks.protocol import EvictMode

# Copies per device run on this many streams at once, each in slices of at
# least this size (a slice is one cudaMemcpyAsync: fewer, larger calls).
STREAMS = 4
SLICE_BYTES = 64 * 2**20


@dataclass(frozen=True)
class OffloadMove:
    """One eviction ("evict": device to host) or admission ("admit")."""

    direction: Literal["evict", "admit"]
    bytes: int
    seconds: float

    @property
    def gbps(self) -> float:
        return self.bytes / self.seconds / 1e9 if self.seconds > 0 else 0.0


class TorchOffloadHooks(WorkloadHooks):
    def __init__(
        self, modules: Sequence[Any], optimizers: Sequence[Any] = (), streams: int = STREAMS
    ) -> None:
        self.modules = list(modules)
        self.optimizers = list(optimizers)
        self.pinned = torch.cuda.is_available()
        self.stream_count = max(1, streams)
        # Where each moved tensor lived: it goes back there on admission.
        self._homes: list[tuple[Any, Any]] = []
        # Each tensor's host buffer, kept for its next eviction, by id(tensor)
        # with a weak reference that tells a reused id from the same tensor.
        # (Not a WeakKeyDictionary: its lookups compare tensors with ==.)
        self._host_buffers: dict[int, tuple[weakref.ref[Any], Any]] = {}
        self._streams: dict[Any, list[Any]] = {}
        self.moves: list[OffloadMove] = []

    def evict(self, mode: EvictMode) -> None:
        if self._homes:
            return
        start = time.perf_counter()
        pairs, kept = [], {}
        for tensor in self._tensors():
            self._homes.append((tensor, self._home(tensor)))
            buffer = self._host_buffer(tensor)
            kept[id(tensor)] = (weakref.ref(tensor), buffer)
            pairs.append((tensor.data, buffer))
        # Buffers of tensors the job no longer holds go now.
        self._host_buffers = kept
        self._copy(pairs)
        for (tensor, _), (_, host) in zip(self._homes, pairs, strict=True):
            tensor.data = host
        del pairs  # the last references to the device storage
        if self.pinned:
            torch.cuda.empty_cache()
        self._moved("evict", start)

    def admit(self) -> None:
        start = time.perf_counter()
        pairs = [(tensor.data, self._allocate_on(device, tensor.data))
                 for tensor, device in self._homes]  # fmt: skip
        self._copy(pairs)
        for (tensor, _), (_, target) in zip(self._homes, pairs, strict=True):
            tensor.data = target
        self._moved("admit", start)
        self._homes = []

    def moved_bytes(self) -> int:
        """Bytes now held in host memory for the job."""
        return sum(t.data.numel() * t.data.element_size() for t, _ in self._homes)

    def devices(self) -> list[Any]:
        """The CUDA devices the moved tensors came from."""
        found = {device for _, device in self._homes if device.type == "cuda"}
        return sorted(found, key=str)

    # -- copies ----------------------------------------------------------------

    def _copy(self, pairs: list[tuple[Any, Any]]) -> None:
        """Copy each source into its target: on the CUDA side's streams,
        without blocking, then wait for every device the tensors used."""
        for source, target in pairs:
            device = source.device if source.device.type == "cuda" else target.device
            if device.type != "cuda":
                target.copy_(source)
                continue
            streams = self._streams_on(device)
            for index, (a, b) in enumerate(_slices(source, target)):
                with torch.cuda.stream(streams[index % len(streams)]):
                    b.copy_(a, non_blocking=True)
        # Waits for every stream of each device a tensor left or returns to,
        # before the device memory is given back or the job runs on.
        self._synchronize()

    def _streams_on(self, device: Any) -> list[Any]:
        streams = self._streams.get(device)
        if streams is None:
            streams = [new_stream(device) for _ in range(self.stream_count)]
            self._streams[device] = streams
        # The job's own work on the device comes first (what it wrote is copied).
        current = torch.cuda.current_stream(device)
        for stream in streams:
            stream.wait_stream(current)
        return streams

    def _synchronize(self) -> None:
        for device in self.devices():
            torch.cuda.synchronize(device)

    # -- buffers ---------------------------------------------------------------

    def _host_buffer(self, tensor: Any) -> Any:
        data = tensor.data
        known = self._host_buffers.get(id(tensor))
        if known is not None and known[0]() is tensor:
            buffer = known[1]
            if buffer.shape == data.shape and buffer.dtype == data.dtype:
                return buffer
        return torch.empty(data.shape, dtype=data.dtype, device="cpu", pin_memory=self.pinned)

    def _allocate_on(self, device: Any, like: Any) -> Any:
        return torch.empty(like.shape, dtype=like.dtype, device=device)

    def _home(self, tensor: Any) -> Any:
        return tensor.device

    def _moved(self, direction: Literal["evict", "admit"], start: float) -> None:
        count = sum(t.data.numel() * t.data.element_size() for t, _ in self._homes)
        self.moves.append(OffloadMove(direction, count, time.perf_counter() - start))

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


def new_stream(device: Any) -> Any:
    stream: Any = torch.cuda.Stream(device)  # type: ignore[no-untyped-call]
    return stream


def _slices(source: Any, target: Any) -> Iterator[tuple[Any, Any]]:
    """Matching flat slices of at least SLICE_BYTES; the whole pair where
    either is not contiguous (a strided copy cannot be cut flat)."""
    if not (source.is_contiguous() and target.is_contiguous()) or source.numel() == 0:
        yield source, target
        return
    flat_source, flat_target = source.view(-1), target.view(-1)
    step = max(1, SLICE_BYTES // source.element_size())
    for begin in range(0, flat_source.numel(), step):
        yield flat_source[begin : begin + step], flat_target[begin : begin + step]
