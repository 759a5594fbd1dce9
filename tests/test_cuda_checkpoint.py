"""The cuda-checkpoint backend against a fake utility (tests/fakes) that
keeps the driver's per-process state machine: order, idempotency, a lock
that times out, and a call that hangs."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

from activities.backend import BackendConfig, BackendError
from activities.cuda_checkpoint import CudaCheckpointBackend
from activities.processes import ProcessTable
from tests.processes import detached, kill

FAKE = Path(__file__).parent / "fakes" / "cuda-checkpoint"


@pytest.fixture
def fake_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("FAKE_CUDA_DIR", str(tmp_path))
    return tmp_path


@pytest.fixture
def ranks() -> Iterator[list[int]]:
    pids = [detached(sys.executable, "-c", "import time; time.sleep(60)") for _ in range(2)]
    yield pids
    for pid in pids:
        kill(pid)


def backend_for(ranks: list[int], call_timeout_seconds: float = 30.0) -> CudaCheckpointBackend:
    config = BackendConfig(
        node="n", cuda_checkpoint_path=str(FAKE), call_timeout_seconds=call_timeout_seconds
    )
    backend = CudaCheckpointBackend(config, str(FAKE))  # create() wants a real driver
    table = ProcessTable()
    for pid in ranks:
        table.register("g", "a", pid)
    backend.attach(table)
    return backend


def calls(fake_dir: Path) -> list[str]:
    lines = (fake_dir / "calls.log").read_text().splitlines()
    (fake_dir / "calls.log").unlink()
    return [line for line in lines if not line.startswith("get-state")]


async def test_every_rank_locks_before_any_checkpoints_and_restores_before_any_unlocks(
    fake_dir: Path, ranks: list[int]
) -> None:
    backend = backend_for(ranks)
    assert await backend.resident_jobs("g") == ["a"]
    assert (await backend.checkpoint("g", "a")).action == "checkpoint"
    first, second = ranks
    assert calls(fake_dir) == [f"lock {first}", f"lock {second}",
                               f"checkpoint {first}", f"checkpoint {second}"]  # fmt: skip
    assert await backend.resident_jobs("g") == []
    assert (await backend.checkpoint("g", "a")).action == "noop"  # idempotent
    assert (await backend.restore("g", "a")).action == "restore"
    assert calls(fake_dir) == [f"restore {first}", f"restore {second}",
                               f"unlock {first}", f"unlock {second}"]  # fmt: skip
    assert (await backend.restore("g", "a")).action == "noop"
    assert calls(fake_dir) == []


async def test_a_lock_that_times_out_leaves_the_job_running(
    fake_dir: Path, ranks: list[int]
) -> None:
    backend = backend_for(ranks)
    (fake_dir / "lock-timeout").write_text(str(ranks[1]))
    with pytest.raises(BackendError, match="left running"):
        await backend.checkpoint("g", "a")
    assert calls(fake_dir) == [f"lock {ranks[0]}", f"lock {ranks[1]}", f"unlock {ranks[0]}"]
    assert await backend.resident_jobs("g") == ["a"]


async def test_a_hung_call_fails_instead_of_blocking(fake_dir: Path, ranks: list[int]) -> None:
    backend = backend_for(ranks, call_timeout_seconds=1.0)
    (fake_dir / "hang").write_text("")
    with pytest.raises(BackendError, match="did not finish"):
        await backend.checkpoint("g", "a")


def test_without_a_driver_or_the_utility_the_backend_refuses_to_start(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    config = BackendConfig(node="n", cuda_checkpoint_path="/nonexistent/cuda-checkpoint")
    monkeypatch.setattr("activities.cuda_checkpoint.gpu_inventory", lambda: [])
    with pytest.raises(BackendError, match="not found"):
        CudaCheckpointBackend.create(config)
    monkeypatch.undo()
    monkeypatch.setitem(sys.modules, "pynvml", ModuleType("pynvml"))  # no NVML at all
    with pytest.raises(BackendError, match="cannot run here"):
        CudaCheckpointBackend.create(config)
