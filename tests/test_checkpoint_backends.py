"""The CUDA checkpoint backends against fakes that keep the driver's
per-process state machine: the `cuda-checkpoint` utility (tests/fakes, an
executable) and the driver API (tests/fakes/cuda_driver.py, injected).
Order, idempotency, a lock that times out, and a call that hangs."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

from tests.fakes.cuda_driver import FakeDriver
from tests.processes import detached, kill
from timeshare.activities.backend import BackendConfig, BackendError
from timeshare.activities.checkpointing import ProcessCheckpointBackend
from timeshare.activities.cuda_checkpoint import CudaCheckpointBackend
from timeshare.activities.cuda_driver import CudaDriverBackend
from timeshare.activities.gpus import DeviceMemory
from timeshare.activities.processes import ProcessTable

FAKE_UTILITY = Path(__file__).parent / "fakes" / "cuda-checkpoint"


class Rig:
    """One backend over a fake, with the fake's record of calls."""

    def __init__(self, kind: str, fake_dir: Path, ranks: list[int]) -> None:
        self.kind, self.fake_dir = kind, fake_dir
        config = BackendConfig(
            node="n", cuda_checkpoint_path=str(FAKE_UTILITY), call_timeout_seconds=1.0
        )
        self.driver = FakeDriver()
        self.backend: ProcessCheckpointBackend = (
            CudaCheckpointBackend(config, str(FAKE_UTILITY))
            if kind == "cuda-checkpoint"
            else CudaDriverBackend(config, self.driver.module)
        )
        table = ProcessTable()
        for pid in ranks:
            table.register("g", "a", pid)
        self.backend.attach(table)

    def calls(self) -> list[str]:
        if self.kind == "cuda":
            made, self.driver.calls = self.driver.calls, []
            return made
        log = self.fake_dir / "calls.log"
        lines = log.read_text().splitlines() if log.exists() else []
        log.unlink(missing_ok=True)
        return [line for line in lines if not line.startswith("get-state")]

    def lock_times_out(self, pid: int) -> None:
        self.driver.lock_timeout_pids.add(pid)
        (self.fake_dir / "lock-timeout").write_text(str(pid))

    def hang(self) -> None:
        self.driver.hanging.set()
        (self.fake_dir / "hang").write_text("")


@pytest.fixture
def ranks() -> Iterator[list[int]]:
    pids = [detached(sys.executable, "-c", "import time; time.sleep(60)") for _ in range(2)]
    yield pids
    for pid in pids:
        kill(pid)


@pytest.fixture(params=["cuda-checkpoint", "cuda"])
def rig(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    ranks: list[int],
) -> Iterator[Rig]:  # fmt: skip
    monkeypatch.setenv("FAKE_CUDA_DIR", str(tmp_path))
    made = Rig(request.param, tmp_path, ranks)
    yield made
    made.driver.release.set()  # let a hung fake call end


async def test_every_rank_locks_before_any_checkpoints_and_restores_before_any_unlocks(
    rig: Rig, ranks: list[int]
) -> None:
    backend, (first, second) = rig.backend, ranks
    assert await backend.resident_jobs("g") == ["a"]
    assert (await backend.checkpoint("g", "a")).action == "checkpoint"
    assert rig.calls() == [f"lock {first}", f"lock {second}",
                           f"checkpoint {first}", f"checkpoint {second}"]  # fmt: skip
    assert await backend.resident_jobs("g") == []
    assert (await backend.checkpoint("g", "a")).action == "noop"  # idempotent
    assert (await backend.restore("g", "a")).action == "restore"
    assert rig.calls() == [f"restore {first}", f"restore {second}",
                           f"unlock {first}", f"unlock {second}"]  # fmt: skip
    assert (await backend.restore("g", "a")).action == "noop"
    assert rig.calls() == []


async def test_a_lock_that_times_out_leaves_the_job_running(rig: Rig, ranks: list[int]) -> None:
    rig.lock_times_out(ranks[1])
    with pytest.raises(BackendError, match="left running"):
        await rig.backend.checkpoint("g", "a")
    assert rig.calls() == [f"lock {ranks[0]}", f"lock {ranks[1]}", f"unlock {ranks[0]}"]
    assert await rig.backend.resident_jobs("g") == ["a"]


