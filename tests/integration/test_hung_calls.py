"""Driver calls that hang (on the GPU emulator, a caller-side `hang` fault on
cuCheckpointProcessGetState: the call never returns while the rule is there)
pin no more threads of the cuda backend's pool than one per process and kind
of read; once half of the pool hangs, no new call starts (it fails at once,
saying why) until they end."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.cuda_backends import CONFIG, start_job
from tests.polling import async_check, wait_until_async
from timeshare.activities.backends.base import StateUnknown
from timeshare.activities.backends.cuda_driver import CudaDriverBackend
from timeshare.activities.backends.cuda_states import CudaState
from timeshare.activities.backends.processes import ProcessTable
from timeshare.gpu_check import emulator
from timeshare.gpu_check.emulator.rig import CudaWorker, Emulator

THREADS = 4  # from 2 hung calls on, none starts


@pytest.fixture
def workers(gpu_emulator: Emulator) -> Iterator[list[CudaWorker]]:
    started: list[CudaWorker] = []
    yield started
    emulator.clear_faults(gpu_emulator.state_dir)  # the hung calls end: their threads free
    for worker in started:
        worker.kill()


def hung_reads(emu: Emulator, pid: int) -> int:
    """GetState calls on ``pid`` begun and not ended."""
    phases = [e["phase"] for e in emulator.calls(emu.log, "cuCheckpointProcessGetState", pid)]
    return phases.count("begin") - phases.count("end")


async def test_reads_that_hang_hold_one_thread_each_and_never_the_whole_pool(
    gpu_emulator: Emulator, tmp_path: Path, workers: list[CudaWorker]
) -> None:
    emu, table = gpu_emulator, ProcessTable()
    config = CONFIG.model_copy(update={"call_timeout_seconds": 0.3})
    backend = CudaDriverBackend(config, emu.driver, threads=THREADS)
    backend.attach(table)
    (stuck,) = start_job(emu, tmp_path, workers, table, "a", ranks=1).pids
    healthy = start_job(emu, tmp_path, workers, table, "b", ranks=1).pids
    emulator.add_fault(emu.state_dir, stuck, "get_state", "hang")

    # Every switch attempt reads the state again: it waits for the read
    # still running rather than starting one more thread.
    for _ in range(THREADS + 1):
        with pytest.raises(StateUnknown, match=f"state of process {stuck}"):
            await backend.states("g", "a")
    assert hung_reads(emu, stuck) == 1
    assert await backend.states("g", "b") == {healthy[0]: CudaState.RUNNING}

    # Reads that hang on other processes too: past half the pool no call
    # starts, and says why, rather than queue behind them for ever.
    others = start_job(emu, tmp_path, workers, table, "c", ranks=2).pids
    for pid in others:
        emulator.add_fault(emu.state_dir, pid, "get_state", "hang")
    with pytest.raises(StateUnknown):
        await backend.states("g", "c")
    with pytest.raises(StateUnknown, match=r"calls have not returned .* no new call starts"):
        await backend.states("g", "b")
    assert [hung_reads(emu, pid) for pid in [stuck, *others]] == [1, 1, 1]

    emulator.clear_faults(emu.state_dir)
    await wait_until_async(async_check(lambda: not backend.calls.stuck()), "the hung calls to end")
    assert await backend.states("g", "a") == {stuck: CudaState.RUNNING}
    assert await backend.states("g", "b") == {healthy[0]: CudaState.RUNNING}
