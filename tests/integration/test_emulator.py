"""The GPU emulator (timeshare/gpu_check/emulator) seen through the real cuda-bindings and the real
pynvml: the checkpoint state machine across processes, the restore thread a frozen
process cannot run, NVML's per-process memory, fault injection, the call log and the
cuda-checkpoint utility."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from timeshare.gpu_check import emulator
from timeshare.gpu_check.emulator import (
    CHECKPOINTED,
    CHECKPOINTING,
    CUDA_ERROR_ILLEGAL_STATE,
    CUDA_ERROR_INVALID_VALUE,
    CUDA_ERROR_NOT_INITIALIZED,
    CUDA_ERROR_NOT_READY,
    CUDA_ERROR_OPERATING_SYSTEM,
    CUDA_ERROR_OUT_OF_MEMORY,
    CUDA_SUCCESS,
    FAILED,
    LOCKED,
    RESTORING,
    RUNNING,
    wait_for,
)
from timeshare.gpu_check.emulator.rig import Emulator

REPO = Path(__file__).resolve().parents[2]
MiB = 1 << 20

pytestmark = [
    pytest.mark.skipif(
        emulator.gcc() is None, reason="gcc is not installed: the GPU emulator is built from C"
    ),
    pytest.mark.timeout(60),
]


@dataclass
class Worker:
    process: subprocess.Popen[str]
    counter: Path
    pid: int = field(init=False)

    def __post_init__(self) -> None:
        self.pid = self.process.pid

    def count(self) -> int:
        text = self.counter.read_text()
        if not text.isdigit():
            raise AssertionError(f"worker {self.pid} reports {text!r}")
        return int(text)

    def advancing(self, steps: int = 3, timeout: float = 10) -> int:
        """Waits until the counter has moved `steps` further; returns it."""
        start = self.count()
        return wait_for(
            lambda: (n := self.count()) >= start + steps and n,
            timeout,
            f"worker {self.pid} to make progress from {start}",
        )


@pytest.fixture(scope="module")
def emu(gpu_emulator: Emulator) -> Emulator:
    return gpu_emulator


@pytest.fixture
def start_worker(emu: Emulator, tmp_path: Path) -> Iterator[Callable[..., Worker]]:
    workers: list[Worker] = []

    def start(nbytes: int, device: int = 0) -> Worker:
        counter = tmp_path / f"counter-{len(workers)}"
        errors = (tmp_path / f"worker-{len(workers)}.err").open("w")
        process = subprocess.Popen(
            [sys.executable, "-m", emulator.CUDA_WORKER, str(nbytes), str(counter),
             "--device", str(device), "--interval", "0.02"],
            env={**os.environ, **emu.env}, cwd=REPO, stdout=subprocess.PIPE, stderr=errors,
            text=True,
        )  # fmt: skip
        worker = Worker(process, counter)
        workers.append(worker)
        assert process.stdout is not None
        line = process.stdout.readline()
        assert line == f"ready {process.pid}\n", (line, Path(errors.name).read_text())
        return worker

    yield start
    for worker in workers:
        if worker.process.poll() is None:
            os.kill(worker.pid, signal.SIGCONT)
            worker.process.kill()
        worker.process.wait()
    emulator.clear_faults(emu.state_dir)


def blocked_call(emu: Emulator, pid: int) -> str | None:
    """A CUDA call the process's main thread began and has not finished, if any."""
    open_call = None
    for entry in emulator.read_log(emu.log):
        if entry["caller"] == pid and entry["tid"] == pid and entry["call"].startswith("cuMem"):
            open_call = entry["call"] if entry["phase"] == "begin" else None
    return open_call


def freeze(pid: int) -> None:
    """SIGSTOP the process and wait until every thread of it has stopped."""
    os.kill(pid, signal.SIGSTOP)

    def stopped() -> bool:
        tasks = list(Path(f"/proc/{pid}/task").iterdir())
        return all(
            (task / "stat").read_text().rsplit(")", 1)[1].split()[0] == "T" for task in tasks
        )

    wait_for(stopped, 5, f"process {pid} to stop")


