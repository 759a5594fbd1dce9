"""One set of scenarios run against every backend: cuda, cuda-checkpoint,
freeze+cuda, app+cuda, freeze and sim. In CI the CUDA processes run on the GPU
emulator (tests/emulator) through the real cuda-bindings; with
TIMESHARE_GPU_TESTS=1 on a GPU host (`pytest -m gpu tests/integration/test_conformance.py`)
the scenarios that need no fault injection run against the real driver too
(the `-gpu` variants, marked `gpu`). Those judge only through what a GPU host
has: the backend's own record (BackendConfig.record_path) and actions, the
driver's answer for a process's state, and NVML; never the emulator's call log.

Each job here has two CUDA ranks, and the first rank has children that never
touch CUDA (as a DataLoader's workers). This test process plays the node agent."""

from __future__ import annotations

import asyncio
import json
import shutil
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from _pytest.mark import ParameterSet

from tests import emulator
from tests.emulator import CHECKPOINTED, CHECKPOINTING, FAILED, LOCKED, RUNNING
from tests.emulator.rig import (
    CudaWorker,
    Emulator,
    loaded_in_this_process,
    process_state,
    start_worker,
)
from tests.polling import wait_until, wait_until_async
from tests.processes import detached, kill
from timeshare.activities.backends.app import AppBackend
from timeshare.activities.backends.base import (
    Backend,
    BackendConfig,
    BackendError,
    JobFailed,
    StateUnknown,
)
from timeshare.activities.backends.cuda_checkpoint import CudaCheckpointBackend
from timeshare.activities.backends.cuda_driver import CudaDriverBackend
from timeshare.activities.backends.freeze import FreezeBackend
from timeshare.activities.backends.gpus import device_memory_by_pid
from timeshare.activities.backends.processes import ProcessTable
from timeshare.activities.backends.sim import SimBackend
from timeshare.activities.backends.stacked import StackedBackend

KINDS = ["cuda", "cuda-checkpoint", "freeze+cuda", "app+cuda", "freeze", "sim"]
CUDA = {"cuda", "cuda-checkpoint", "freeze+cuda", "app+cuda"}
FREEZES = {"freeze+cuda", "freeze"}
GROUP = "g"
# The calls that act on a process (a probe for its restore thread does not).
ACTING = {
    "cuCheckpointProcessGetState",
    "cuCheckpointProcessLock",
    "cuCheckpointProcessCheckpoint",
    "cuCheckpointProcessRestore",
    "cuCheckpointProcessUnlock",
}
CALL_TIMEOUT = 2.0


@dataclass
class Job:
    name: str
    ranks: list[CudaWorker] = field(default_factory=list)

    @property
    def rank_pids(self) -> list[int]:
        return [rank.pid for rank in self.ranks]

    @property
    def children(self) -> list[int]:
        return sorted(child for rank in self.ranks for child in rank.children)


