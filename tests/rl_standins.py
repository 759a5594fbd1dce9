"""Stand-ins for the GPU actors of OpenRLHF and SkyRL, which do not install
here (OpenRLHF 0.11.2 requires flash-attn built against CUDA and imports
vllm at the top of openrlhf/trainer/ray/vllm_engine.py; SkyRL 0.4.0 requires
Python >= 3.12 and its trainer extra pins transformers <= 5.8 and Ray 2.56).
Each has the shape the framework's own code calls (the names are checked
against tests/upstream/*.json) and records who held the group's turn, and
for which phase, when it was called. Module-level, so that they pickle into
another process."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import timeshare

Call = tuple[str, str, str, str]  # (job, call, holder then, holder's phase)


@dataclass
class Recorder:
    address: str
    group: str
    job: str
    calls: list[Call] = field(default_factory=list)

    def __call__(self, call: str) -> str:
        if self.address:
            with timeshare.connect(self.address) as client:
                status = client.get_group(self.group)
            self.calls.append((self.job, call, status.holder, status.holder_phase))
        else:
            self.calls.append((self.job, call, "", ""))
        return call


class RemoteMethod:
    """A Ray actor method: ``.remote()`` runs it; its "ref" is what it returned."""

    def __init__(self, record: Recorder, call: str) -> None:
        self.record, self.call = record, call

    def remote(self, *args: Any, **kwargs: Any) -> str:
        return self.record(self.call)


class Engine:
    """A vLLM engine actor handle of OpenRLHF (openrlhf/trainer/ray/vllm_engine.py)."""

    def __init__(self, record: Recorder, index: int) -> None:
        self.record, self.index = record, index

    def __getattr__(self, name: str) -> RemoteMethod:
        if name.startswith("__") or name in ("record", "index"):
            raise AttributeError(name)
        return RemoteMethod(self.record, f"engine{self.index}.{name}")


class ModelGroup:
    """RayActorGroup.async_run_method (openrlhf/trainer/ray/launcher.py)."""

    def __init__(self, record: Recorder, name: str) -> None:
        self.record, self.name = record, name

    def async_run_method(self, method_name: str, *args: Any, **kwargs: Any) -> list[str]:
        return [self.record(f"{self.name}.{method_name}")]


@dataclass
class RemoteInferenceClient:
    """SkyRL's client (a dataclass with async sleep/wake_up, pickled to the
    policy workers without its sessions, as SkyRL's own __getstate__ does)."""

    record: Recorder
    session: Any = None

    async def sleep(self, level: int = 2, tags: list[str] | None = None) -> str:
        return self.record("sleep")

    async def wake_up(self, tags: list[str] | None = None) -> str:
        return self.record(f"wake_up({','.join(tags or ['all'])})")

    async def call(self, name: str) -> str:
        return self.record(name)

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "session": None}