def in_state(emu: Emulator, pid: int, state: int) -> bool:
    if state in (CHECKPOINTING, RESTORING) and not hasattr(
        emu.driver.CUprocessState, "CU_PROCESS_STATE_CHECKPOINTING"
    ):
        # cuda-bindings 12.x has no in-progress states (it raises ValueError on 4 and 5):
        # read them through the utility instead
        names = {CHECKPOINTING: "checkpointing\n", RESTORING: "restoring\n"}
        return emu.utility("--get-state", "--pid", str(pid)).stdout == names[state]
    return emu.state(pid) == (CUDA_SUCCESS, state)


def in_thread(function: Callable[[], Any]) -> tuple[threading.Thread, list[Any]]:
    results: list[Any] = []
    thread = threading.Thread(target=lambda: results.append(function()), daemon=True)
    thread.start()
    return thread, results


def test_checkpoint_releases_device_memory_and_restore_brings_it_back(
    emu: Emulator, start_worker: Callable[..., Worker]
) -> None:
    worker = start_worker(48 * MiB)
    worker.advancing()
    assert emulator.nvml_process_memory(emu.env)[worker.pid] == 48 * MiB
    assert emu.state(worker.pid) == (CUDA_SUCCESS, RUNNING)
    result, tid = emu.restore_tid(worker.pid)
    assert result == CUDA_SUCCESS and tid is not None and tid != worker.pid
    assert Path(f"/proc/{worker.pid}/task/{tid}/comm").read_text().startswith("cuda")
    # any thread id names its process (NVIDIA/cuda-checkpoint#41)
    assert emu.state(tid) == (CUDA_SUCCESS, RUNNING)

    # out of order: the documented states are enforced
    assert emu.act("checkpoint", worker.pid) == CUDA_ERROR_ILLEGAL_STATE
    assert emu.act("unlock", worker.pid) == CUDA_ERROR_ILLEGAL_STATE
    assert emu.act("lock", worker.pid, timeout_ms=5000) == CUDA_SUCCESS
    assert emu.act("lock", worker.pid, timeout_ms=5000) == CUDA_ERROR_ILLEGAL_STATE
    assert emu.act("restore", worker.pid) == CUDA_ERROR_ILLEGAL_STATE
    assert emu.act("checkpoint", worker.pid) == CUDA_SUCCESS
    assert emu.state(worker.pid) == (CUDA_SUCCESS, CHECKPOINTED)
    assert worker.pid not in emulator.nvml_process_memory(emu.env)
    assert emu.act("unlock", worker.pid) == CUDA_ERROR_ILLEGAL_STATE

    assert emu.act("restore", worker.pid) == CUDA_SUCCESS
    assert emu.state(worker.pid) == (CUDA_SUCCESS, LOCKED)
    assert emulator.nvml_process_memory(emu.env)[worker.pid] == 48 * MiB
    assert emu.act("unlock", worker.pid) == CUDA_SUCCESS
    assert emu.state(worker.pid) == (CUDA_SUCCESS, RUNNING)
    worker.advancing()  # and its device memory still reads back what it wrote


def test_a_locked_process_makes_no_cuda_progress_until_unlocked(
    emu: Emulator, start_worker: Callable[..., Worker]
) -> None:
    worker = start_worker(MiB)
    worker.advancing()
    assert emu.act("lock", worker.pid, timeout_ms=5000) == CUDA_SUCCESS
    wait_for(lambda: blocked_call(emu, worker.pid), 10, "the worker's next CUDA call to block")
    stopped_at = worker.count()
    observe_until = time.monotonic() + 0.3
    while time.monotonic() < observe_until:
        assert worker.count() == stopped_at
        assert blocked_call(emu, worker.pid)
        time.sleep(0.02)
    assert emu.act("unlock", worker.pid) == CUDA_SUCCESS
    assert worker.advancing() > stopped_at