@dataclass
class Rig:
    kind: str
    backend: Backend
    table: ProcessTable
    directory: Path
    emu: Emulator | None
    env: dict[str, str]
    workers: list[CudaWorker] = field(default_factory=list)

    @property
    def cuda(self) -> bool:
        return self.kind in CUDA

    @property
    def freezes(self) -> bool:
        return self.kind in FREEZES

    def needs_faults(self) -> Emulator:
        if self.emu is None:
            pytest.skip("fault injection needs the GPU emulator")
        return self.emu

    async def start_job(self, name: str, ranks: int = 2, children: int = 1) -> Job:
        if self.kind == "sim":
            await self.backend.restore(GROUP, name)  # the simulated job comes in
            return Job(name)
        job = Job(name)
        for index in range(ranks):
            worker = await asyncio.to_thread(
                start_worker, self.env, self.directory, f"{name}-{index}",
                children=children if index == 0 else 0,
            )  # fmt: skip
            self.workers.append(worker)
            job.ranks.append(worker)
            self.table.register(GROUP, name, worker.pid)
        # In pid order, as the backends list them.
        job.ranks.sort(key=lambda rank: rank.pid)
        return job

    def state(self, pid: int) -> int | None:
        assert self.emu is not None or self.kind != "sim"
        driver = self.emu.driver if self.emu is not None else real_driver()
        result, state = driver.cuCheckpointProcessGetState(pid)
        return None if int(result) else int(state)

    def states(self, job: Job) -> list[int | None]:
        return [self.state(pid) for pid in job.rank_pids]

    def acted_on(self, pids: list[int]) -> list[str]:
        """What the backend's own record says it did to these processes (a
        CUDA backend records each rank it moved)."""
        return [
            f"{event['event']} {event['pid']}"
            for event in self.record()
            if event.get("pid") in pids
        ]

    def record(self) -> list[dict[str, Any]]:
        path = self.directory / "record.jsonl"
        if not path.exists():
            return []
        return [json.loads(line) for line in path.read_text().splitlines() if line]

    def device_memory(self) -> dict[int, int | None]:
        """NVML's device bytes per process: read in a child on the emulator
        (this test process must never load an NVML library other tests would
        find), here against a real driver."""
        if self.emu is not None:
            return emulator.nvml_process_memory(self.emu.env)
        return device_memory_by_pid()

    def driver_calls_on(self, pids: list[int]) -> list[str]:
        """Driver calls that acted on these processes, by the emulator's log
        (an emulator-only witness: a real driver keeps no log)."""
        assert self.emu is not None, "the call log is the emulator's"
        return [
            f"{e['call']} {e['pid']}"
            for e in emulator.read_log(self.emu.log)
            if e["call"] in ACTING and e["pid"] in pids
        ]

    def fault(self, pid: int, call: emulator.FaultCall, effect: emulator.FaultEffect,
              argument: int | None = None) -> str:  # fmt: skip
        return emulator.add_fault(self.needs_faults().state_dir, pid, call, effect, argument)

    def clear_faults(self) -> None:
        if self.emu is not None:
            emulator.clear_faults(self.emu.state_dir)


def stopped(pid: int) -> bool:
    return process_state(pid) in ("T", "t")


def real_driver() -> ModuleType:
    from cuda.bindings import driver

    module: ModuleType = driver
    return module


def make_backend(kind: str, config: BackendConfig, emu: Emulator | None) -> Backend:
    driver = emu.driver if emu is not None else real_driver()

    def cuda() -> Backend:
        return CudaDriverBackend(config, driver)

    made: dict[str, Backend] = {}
    if kind == "cuda":
        made[kind] = cuda()
    elif kind == "cuda-checkpoint":
        utility = str(emu.lib_dir / emulator.UTILITY) if emu is not None else "cuda-checkpoint"
        made[kind] = CudaCheckpointBackend(config, utility)
    elif kind == "freeze+cuda":
        made[kind] = StackedBackend([FreezeBackend(config), cuda()])
    elif kind == "app+cuda":
        made[kind] = StackedBackend([AppBackend(config), cuda()])
    elif kind == "freeze":
        made[kind] = FreezeBackend(config)
    else:
        made[kind] = SimBackend(config)
    return made[kind]


def drivers(gpu_kinds: Sequence[str]) -> list[ParameterSet]:
    """Every backend on the emulator, and the ``gpu_kinds`` against the real
    driver too, marked ``gpu``. (A mark reaches a test only from the parameter
    set that is the parameter itself: one nested inside a tuple is lost, which
    once left `pytest -m gpu` selecting nothing.)"""
    params = [pytest.param((kind, "emulator"), id=f"{kind}-emulator") for kind in KINDS]
    params += [
        pytest.param((kind, "gpu"), id=f"{kind}-gpu", marks=pytest.mark.gpu)
        for kind in gpu_kinds
        if kind != "sim"  # the sim backend has no driver
    ]
    return params


# Scenarios that need no fault injection run against the real driver too.
EVERYWHERE = drivers(KINDS)
ON_THE_EMULATOR = drivers([])


