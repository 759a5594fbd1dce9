"""The CUDA checkpoint backends' own rules, on the GPU emulator through the real
cuda-bindings (and the emulator's cuda-checkpoint utility): order of the phases
and ranks in parallel, per-rank figures, stacks that lock and checkpoint while
the process runs, in-progress states waited for, a rank skipped, refusals at
start, host memory, memory NVML cannot tell, one switch per node whatever the
group. (The scenarios every backend shares are in test_conformance.py.)"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

from tests.conftest import REPO
from tests.cuda_backends import (
    CONFIG,
    KINDS,
    MiB,
    backend_of,
    driver_backend,
    read_emulated_nvml,
    spans,
    start_job,
    switch_input,
)
from tests.polling import async_check, wait_until, wait_until_async
from timeshare.activities.backends.base import BackendError
from timeshare.activities.backends.cuda_checkpoint import CudaCheckpointBackend
from timeshare.activities.backends.cuda_states import CudaState
from timeshare.activities.backends.freeze import FreezeBackend
from timeshare.activities.backends.processes import ProcessTable
from timeshare.activities.backends.stacked import StackedBackend
from timeshare.activities.switch import SwitchActivities
from timeshare.gpu_check import emulator
from timeshare.gpu_check.emulator import CHECKPOINTED, CHECKPOINTING, LOCKED, RUNNING
from timeshare.gpu_check.emulator.rig import (
    CudaWorker,
    Emulator,
    nvml_device_memory,
    process_state,
    start_worker,
)
from timeshare.models import FailureKind, NodeInfo, NodeRecord
from timeshare.status import nodes_table
from timeshare.workers.agent.serve import node_info


@pytest.fixture(params=KINDS)
def kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def nvml(gpu_emulator: Emulator, monkeypatch: pytest.MonkeyPatch) -> None:
    read_emulated_nvml(monkeypatch, gpu_emulator)


async def test_ranks_are_all_locked_first_then_moved_in_parallel_each_reported(
    gpu_emulator: Emulator, tmp_path: Path, cuda_workers: list[CudaWorker], kind: str, nvml: None
) -> None:
    emu, table = gpu_emulator, ProcessTable()
    backend = backend_of(kind, emu, table)
    job = start_job(emu, tmp_path, cuda_workers, table, "a", nbytes=24 * MiB)
    for pid in job.pids:
        for call in ("checkpoint", "restore"):
            emulator.add_fault(emu.state_dir, pid, call, "delay", 400)

    checkpointed = await backend.checkpoint("g", "a")
    locks = spans(emu, "cuCheckpointProcessLock", job.pids)
    checkpoints = spans(emu, "cuCheckpointProcessCheckpoint", job.pids)
    assert len(locks) == len(checkpoints) == 2
    assert max(end for _, end, _ in locks) <= min(begin for begin, _, _ in checkpoints)
    # Both ranks' checkpoints were under way at once (one utility process each).
    (_, first_end, _), (second_begin, _, _) = checkpoints
    assert second_begin < first_end, "the ranks were checkpointed one after the other"
    # Bytes and seconds per rank, from NVML and the calls themselves.
    ranks = {rank.pid: rank for rank in checkpointed.ranks if rank.action == "checkpoint"}
    assert sorted(ranks) == job.pids
    assert all(rank.bytes == 24 * MiB and rank.seconds > 0 for rank in ranks.values())
    assert checkpointed.bytes == 48 * MiB

    restored = await backend.restore("g", "a")
    restores = spans(emu, "cuCheckpointProcessRestore", job.pids)
    unlocks = spans(emu, "cuCheckpointProcessUnlock", job.pids)
    assert max(end for _, end, _ in restores) <= min(begin for begin, _, _ in unlocks)
    (_, first_end, _), (second_begin, _, _) = restores
    assert second_begin < first_end, "the ranks were restored one after the other"
    assert sorted(r.pid for r in restored.ranks if r.action == "restore") == job.pids
    assert all(r.bytes == 24 * MiB for r in restored.ranks if r.action == "restore")


async def test_freeze_and_cuda_lock_and_checkpoint_while_running_then_freeze(
    gpu_emulator: Emulator, tmp_path: Path, cuda_workers: list[CudaWorker]
) -> None:
    """The driver's restore thread must run for a lock, checkpoint and
    restore: a stack that froze first would time out every lock."""
    emu, table = gpu_emulator, ProcessTable()
    cuda = driver_backend(emu, table)
    freeze = FreezeBackend(CONFIG)
    freeze.attach(table)
    stack = StackedBackend([freeze, cuda])
    job = start_job(emu, tmp_path, cuda_workers, table, "a")

    assert (await stack.checkpoint("g", "a")).action == "checkpoint"
    for pid in job.pids:
        served = emulator.calls(emu.log, "restoreThread.checkpoint", pid)
        assert [e["result"] for e in served if e["phase"] == "end"] == [0]
        assert process_state(pid) == "T"
    assert await cuda.states("g", "a") == {pid: CudaState.CHECKPOINTED for pid in job.pids}

    assert (await stack.restore("g", "a")).action == "restore"
    assert await cuda.states("g", "a") == {pid: CudaState.RUNNING for pid in job.pids}
    assert all(process_state(pid) != "T" for pid in job.pids)

    # Locked and frozen (co-residency), then made to leave after all: thawed
    # for the checkpoint, frozen again after it.
    assert (await stack.lock("g", "a")).action == "lock"
    assert all(process_state(pid) == "T" for pid in job.pids)
    assert (await stack.checkpoint("g", "a")).action == "checkpoint"
    assert await cuda.states("g", "a") == {pid: CudaState.CHECKPOINTED for pid in job.pids}
    assert all(process_state(pid) == "T" for pid in job.pids)
    await stack.restore("g", "a")

    # A job on several nodes is first only locked everywhere: frozen only
    # after its checkpoint, which needs it running.
    assert (await stack.quiesce("g", "a")).action == "lock"
    assert all(process_state(pid) != "T" for pid in job.pids)
    assert (await stack.checkpoint("g", "a")).action == "checkpoint"
    assert all(process_state(pid) == "T" for pid in job.pids)
    await stack.restore("g", "a")
    for rank in job.ranks:
        rank.advancing()


async def test_checkpointing_and_restoring_are_waited_for(
    gpu_emulator: Emulator, tmp_path: Path, cuda_workers: list[CudaWorker], kind: str
) -> None:
    emu, table = gpu_emulator, ProcessTable()
    backend = backend_of(kind, emu, table)
    job = start_job(emu, tmp_path, cuda_workers, table, "a", ranks=1)
    (pid,) = job.pids
    assert emu.act("lock", pid, timeout_ms=5000) == 0
    rule = emulator.add_fault(emu.state_dir, pid, "checkpoint", "hang")
    # Someone else (CRIU, an operator) checkpoints it meanwhile.
    outside = threading.Thread(target=emu.act, args=("checkpoint", pid), daemon=True)
    outside.start()
    wait_until(lambda: emu.state(pid) == (0, CHECKPOINTING), "the outside checkpoint to begin")
    seen = len(emulator.calls(emu.log, "cuCheckpointProcessGetState", pid))
    reading = asyncio.create_task(backend.states("g", "a"))
    # The backend has read the state while the checkpoint is under way ...
    await wait_until_async(
        async_check(
            lambda: any(
                e["phase"] == "end" and e["result"] == 0
                for e in emulator.calls(emu.log, "cuCheckpointProcessGetState", pid)[seen:]
            )
        ),
        "the backend to read the state mid-checkpoint",
    )
    emulator.remove_fault(emu.state_dir, rule)
    # Read once it ended: checkpointed, never "failed" on the way.
    assert await reading == {pid: CudaState.CHECKPOINTED}
    outside.join(10)
    assert (await backend.restore("g", "a")).action == "restore"


async def test_a_checkpoint_that_leaves_a_rank_running_fails(
    gpu_emulator: Emulator, tmp_path: Path, cuda_workers: list[CudaWorker]
) -> None:
    emu, table = gpu_emulator, ProcessTable()
    backend = driver_backend(emu, table)
    (rank,) = start_job(emu, tmp_path, cuda_workers, table, "a", ranks=1).ranks
    go = tmp_path / "late-rank-go"
    late = start_worker(emu.env, tmp_path, "late", start_when=go)  # not a CUDA process yet
    cuda_workers.append(late)
    table.register("g", "a", late.pid)
    rule = emulator.add_fault(emu.state_dir, rank.pid, "checkpoint", "hang")
    checkpoint = asyncio.create_task(backend.checkpoint("g", "a"))
    await asyncio.to_thread(
        wait_until, lambda: emu.state(rank.pid) == (0, CHECKPOINTING), "the checkpoint to begin"
    )
    go.touch()  # the late rank starts CUDA while its job is being checkpointed
    await asyncio.to_thread(
        wait_until, lambda: emu.restore_tid(late.pid)[0] == 0, "the late rank to start CUDA"
    )
    emulator.remove_fault(emu.state_dir, rule)
    with pytest.raises(BackendError, match=rf"left processes {late.pid} \(running\)"):
        await checkpoint


def agent_refusal(env: dict[str, str], *args: str) -> str:
    """What `timeshare agent` says when it refuses to start (exit 1, one line)."""
    done = subprocess.run(
        [sys.executable, "-m", "timeshare", "agent", "--node=n", "--temporal=localhost:1", *args],
        env={**os.environ, **env}, capture_output=True, text=True, timeout=60, cwd=REPO,
    )  # fmt: skip
    assert done.returncode == 1, (done.stdout, done.stderr)
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    return lines[0]


BINDINGS_WITHOUT_RESTORE = """
import sys, types
from cuda.bindings import driver
bindings = types.ModuleType("driver")
for name in dir(driver):
    if name != "cuCheckpointProcessRestore":  # as cuda-bindings 13.0.0 and 13.0.1
        setattr(bindings, name, getattr(driver, name))