def test_a_process_without_cuda_is_not_initialized_as_driver_580_answered(emu: Emulator) -> None:
    """docs/facts.md: the real driver answered CUDA_ERROR_NOT_INITIALIZED for a
    live process that never touched CUDA (this caller has called cuInit), and
    the utility printed one line for it."""
    sleeper = subprocess.Popen(["sleep", "30"])
    try:
        assert emu.restore_tid(sleeper.pid) == (CUDA_ERROR_NOT_INITIALIZED, None)
        assert emu.state(sleeper.pid) == (CUDA_ERROR_NOT_INITIALIZED, None)
        # Not read yet: no process at all keeps the documents' invalid value.
        assert emu.restore_tid(2**22 + 1)[0] == CUDA_ERROR_INVALID_VALUE
        assert emu.state(2**22 + 1) == (CUDA_ERROR_INVALID_VALUE, None)
        for pid in (sleeper.pid, 2**22 + 1):
            assert emu.act("lock", pid, timeout_ms=1000) == CUDA_ERROR_INVALID_VALUE
            assert emu.act("unlock", pid) == CUDA_ERROR_INVALID_VALUE
        # what CRIU's cuda plugin reads as "not a CUDA process"
        done = emu.utility("--get-restore-tid", "--pid", str(sleeper.pid))
        assert (done.returncode, done.stdout) == (1, "")
        assert done.stderr == f"Could not find restore thread for process ID {sleeper.pid}\n"
    finally:
        sleeper.kill()
        sleeper.wait()


def test_the_restore_thread_must_run_lock_times_out_on_a_frozen_process(
    emu: Emulator, start_worker: Callable[..., Worker]
) -> None:
    worker = start_worker(MiB)
    worker.advancing()
    freeze(worker.pid)
    try:
        started = time.monotonic()
        assert emu.act("lock", worker.pid, timeout_ms=200) == CUDA_ERROR_NOT_READY
        assert 0.15 <= time.monotonic() - started < 3
        # the state and the restore thread id are readable while frozen (CRIU needs both)
        assert emu.state(worker.pid) == (CUDA_SUCCESS, RUNNING)
        assert emu.restore_tid(worker.pid)[0] == CUDA_SUCCESS
    finally:
        os.kill(worker.pid, signal.SIGCONT)
    # the expired request is still served once the thread runs: it must not lock
    wait_for(
        lambda: (
            emulator.calls(emu.log, "restoreThread.lock", worker.pid)[-1:]
            and emulator.calls(emu.log, "restoreThread.lock", worker.pid)[-1]["phase"] == "end"
        ),
        10,
        "the worker's restore thread to see the expired lock",
    )
    assert emu.state(worker.pid) == (CUDA_SUCCESS, RUNNING)
    worker.advancing()

    # checkpoint has no timeout: on a frozen process it waits until the process runs
    assert emu.act("lock", worker.pid, timeout_ms=5000) == CUDA_SUCCESS
    freeze(worker.pid)
    try:
        thread, results = in_thread(lambda: emu.act("checkpoint", worker.pid))
        thread.join(0.3)
        assert thread.is_alive() and emu.state(worker.pid) == (CUDA_SUCCESS, LOCKED)
    finally:
        os.kill(worker.pid, signal.SIGCONT)
    thread.join(10)
    assert results == [CUDA_SUCCESS]
    assert emu.act("restore", worker.pid) == CUDA_SUCCESS
    assert emu.act("unlock", worker.pid) == CUDA_SUCCESS
    worker.advancing()


def test_injected_failure_is_terminal(emu: Emulator, start_worker: Callable[..., Worker]) -> None:
    worker = start_worker(MiB)
    emulator.add_fault(emu.state_dir, worker.pid, "checkpoint", "fail")
    assert emu.act("lock", worker.pid, timeout_ms=5000) == CUDA_SUCCESS
    assert emu.act("checkpoint", worker.pid) == CUDA_ERROR_OPERATING_SYSTEM
    assert emu.state(worker.pid) == (CUDA_SUCCESS, FAILED)
    emulator.clear_faults(emu.state_dir)
    for action in ("unlock", "restore", "checkpoint"):
        assert emu.act(action, worker.pid) == CUDA_ERROR_ILLEGAL_STATE
    assert emu.act("lock", worker.pid, timeout_ms=1000) == CUDA_ERROR_ILLEGAL_STATE
    assert emu.state(worker.pid) == (CUDA_SUCCESS, FAILED)

    # an error without a state change: a restore that fails stays CHECKPOINTED
    other = start_worker(MiB)
    emulator.add_fault(emu.state_dir, other.pid, "restore", "error", CUDA_ERROR_NOT_READY)
    assert emu.act("lock", other.pid, timeout_ms=5000) == CUDA_SUCCESS
    assert emu.act("checkpoint", other.pid) == CUDA_SUCCESS
    assert emu.act("restore", other.pid) == CUDA_ERROR_NOT_READY
    assert emu.state(other.pid) == (CUDA_SUCCESS, CHECKPOINTED)
    emulator.clear_faults(emu.state_dir)
    assert emu.act("restore", other.pid) == CUDA_SUCCESS
    assert emu.act("unlock", other.pid) == CUDA_SUCCESS
    other.advancing()