@pytest.fixture
def rig(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Rig]:
    kind, driver = request.param
    if driver == "gpu":
        if loaded_in_this_process():
            pytest.skip("the emulator's driver is loaded in this process: run `pytest -m gpu`")
        if kind == "cuda-checkpoint" and shutil.which("cuda-checkpoint") is None:
            pytest.skip("the cuda-checkpoint utility is not on PATH")
        emu, env = None, {}
        (result,) = real_driver().cuInit(0)
        assert int(result) == 0
    else:
        emu = request.getfixturevalue("gpu_emulator")
        env = emu.env
    config = BackendConfig(
        node="n", lock_timeout_seconds=1.0,
        # A real driver moves a rank's CUDA context (hundreds of MiB) per call.
        call_timeout_seconds=CALL_TIMEOUT if emu is not None else 60.0,
        sim_state_bytes=2**20, sim_bandwidth_bytes_per_second=1e10,
        record_path=str(tmp_path / "record.jsonl"),
    )  # fmt: skip
    table = ProcessTable()
    backend = make_backend(kind, config, emu)
    backend.attach(table)
    made = Rig(kind, backend, table, tmp_path, emu, env)
    try:
        yield made
    finally:
        made.clear_faults()
        for worker in made.workers:
            worker.kill()


# -- lock, checkpoint, restore, unlock; each twice -------------------------------


@pytest.mark.parametrize("rig", EVERYWHERE, indirect=True)
async def test_round_trip_and_every_action_idempotent(rig: Rig) -> None:
    job = await rig.start_job("a")
    backend = rig.backend
    assert await backend.resident_jobs(GROUP) == ["a"]

    done = await backend.checkpoint(GROUP, "a")
    assert done.action == "checkpoint"
    assert (await backend.checkpoint(GROUP, "a")).action == "noop"
    assert await backend.resident_jobs(GROUP) == []
    if rig.cuda:
        assert rig.states(job) == [CHECKPOINTED, CHECKPOINTED]
        cuda_ranks = sorted(r.pid for r in done.ranks if r.action == "checkpoint")
        assert cuda_ranks == job.rank_pids  # every rank reported, and nothing else
        memory = rig.device_memory()
        assert not set(job.rank_pids) & {pid for pid, count in memory.items() if count}
        # The backend's record: each rank's checkpoint, with the bytes NVML showed.
        recorded = sorted(e["pid"] for e in rig.record() if e["event"] == "checkpoint")
        assert recorded == job.rank_pids
    if rig.freezes:
        assert all(stopped(pid) for pid in job.rank_pids + job.children)

    restored = await backend.restore(GROUP, "a")
    assert restored.action == "restore"
    assert (await backend.restore(GROUP, "a")).action == "noop"
    assert await backend.resident_jobs(GROUP) == ["a"]
    if rig.cuda:
        assert rig.states(job) == [RUNNING, RUNNING]
    for rank in job.ranks:
        await asyncio.to_thread(rank.advancing)

    assert (await backend.lock(GROUP, "a")).action == "lock"
    assert (await backend.lock(GROUP, "a")).action == "noop"
    if rig.cuda:
        assert rig.states(job) == [LOCKED, LOCKED]
        assert await backend.resident_jobs(GROUP) == ["a"]  # locked: still on the device
    unlocked = await backend.restore(GROUP, "a")
    assert (unlocked.action, unlocked.bytes) == ("unlock", 0)
    if rig.cuda:
        assert rig.states(job) == [RUNNING, RUNNING]
    for rank in job.ranks:
        await asyncio.to_thread(rank.advancing)


# -- processes without CUDA -------------------------------------------------------


@pytest.mark.parametrize("rig", EVERYWHERE, indirect=True)
async def test_processes_without_cuda_are_never_acted_on_by_the_driver(rig: Rig) -> None:
    if rig.kind == "sim":
        pytest.skip("the sim backend has no processes")
    job = await rig.start_job("a", children=2)
    backend = rig.backend
    for action in (backend.checkpoint, backend.restore, backend.lock, backend.restore):
        done = await action(GROUP, "a")
        assert done.action != "noop"
        if rig.cuda and not rig.freezes:
            assert done.pids == job.rank_pids
        if action == backend.checkpoint and not rig.freezes:
            # Left alone: the data loaders run on while the ranks are checkpointed.
            await _runs_on(job.ranks[0])
        if action == backend.checkpoint and rig.freezes:
            assert all(stopped(pid) for pid in job.children)
    assert rig.acted_on(job.children) == []
    if rig.cuda:
        assert rig.acted_on(job.rank_pids)  # the ranks themselves were acted on
    if rig.emu is not None:
        # On the emulator the driver's own log witnesses it too (GetState included).
        assert rig.driver_calls_on(job.children) == []
    assert not any(stopped(pid) for pid in job.children)

    # A job with no CUDA process at all: nothing for the driver to move.
    sleeper = detached("sleep", "60")
    try:
        rig.table.register(GROUP, "plain", sleeper)
        done = await backend.checkpoint(GROUP, "plain")
        assert done.action == ("checkpoint" if rig.freezes else "noop")
        assert stopped(sleeper) == rig.freezes
        await backend.restore(GROUP, "plain")
        assert rig.acted_on([sleeper]) == []
        if rig.emu is not None:
            assert rig.driver_calls_on([sleeper]) == []
    finally:
        kill(sleeper)


