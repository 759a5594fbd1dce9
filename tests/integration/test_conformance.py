"""One set of scenarios run against every backend: cuda, cuda-checkpoint,
freeze+cuda, app+cuda, freeze and sim. In CI the CUDA processes run on the GPU
emulator (timeshare/gpu_check/emulator) through the real cuda-bindings; with
TIMESHARE_GPU_TESTS=1 on a GPU host (`pytest -m gpu tests/integration/test_conformance.py`)
the scenarios that need no fault injection run against the real driver too
(the `-gpu` variants, marked `gpu`; the same checks `timeshare gpu-check`
runs, from timeshare.gpu_check.conformance). Those judge only through what a GPU host
has: the backend's own record (BackendConfig.record_path) and actions, the
driver's answer for a process's state, and NVML; never the emulator's call log.

Each job here has two CUDA ranks, and the first rank has children that never
touch CUDA (as a DataLoader's workers). This test process plays the node agent."""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import pytest
from _pytest.mark import ParameterSet

from tests.polling import wait_until, wait_until_async
from timeshare.activities.backends.base import (
    Backend,
    BackendError,
    JobFailed,
    StateUnknown,
)
from timeshare.activities.backends.processes import ProcessTable
from timeshare.activities.backends.sim import SimBackend
from timeshare.gpu_check import conformance, emulator
from timeshare.gpu_check.conformance import GROUP, stopped
from timeshare.gpu_check.emulator import CHECKPOINTED, CHECKPOINTING, FAILED, LOCKED, RUNNING
from timeshare.gpu_check.emulator.rig import (
    Emulator,
    loaded_in_this_process,
    process_state,
)

KINDS = ["cuda", "cuda-checkpoint", "freeze+cuda", "app+cuda", "freeze", "sim"]
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
class Rig(conformance.Rig):
    """The conformance rig, with what only the emulator has: its call log and faults."""

    emu: Emulator | None = None

    def needs_faults(self) -> Emulator:
        if self.emu is None:
            pytest.skip("fault injection needs the GPU emulator")
        return self.emu

    def device_memory(self) -> dict[int, int | None]:
        """Read in a child on the emulator: this test process must never load
        an NVML library other tests would find."""
        if self.emu is not None:
            return emulator.nvml_process_memory(self.emu.env)
        return super().device_memory()

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


def real_driver() -> ModuleType:
    from cuda.bindings import driver

    module: ModuleType = driver
    return module


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
    # A real driver moves a rank's CUDA context (hundreds of MiB) per call.
    config = conformance.backend_config(tmp_path, CALL_TIMEOUT if emu is not None else 60.0)
    table = ProcessTable()
    driver = emu.driver if emu is not None else real_driver()
    utility = str(emu.lib_dir / emulator.UTILITY) if emu is not None else "cuda-checkpoint"
    backend = conformance.make_backend(kind, config, driver, utility)
    backend.attach(table)
    made = Rig(kind, backend, table, tmp_path, driver, env, emu=emu)
    try:
        yield made
    finally:
        made.clear_faults()
        made.stop()


# -- lock, checkpoint, restore, unlock; each twice -------------------------------


@pytest.mark.parametrize("rig", EVERYWHERE, indirect=True)
async def test_round_trip_and_every_action_idempotent(rig: Rig) -> None:
    await conformance.round_trip_and_every_action_idempotent(rig)


# -- processes without CUDA -------------------------------------------------------


@pytest.mark.parametrize("rig", EVERYWHERE, indirect=True)
async def test_processes_without_cuda_are_never_acted_on_by_the_driver(rig: Rig) -> None:
    if rig.kind == "sim":
        pytest.skip("the sim backend has no processes")
    without_cuda = await conformance.processes_without_cuda_are_never_acted_on(rig)
    if rig.emu is not None:
        # On the emulator the driver's own log witnesses it too (GetState included).
        assert rig.driver_calls_on(without_cuda) == []


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