@pytest.mark.parametrize("cause", ["a full device", "an injected error"])
def test_a_restore_that_ran_out_of_memory_can_never_succeed(
    emu: Emulator, start_worker: Callable[..., Worker], cause: str
) -> None:
    """NVIDIA/cuda-checkpoint#44 (driver 580): after a restore failed
    with out of memory, every later restore fails with 304 even once the
    memory is free, and the process cannot be unlocked."""
    parked = start_worker(400 * MiB)
    assert emu.act("lock", parked.pid, timeout_ms=5000) == CUDA_SUCCESS
    assert emu.act("checkpoint", parked.pid) == CUDA_SUCCESS
    if cause == "a full device":
        filler = start_worker(700 * MiB)  # of the emulated GPU's 1 GiB
    else:
        emulator.add_fault(emu.state_dir, parked.pid, "restore", "error", CUDA_ERROR_OUT_OF_MEMORY)
    assert emu.act("restore", parked.pid) == CUDA_ERROR_OUT_OF_MEMORY
    assert emu.state(parked.pid) == (CUDA_SUCCESS, CHECKPOINTED)
    if cause == "a full device":
        filler.process.kill()
        filler.process.wait()
        wait_for(lambda: filler.pid not in emulator.nvml_process_memory(emu.env), 10, "room")
    emulator.clear_faults(emu.state_dir)
    for _ in range(2):
        assert emu.act("restore", parked.pid) == CUDA_ERROR_OPERATING_SYSTEM
    assert emu.act("unlock", parked.pid) == CUDA_ERROR_ILLEGAL_STATE
    assert emu.state(parked.pid) == (CUDA_SUCCESS, CHECKPOINTED)


def test_in_progress_states_are_visible_while_a_call_hangs(
    emu: Emulator, start_worker: Callable[..., Worker]
) -> None:
    worker = start_worker(8 * MiB)
    assert emu.act("lock", worker.pid, timeout_ms=5000) == CUDA_SUCCESS
    for action, during, after in (
        ("checkpoint", CHECKPOINTING, CHECKPOINTED),
        ("restore", RESTORING, LOCKED),
    ):
        rule = emulator.add_fault(emu.state_dir, worker.pid, action, "hang")  # type: ignore[arg-type]
        thread, results = in_thread(partial(emu.act, action, worker.pid))
        wait_for(partial(in_state, emu, worker.pid, during), 10, f"{action}ing")
        thread.join(0.1)
        assert thread.is_alive()
        emulator.remove_fault(emu.state_dir, rule)
        thread.join(10)
        assert results == [CUDA_SUCCESS]
        assert emu.state(worker.pid) == (CUDA_SUCCESS, after)
    assert emu.act("unlock", worker.pid) == CUDA_SUCCESS
    worker.advancing()


def test_the_call_log_has_begin_and_end_lines_and_shows_overlapping_calls(
    emu: Emulator, start_worker: Callable[..., Worker]
) -> None:
    first, second = start_worker(MiB), start_worker(MiB)
    for worker in (first, second):
        emulator.add_fault(emu.state_dir, worker.pid, "lock", "delay", 300)
    # calls on different pids from one process may run at once
    threads = [in_thread(partial(emu.act, "lock", w.pid, timeout_ms=5000)) for w in (first, second)]
    for thread, results in threads:
        thread.join(10)
        assert results == [CUDA_SUCCESS]
    emulator.clear_faults(emu.state_dir)
    for worker in (first, second):
        assert emu.act("unlock", worker.pid) == CUDA_SUCCESS

    entries = emulator.read_log(emu.log)
    locks = [e for e in entries if e["call"] == "cuCheckpointProcessLock"]
    for worker in (first, second):
        mine = [e for e in locks if e["pid"] == worker.pid]
        assert [e["phase"] for e in mine] == ["begin", "end"]
        assert mine[0]["result"] is None and mine[1]["result"] == CUDA_SUCCESS
        assert mine[0]["caller"] == os.getpid() and mine[0]["t"] <= mine[1]["t"]
    # both calls were in flight at once, and both targets served them at once
    for call in ("cuCheckpointProcessLock", "restoreThread.lock"):
        spans = [s for s in emulator.intervals(emu.log, call) if s[2] in (first.pid, second.pid)]
        (_, a_end, _), (b_begin, _, _) = sorted(spans)
        assert b_begin < a_end, f"the two {call} calls did not overlap"
    # the worker's own calls are logged under its pid
    assert any(
        e["call"] == "cuMemAlloc" and e["pid"] == first.pid and e["phase"] == "end" for e in entries
    )