async def _runs_on(rank: CudaWorker) -> None:
    before = rank.child_count(0)
    await asyncio.to_thread(
        wait_until, lambda: rank.child_count(0) > before, "a non-CUDA child to run on"
    )


# -- a rank failing midway --------------------------------------------------------


@pytest.mark.parametrize("rig", ON_THE_EMULATOR, indirect=True)
async def test_a_rank_failing_midway_fails_the_action_and_a_retry_finishes_it(rig: Rig) -> None:
    if rig.kind == "freeze":
        pytest.skip("SIGSTOP of a process the agent may signal does not fail")
    job = await rig.start_job("a")
    backend = rig.backend
    if rig.kind == "sim":
        assert isinstance(backend, SimBackend)
        backend.inject_failure("checkpoint", "a", 1)
        with pytest.raises(BackendError, match="simulated checkpoint failure"):
            await backend.checkpoint(GROUP, "a")
        assert (await backend.checkpoint(GROUP, "a")).action == "checkpoint"
        return
    second = job.rank_pids[1]
    # A lock that fails on one rank: the other is unlocked again, the job left running.
    rule = rig.fault(second, "lock", "error", 999)
    with pytest.raises(BackendError, match="left running") as failed:
        await backend.checkpoint(GROUP, "a")
    assert not isinstance(failed.value, JobFailed)
    assert rig.states(job) == [RUNNING, RUNNING]
    emulator.remove_fault(rig.needs_faults().state_dir, rule)
    # A checkpoint that fails on one rank: the failure names it, nothing is undone...
    rig.fault(second, "checkpoint", "error", 2)
    with pytest.raises(BackendError, match=f"checkpoint of process {second}"):
        await backend.checkpoint(GROUP, "a")
    assert rig.states(job) == [CHECKPOINTED, LOCKED]
    # ... and the retry moves only what is left.
    rig.clear_faults()
    retried = await backend.checkpoint(GROUP, "a")
    assert sorted(r.pid for r in retried.ranks if r.action == "checkpoint") == [second]
    assert rig.states(job) == [CHECKPOINTED, CHECKPOINTED]
    assert (await backend.restore(GROUP, "a")).action == "restore"
    assert rig.states(job) == [RUNNING, RUNNING]


# -- a hung call ------------------------------------------------------------------


@pytest.mark.parametrize("rig", ON_THE_EMULATOR, indirect=True)
async def test_a_hung_call_leaves_the_state_unknown_until_it_ends(rig: Rig) -> None:
    if not rig.cuda:
        pytest.skip(f"the {rig.kind} backend makes no call that can hang")
    job = await rig.start_job("a")
    backend = rig.backend
    first, second = job.rank_pids
    # A lock that hangs is bounded by the driver's own timeoutMs: left running.
    lock_rule = rig.fault(first, "lock", "hang")
    with pytest.raises(BackendError, match="left running") as failed:
        await backend.checkpoint(GROUP, "a")
    assert not isinstance(failed.value, StateUnknown)
    emulator.remove_fault(rig.needs_faults().state_dir, lock_rule)
    wait_until(lambda: rig.states(job) == [RUNNING, RUNNING], "the hung lock to leave it running")

    # A checkpoint that hangs past the call timeout: unknown, never "done" or "failed".
    rule = rig.fault(second, "checkpoint", "hang")
    with pytest.raises(StateUnknown, match="unknown"):
        await backend.checkpoint(GROUP, "a")
    assert rig.state(second) == CHECKPOINTING  # the call is still under way
    # Asked again while it runs, the agent still cannot say.
    with pytest.raises(StateUnknown):
        await backend.checkpoint(GROUP, "a")
    emulator.remove_fault(rig.needs_faults().state_dir, rule)
    # Once the call has ended the next action reads the state first: nothing left to do.
    await wait_until_async(
        lambda: _checkpoint_is_noop(backend), "the hung checkpoint to end", seconds=30
    )
    assert rig.states(job) == [CHECKPOINTED, CHECKPOINTED]
    assert (await backend.restore(GROUP, "a")).action == "restore"