from timeshare.activities.backends.base import BackendConfig, BackendError, JobFailed, NoDeviceRoom
from timeshare.activities.backends.cuda_driver import CudaDriverBackend
try:
    CudaDriverBackend.create_with(BackendConfig(node="n"), lambda: bindings)
except BackendError as error:
    print(error)
"""


def test_the_cuda_backends_refuse_to_start_where_they_cannot_work(gpu_emulator: Emulator) -> None:
    env = gpu_emulator.env
    utility = f"--cuda-checkpoint={gpu_emulator.lib_dir / emulator.UTILITY}"
    old = {**env, "TIMESHARE_EMULATOR_DRIVER": "550.54.15"}
    assert "needs NVIDIA driver 570 or later" in agent_refusal(old, "--backend=cuda")
    refused = agent_refusal(old, "--backend=cuda-checkpoint", utility)
    assert "needs NVIDIA driver 570 or later" in refused and "--action" in refused
    # NVML says 575, but the driver library has no checkpoint API.
    mixed = {**env, "TIMESHARE_EMULATOR_DRIVER": "575.51.03",
             "TIMESHARE_EMULATOR_CUDA_VERSION": "12060"}  # fmt: skip
    refused = agent_refusal(mixed, "--backend=cuda")
    assert "has no cuCheckpointProcessGetRestoreThreadId" in refused and "570" in refused
    toggle_only = {**env, "TIMESHARE_EMULATOR_TOGGLE_ONLY": "1"}
    refused = agent_refusal(toggle_only, "--backend=cuda-checkpoint", utility)
    assert "offers no --action" in refused and "toggle" in refused
    # cuda-bindings without the restore: refused before anything is checkpointed.
    done = subprocess.run(
        [sys.executable, "-c", BINDINGS_WITHOUT_RESTORE], env={**os.environ, **env},
        capture_output=True, text=True, timeout=60, cwd=REPO,
    )  # fmt: skip
    assert "has no cuCheckpointProcessRestore" in done.stdout, done.stderr
    assert "!=13.0.0,!=13.0.1" in done.stdout
    # No NVIDIA driver at all.
    none = {"TIMESHARE_EMULATOR_NVML_INIT_ERROR": "9", **env}
    assert "cannot run here" in agent_refusal(none, "--backend=cuda")
    # And the packaging excludes the broken bindings.
    assert "!=13.0.0,!=13.0.1" in (REPO / "pyproject.toml").read_text()


async def test_host_memory_is_held_for_every_checkpoint_under_way_whatever_its_group(
    gpu_emulator: Emulator,
    tmp_path: Path,
    cuda_workers: list[CudaWorker],
    nvml: None,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    emu, table = gpu_emulator, ProcessTable()
    backend = driver_backend(emu, table)
    first = start_job(emu, tmp_path, cuda_workers, table, "a", ranks=1, nbytes=64 * MiB, group="g1")
    start_job(emu, tmp_path, cuda_workers, table, "b", ranks=1, nbytes=64 * MiB, group="g2")
    monkeypatch.setattr(
        "timeshare.activities.backends.checkpoint_memory.host_memory_available", lambda: 100 * MiB
    )
    # One group's checkpoint is under way (slow) ...
    emulator.add_fault(emu.state_dir, first.pids[0], "checkpoint", "delay", 1500)
    under_way = asyncio.create_task(backend.checkpoint("g1", "a"))
    await asyncio.to_thread(
        wait_until,
        lambda: emu.state(first.pids[0]) == (0, CHECKPOINTING),
        "the first checkpoint to begin",
    )
    # ... so the other group's does not fit beside it, and nothing of it moves.
    with pytest.raises(BackendError, match=r"held by checkpoints under way.*nothing was moved"):
        await backend.checkpoint("g2", "b")
    assert list((await backend.states("g2", "b")).values()) == [CudaState.RUNNING]
    assert (await under_way).bytes == 64 * MiB
    monkeypatch.setattr(
        "timeshare.activities.backends.checkpoint_memory.host_memory_available", lambda: 0
    )
    with pytest.raises(BackendError, match=r"parked here already: g1/a 0\.1 GiB"):
        await backend.checkpoint("g2", "b")


async def test_footprints_come_from_nvml_and_are_remembered_while_parked(
    gpu_emulator: Emulator, tmp_path: Path, cuda_workers: list[CudaWorker], nvml: None
) -> None:
    emu, table = gpu_emulator, ProcessTable()
    backend = driver_backend(emu, table)
    start_job(emu, tmp_path, cuda_workers, table, "a", nbytes=32 * MiB)
    assert await backend.footprint("g", "a") == {"gpu0": 64 * MiB}
    assert await backend.admission_footprint("g", "a") == {"gpu0": 64 * MiB}
    free = (await backend.free_memory("g") or {})["gpu0"]
    assert free == max(
        0, nvml_device_memory(emu.env)["gpu0"].free_bytes - CONFIG.co_residency_margin_bytes
    )
    assert (await backend.checkpoint("g", "a")).bytes == 64 * MiB
    assert await backend.footprint("g", "a") == {}
    assert await backend.admission_footprint("g", "a") == {"gpu0": 64 * MiB}
    restored = await backend.restore("g", "a")
    assert (restored.action, restored.bytes) == ("restore", 64 * MiB)


async def test_memory_nvml_cannot_tell_is_unknown_and_such_a_job_is_moved_never_packed(
    gpu_emulator: Emulator,
    tmp_path: Path,
    cuda_workers: list[CudaWorker],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    emu, table = gpu_emulator, ProcessTable()
    backend = driver_backend(emu, table, CONFIG.model_copy(update={"co_residency_margin_bytes": 0}))
    agent = SwitchActivities("n", backend, table)
    for job in ("a", "b"):
        start_job(emu, tmp_path, cuda_workers, table, job, ranks=1, nbytes=4 * MiB)
    seen = {"env": emu.env}
    monkeypatch.setattr(
        "timeshare.activities.backends.checkpointing.device_memory",
        lambda: nvml_device_memory(seen["env"]),
    )
    run = ActivityEnvironment().run
    # Known memory and room for both: the job that yields is only locked.
    await run(agent.switch, switch_input("g", "a", 1, ["b"]))
    kept = await run(agent.switch, switch_input("g", "b", 2, ["a"]))
    assert kept.co_resident == ["a"] and backend.notes() == []
    # NVML cannot tell (MIG, no accounting): unknown, never zero, so moved.
    seen["env"] = {**emu.env, "TIMESHARE_EMULATOR_NVML_PROCESS_MEMORY": "unavailable"}
    assert await backend.footprint("g", "a") is None
    moved = await run(agent.switch, switch_input("g", "a", 3, ["b"]))
    assert moved.co_resident == []
    assert [a.action for a in moved.actions] == ["checkpoint", "unlock"]
    (note,) = {n for n in backend.notes() if "g/b" in n}
    assert "co-residency off for g/b" in note and "MIG" in note
    # The agent announces it, and `timeshare status` says it under the node.
    info = node_info(NodeInfo(node="n", backend="cuda", simulated=False), backend)
    assert note in info.notes
    assert f"n: {note}" in nodes_table([NodeRecord(**info.model_dump())])


async def test_switches_of_two_groups_on_one_node_never_overlap(
    gpu_emulator: Emulator, tmp_path: Path, cuda_workers: list[CudaWorker]
) -> None:
    emu, table = gpu_emulator, ProcessTable()
    backend = driver_backend(emu, table)
    agent = SwitchActivities("n", backend, table)
    one = start_job(emu, tmp_path, cuda_workers, table, "a", ranks=1, group="g1")
    two = start_job(emu, tmp_path, cuda_workers, table, "b", ranks=1, group="g2")
    start_job(emu, tmp_path, cuda_workers, table, "c", ranks=1, group="g2")
    run = ActivityEnvironment().run
    rule = emulator.add_fault(emu.state_dir, one.pids[0], "checkpoint", "hang")
    # g1's switch hangs in its checkpoint; g2's switch must wait for the node.
    first = asyncio.create_task(run(agent.switch, switch_input("g1", "x", 1, ["a"])))
    await asyncio.to_thread(
        wait_until, lambda: emu.state(one.pids[0]) == (0, CHECKPOINTING), "g1's checkpoint"
    )
    second = asyncio.create_task(run(agent.switch, switch_input("g2", "c", 1, ["b"])))
    while agent.waiting == 0:
        assert not second.done(), "g2's switch ran while g1's held the node"
        await asyncio.sleep(0.01)
    emulator.remove_fault(emu.state_dir, rule)
    await first
    await second
    g1_calls = [e for e in emulator.read_log(emu.log) if e["pid"] in one.pids]
    acting = ("Lock", "Checkpoint", "Restore", "Unlock")
    g2_calls = [
        e
        for e in emulator.read_log(emu.log)
        if e["pid"] in two.pids and e["call"] in {f"cuCheckpointProcess{a}" for a in acting}
    ]
    g1_end = max(e["t"] for e in g1_calls if e["call"] == "cuCheckpointProcessCheckpoint")
    assert g2_calls and min(e["t"] for e in g2_calls) > g1_end


async def test_a_switch_whose_checkpoint_outlives_the_call_timeout_fails_as_unknown(
    gpu_emulator: Emulator, tmp_path: Path, cuda_workers: list[CudaWorker]
) -> None:
    """The workflow marks the node's residency unknown for a failed checkpoint
    (scheduling.base.UNKNOWN_RESIDENT); the agent says why."""
    emu, table = gpu_emulator, ProcessTable()
    backend = driver_backend(emu, table, CONFIG.model_copy(update={"call_timeout_seconds": 1.0}))
    agent = SwitchActivities("n", backend, table)
    job = start_job(emu, tmp_path, cuda_workers, table, "a", ranks=1)
    emulator.add_fault(emu.state_dir, job.pids[0], "checkpoint", "hang")
    with pytest.raises(ApplicationError) as failed:
        await ActivityEnvironment().run(agent.switch, switch_input("g", "b", 1, ["a"]))
    assert failed.value.type == FailureKind.CHECKPOINT and "unknown" in failed.value.message
    emulator.clear_faults(emu.state_dir)
    wait_until(lambda: emu.state(job.pids[0]) == (0, CHECKPOINTED), "the hung call to end")
    assert [s for s in (RUNNING, LOCKED) if s == emu.state(job.pids[0])[1]] == []


async def test_a_rank_with_a_child_without_cuda_is_moved_and_the_child_left_alone(
    gpu_emulator: Emulator, tmp_path: Path, cuda_workers: list[CudaWorker], kind: str
) -> None:
    """The child (a DataLoader's worker) answers CUDA_ERROR_NOT_INITIALIZED,
    as on driver 580 (docs/facts.md): no CUDA there, not a failed switch."""
    emu, table = gpu_emulator, ProcessTable()
    backend = backend_of(kind, emu, table)
    (rank,) = start_job(emu, tmp_path, cuda_workers, table, "a", ranks=1, children=1).ranks
    (child,) = rank.children
    assert emu.restore_tid(child)[0] == emulator.CUDA_ERROR_NOT_INITIALIZED
    assert (await backend.checkpoint("g", "a")).pids == [rank.pid]
    assert emu.state(rank.pid) == (0, CHECKPOINTED)
    assert (await backend.restore("g", "a")).pids == [rank.pid]
    rank.advancing()
    assert not [e for e in emulator.read_log(emu.log) if e["pid"] == child
                and e["call"] != "cuCheckpointProcessGetRestoreThreadId"]  # fmt: skip


def utility_that(tmp_path: Path, emu: Emulator, name: str, script: str) -> str:
    """A cuda-checkpoint that runs ``script`` (sh) for some calls; "real"
    passes a call on to the emulator's utility."""
    path = tmp_path / name
    real = f'exec {emu.lib_dir / emulator.UTILITY} "$@"'
    path.write_text(f"#!/bin/sh\nreal() {{ {real}; }}\n{script}\n")
    path.chmod(0o755)
    return str(path)


BROKEN_UTILITIES = {
    # Its driver library is missing: the loader's words, exit 127.
    "cannot load": (
        'echo "cuda-checkpoint: error while loading shared libraries: libcuda.so.1: '
        'cannot open shared object file" >&2; exit 127',
        r"--get-restore-tid --pid \d+ failed \(exit 127\): .*libcuda.so.1",
    ),
    "refuses": (
        'echo "Could not get restore thread for process ID $3: \\"operation not permitted\\"" >&2;'
        " exit 1",
        r"failed \(exit 1\): Could not get restore thread .*operation not permitted",
    ),
    "crashes": ("kill -SEGV $$", r"failed \(killed by signal 11\): no output"),
    "prints nonsense": (
        'echo "tid: unknown"',
        r"exit 0\): printed 'tid: unknown', not a thread id",
    ),
    "cannot read the state": (
        '[ "$1" = --get-state ] && { echo "Error getting process state for process ID $3: '
        '\\"operation not permitted\\"" >&2; exit 1; }; real "$@"',
        r"--get-state --pid \d+ failed \(exit 1\): Error getting process state",
    ),
}


@pytest.mark.parametrize("broken", sorted(BROKEN_UTILITIES))
async def test_a_utility_that_fails_otherwise_than_no_cuda_fails_the_switch_loudly(
    gpu_emulator: Emulator, tmp_path: Path, cuda_workers: list[CudaWorker], broken: str
) -> None:
    """Only "Could not find restore thread for process ID P" means no CUDA:
    read as "nothing to move", any other failure would leave the job's state
    on the device and report the switch done."""
    emu, table = gpu_emulator, ProcessTable()
    script, expected = BROKEN_UTILITIES[broken]
    utility = utility_that(tmp_path, emu, "cuda-checkpoint", script)
    backend = CudaCheckpointBackend(CONFIG, utility)
    backend.attach(table)
    (rank,) = start_job(emu, tmp_path, cuda_workers, table, "a", ranks=1).ranks
    with pytest.raises(BackendError, match=expected) as failed:
        await backend.checkpoint("g", "a")
    assert f"run `{utility} --get-" in str(failed.value)  # what to do next
    assert emu.state(rank.pid) == (0, RUNNING)


async def test_a_utility_the_agent_cannot_run_fails_the_switch_loudly(
    gpu_emulator: Emulator, tmp_path: Path, cuda_workers: list[CudaWorker]
) -> None:
    emu, table = gpu_emulator, ProcessTable()
    utility = utility_that(tmp_path, emu, "cuda-checkpoint", 'real "$@"')
    backend = CudaCheckpointBackend(CONFIG, utility)
    backend.attach(table)
    start_job(emu, tmp_path, cuda_workers, table, "a", ranks=1)
    Path(utility).chmod(0o644)  # as after a copy that lost its mode
    with pytest.raises(BackendError, match=r"could not run \(Permission denied\)"):
        await backend.checkpoint("g", "a")