def test_nvml_follows_the_configuration(emu: Emulator, start_worker: Callable[..., Worker]) -> None:
    worker = start_worker(4 * MiB)
    view = emulator.nvml_view(emu.env)
    assert view["driver"] == "580.65.06"
    (gpu,) = view["gpus"]
    assert gpu["total"] == 1 << 30 and gpu["used"] + gpu["free"] == gpu["total"]
    assert gpu["uuid"].startswith("GPU-")

    other = {
        "TIMESHARE_EMULATOR_GPUS": "2",
        "TIMESHARE_EMULATOR_DRIVER": "570.124.06",
        "TIMESHARE_EMULATOR_NVML_PROCESS_MEMORY": "unavailable",  # MIG, no accounting
    }
    view = emulator.nvml_view({**emu.env, **other})
    assert view["driver"] == "570.124.06" and len(view["gpus"]) == 2
    assert (worker.pid, None) in view["gpus"][0]["processes"]
    assert view["gpus"][1]["processes"] == []

    # a driver older than the checkpoint API: cuda-bindings finds no such function
    probe = (
        "from cuda.bindings import driver\n"
        "print(driver.cuDriverGetVersion()[1])\n"
        "try:\n    driver.cuCheckpointProcessGetState(1)\nexcept Exception as e:\n"
        "    print('not-found' if 'not found' in str(e) else repr(e))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe],
        env={**os.environ, **emu.env, "TIMESHARE_EMULATOR_DRIVER": "550.54.15"},
        capture_output=True, text=True, timeout=30, check=False,
    )  # fmt: skip
    assert done.stdout.split() == ["12040", "not-found"], done.stderr


def test_the_cuda_checkpoint_utility_round_trip(
    emu: Emulator, start_worker: Callable[..., Worker]
) -> None:
    worker = start_worker(16 * MiB)
    pid = str(worker.pid)
    assert "--action" in emu.utility("--help").stdout
    assert emu.utility("--get-state", "--pid", pid).stdout == "running\n"
    done = emu.utility("--get-restore-tid", "--pid", pid)
    assert done.returncode == 0 and int(done.stdout) == emu.restore_tid(worker.pid)[1]
    for action in ("lock", "checkpoint"):
        extra = ("--timeout", "5000") if action == "lock" else ()
        done = emu.utility("--action", action, "--pid", pid, *extra)
        assert (done.returncode, done.stdout, done.stderr) == (0, "", "")
    assert emu.utility("--get-state", "--pid", pid).stdout == "checkpointed\n"
    assert worker.pid not in emulator.nvml_process_memory(emu.env)
    done = emu.utility("--action", "unlock", "--pid", pid)
    assert done.returncode == 1
    assert done.stderr == (
        f"Could not unlock on process ID {pid}: "
        '"the operation cannot be performed in the present state"\n'
    )
    for action in ("restore", "unlock"):
        assert emu.utility("--action", action, "--pid", pid).returncode == 0
    assert emu.utility("--get-state", "--pid", pid).stdout == "running\n"
    worker.advancing()

    # the r550 utility: --toggle only, and CRIU finds no "--action" in its help
    old = {"TIMESHARE_EMULATOR_TOGGLE_ONLY": "1"}
    assert "--action" not in emu.utility("--help", **old).stdout
    assert emu.utility("--action", "lock", "--pid", pid, **old).returncode == 1
    assert emu.utility("--toggle", "--pid", pid, **old).returncode == 0
    assert emu.state(worker.pid) == (CUDA_SUCCESS, CHECKPOINTED)
    assert emu.utility("--toggle", "--pid", pid, **old).returncode == 0
    assert emu.state(worker.pid) == (CUDA_SUCCESS, RUNNING)
    worker.advancing()