async def test_a_hung_call_fails_instead_of_blocking(rig: Rig) -> None:
    rig.hang()
    with pytest.raises(BackendError, match="did not finish"):
        await rig.backend.checkpoint("g", "a")


def test_each_backend_refuses_to_start_where_it_cannot_run(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    config = BackendConfig(node="n", cuda_checkpoint_path="/nonexistent/cuda-checkpoint")
    monkeypatch.setitem(sys.modules, "pynvml", ModuleType("pynvml"))  # no driver at all
    for backend in (CudaCheckpointBackend, CudaDriverBackend):
        with pytest.raises(BackendError, match="cannot run here"):
            backend.create(config)
    monkeypatch.setattr("timeshare.activities.cuda_checkpoint.gpu_inventory", lambda: [])
    with pytest.raises(BackendError, match="not found"):
        CudaCheckpointBackend.create(config)
    monkeypatch.setattr("timeshare.activities.cuda_driver.gpu_inventory", lambda: [])
    for module in ("cuda", "cuda.bindings", "cuda.bindings.driver"):  # no cuda-bindings
        monkeypatch.setitem(sys.modules, module, None)
    with pytest.raises(BackendError, match="cuda-bindings"):
        CudaDriverBackend.create(config)


async def test_no_checkpoint_when_the_host_has_no_room(
    rig: Rig, ranks: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    on_gpu = DeviceMemory(free_bytes=0, by_pid={ranks[0]: 80 * 2**30})
    monkeypatch.setattr(
        "timeshare.activities.checkpointing.device_memory", lambda: {"gpu0": on_gpu}
    )
    monkeypatch.setattr(
        "timeshare.activities.checkpointing.host_memory_available", lambda: 16 * 2**30
    )
    with pytest.raises(BackendError, match=r"80\.0 GiB of device memory"):
        await rig.backend.checkpoint("g", "a")
    assert rig.calls() == []  # nothing was locked
    monkeypatch.setattr(
        "timeshare.activities.checkpointing.host_memory_available", lambda: 100 * 2**30
    )
    assert (await rig.backend.checkpoint("g", "a")).bytes == 80 * 2**30


async def test_a_co_resident_job_is_only_locked_and_unlocked(rig: Rig, ranks: list[int]) -> None:
    backend, (first, second) = rig.backend, ranks
    assert (await backend.lock("g", "a")).action == "lock"
    assert rig.calls() == [f"lock {first}", f"lock {second}"]
    assert await backend.resident_jobs("g") == ["a"]  # still on the device
    assert (await backend.lock("g", "a")).action == "noop"
    unlocked = await backend.restore("g", "a")
    assert (unlocked.action, unlocked.bytes) == ("unlock", 0)
    assert rig.calls() == [f"unlock {first}", f"unlock {second}"]
    # A locked job that must make room after all is checkpointed, not locked again.
    await backend.lock("g", "a")
    rig.calls()
    assert (await backend.checkpoint("g", "a")).action == "checkpoint"
    assert rig.calls() == [f"checkpoint {first}", f"checkpoint {second}"]


async def test_footprints_come_from_nvml_and_are_remembered_while_parked(
    rig: Rig, ranks: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    backend, (first, second) = rig.backend, ranks
    gib = 2**30
    on_gpu = {"gpu0": DeviceMemory(free_bytes=10 * gib, by_pid={first: 3 * gib, second: gib})}
    monkeypatch.setattr("timeshare.activities.checkpointing.device_memory", lambda: on_gpu)
    assert await backend.footprint("g", "a") == {"gpu0": 4 * gib}
    assert await backend.admission_footprint("g", "a") == {"gpu0": 4 * gib}
    assert await backend.free_memory("g") == {"gpu0": 8 * gib}  # less the 2 GiB margin
    assert (await backend.checkpoint("g", "a")).bytes == 4 * gib
    on_gpu["gpu0"] = DeviceMemory(free_bytes=14 * gib, by_pid={})
    assert await backend.footprint("g", "a") == {}
    assert await backend.admission_footprint("g", "a") == {"gpu0": 4 * gib}
    restored = await backend.restore("g", "a")
    assert (restored.action, restored.bytes) == ("restore", 4 * gib)