async def _checkpoint_is_noop(backend: Backend) -> bool:
    try:
        return (await backend.checkpoint(GROUP, "a")).action == "noop"
    except StateUnknown:
        return False


# -- a process that exits mid-switch ------------------------------------------------


# Killing a rank mid-call takes the emulator's delay fault; a freeze needs none.
@pytest.mark.parametrize("rig", drivers(["freeze"]), indirect=True)
async def test_a_rank_that_exits_mid_switch_is_left_out(rig: Rig) -> None:
    if rig.kind == "sim":
        pytest.skip("the sim backend has no processes")
    job = await rig.start_job("a")
    backend = rig.backend
    first, second = job.ranks
    if rig.cuda:
        emu = rig.needs_faults()
        rig.fault(second.pid, "checkpoint", "delay", 3000)
        checkpoint = asyncio.create_task(backend.checkpoint(GROUP, "a"))
        await wait_until_async(
            lambda: _began(emu, "restoreThread.checkpoint", second.pid),
            "the second rank's checkpoint to begin",
        )
        second.kill()
        done = await checkpoint
        assert [r.pid for r in done.ranks if r.action == "checkpoint"] == [first.pid]
        assert rig.state(first.pid) == CHECKPOINTED
    else:
        second.kill()
        wait_until(lambda: process_state(second.pid) in ("", "Z"), "the rank to exit")
        done = await backend.checkpoint(GROUP, "a")
        assert done.action == "checkpoint" and stopped(first.pid)
    assert second.pid not in rig.table.processes(GROUP, "a")
    restored = await backend.restore(GROUP, "a")
    assert restored.action == "restore" and second.pid not in restored.pids
    await asyncio.to_thread(first.advancing)


async def _began(emu: Emulator, call: str, pid: int) -> bool:
    return any(e["phase"] == "begin" for e in emulator.calls(emu.log, call, pid))


# -- FAILED -------------------------------------------------------------------------


@pytest.mark.parametrize("rig", ON_THE_EMULATOR, indirect=True)
async def test_failed_is_terminal_never_unlocked_as_fine(rig: Rig) -> None:
    if rig.kind == "freeze":
        pytest.skip("the freeze backend has no terminal state")
    job = await rig.start_job("a")
    backend = rig.backend
    if rig.kind == "sim":
        assert isinstance(backend, SimBackend)
        backend.inject_failure("checkpoint", "a", 1, terminal=True)
        for action in (backend.checkpoint, backend.restore, backend.lock):
            with pytest.raises(JobFailed):
                await action(GROUP, "a")
        assert await backend.resident_jobs(GROUP) == []
        assert (await backend.release(GROUP, "a")).done
        return
    first, second = job.rank_pids
    rig.fault(second, "checkpoint", "fail")
    with pytest.raises(JobFailed, match="FAILED") as failed:
        await backend.checkpoint(GROUP, "a")
    assert failed.value.job == "a"
    rig.clear_faults()
    # (The FAILED worker exits at its next CUDA call, which fails: None.)
    assert rig.state(first) == CHECKPOINTED and rig.state(second) in (FAILED, None)
    after_failure = len(rig.driver_calls_on(job.rank_pids))
    # Neither restored nor unlocked as if it were fine, and not counted resident.
    for action in (backend.restore, backend.checkpoint, backend.lock):
        with pytest.raises(JobFailed):
            await action(GROUP, "a")
    assert await backend.resident_jobs(GROUP) == []
    moves = [c for c in rig.driver_calls_on(job.rank_pids)[after_failure:] if "GetState" not in c]
    assert moves == []
    # Released (it left): what can run again runs; the FAILED process is reported.
    released = await backend.release(GROUP, "a")
    assert released.failed in ([second], [])  # [] once it has exited
    assert first in released.running and second not in released.running
    await asyncio.to_thread(job.ranks[0].advancing)  # ranks[0] is the first
