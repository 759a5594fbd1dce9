"""The freeze backend and process registration, on real processes (no GPU)."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import sys
from pathlib import Path

import pytest
from temporalio.testing import ActivityEnvironment

from tests.credentials import known_jobs, token_env, token_of
from tests.polling import async_check, wait_until, wait_until_async
from tests.processes import detached, kill
from timeshare.activities.backends import processes
from timeshare.activities.backends.base import BackendConfig
from timeshare.activities.backends.cgroups import FreezerCgroup, hierarchies, own_cgroup
from timeshare.activities.backends.freeze import FreezeBackend
from timeshare.activities.backends.loading import load_backend
from timeshare.activities.backends.processes import (
    ProcessTable,
    RegistrationRefused,
    owner,
    stopped,
)
from timeshare.activities.switch import SwitchActivities
from timeshare.errors import FailedPrecondition
from timeshare.models import NodeMove, SwitchInput
from timeshare.registration import register_process
from timeshare.workers.agent.registration_socket import registration, serve_agent_socket

# Written whole (rename), so a process frozen mid-write leaves a number.
COUNTER = """
import sys, time, pathlib
path = pathlib.Path(sys.argv[1])
partial = path.with_name(path.name + ".partial")
n = 0
while True:
    n += 1
    partial.write_text(str(n))
    partial.replace(path)
    time.sleep(0.01)
"""


def counter(path: Path) -> int:
    return detached(sys.executable, "-c", COUNTER, str(path))


def counts_past(path: Path, before: int) -> bool:
    """The counter goes past ``before`` (a loaded machine may take seconds)."""
    return wait_until(lambda: count(path) > before, f"{path.name} to count past {before}")


def count(path: Path) -> int:
    def text() -> str:
        return path.read_text() if path.exists() else ""

    return int(wait_until(text, f"{path.name} to count"))


async def test_a_frozen_job_stops_counting_until_restored(tmp_path: Path) -> None:
    table = ProcessTable()
    backend = FreezeBackend(BackendConfig(node="n", record_path=str(tmp_path / "record.jsonl")))
    backend.attach(table)
    workers = [counter(tmp_path / f"count-{i}") for i in range(2)]
    try:
        for worker in workers:
            table.register("g", "a", worker)
        for i in range(2):
            count(tmp_path / f"count-{i}")  # counting before they are frozen
        assert await backend.resident_jobs("g") == ["a"]
        assert (await backend.checkpoint("g", "a")).action == "checkpoint"
        assert (await backend.checkpoint("g", "a")).action == "noop"  # idempotent
        frozen = [count(tmp_path / f"count-{i}") for i in range(2)]
        await asyncio.sleep(0.3)
        assert [count(tmp_path / f"count-{i}") for i in range(2)] == frozen
        assert all(stopped(w) for w in workers) and await backend.resident_jobs("g") == []
        assert (await backend.restore("g", "a")).action == "restore"
        assert (await backend.restore("g", "a")).action == "noop"
        assert all(counts_past(tmp_path / f"count-{i}", frozen[i]) for i in range(2))
    finally:
        for worker in workers:
            kill(worker)


async def test_registration_takes_the_pid_from_the_kernel(tmp_path: Path) -> None:
    table = ProcessTable()
    path = str(tmp_path / "agent.sock")
    server = await serve_agent_socket(path, table, credentials=known_jobs())
    register = (
        "import os, sys, pathlib, time; from timeshare.registration import register_process; "
        'pathlib.Path(sys.argv[2]).write_text(f\'{os.getpid()} {register_process("g", '
        '"job-a", sys.argv[1])}\'); time.sleep(30)'
    )
    said = tmp_path / "said"
    async with server:
        child = detached(sys.executable, "-c", register, path, str(said), env=token_env("job-a"))
        await wait_until_async(
            async_check(lambda: said.exists() and said.read_text()), "the child to register"
        )
        own_pid, registered = map(int, said.read_text().split())
        assert registered == own_pid == child  # the kernel's word
        assert table.jobs("g") == ["job-a"]
        on_behalf = functools.partial(register_process, "g", "job-a", path, token=token_of("job-a"))
        with pytest.raises(FailedPrecondition, match="init"):
            await asyncio.to_thread(on_behalf, 1)
        with pytest.raises(FailedPrecondition, match="agent"):
            await asyncio.to_thread(on_behalf, os.getpid())
        kill(child)


def test_a_process_belongs_to_one_job() -> None:
    table = ProcessTable()
    sleeper = detached(sys.executable, "-c", "import time; time.sleep(30)")
    try:
        table.register("g", "a", sleeper)
        with pytest.raises(RegistrationRefused, match="already"):
            table.register("g", "b", sleeper)
    finally:
        kill(sleeper)
    wait_until(lambda: table.jobs("g") == [], "the exited process to be reaped")
    assert table.jobs("g") == []  # an exited process is forgotten


def test_a_process_whose_exit_has_begun_is_not_alive(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A killed rank's sockets close before /proc shows it a zombie (measured:
    7 in 300 SIGKILLs of an 8-thread process read state R once its peer saw
    EOF); only the kernel's PF_EXITING flag tells it is on its way out."""
    monkeypatch.setattr(processes, "PROC", tmp_path)
    # proc(5): pid (comm) state ppid pgrp session tty_nr tpgid flags ...
    for pid, state, flags in ((1, "R", 0x400000), (2, "R", 0x400004), (3, "Z", 0x4)):
        (tmp_path / str(pid)).mkdir()
        (tmp_path / str(pid) / "stat").write_text(
            f"{pid} (python (rank 0)) {state} 1 {pid} {pid} 0 -1 {flags} 0 0 0\n"
        )
    assert [processes.alive(pid) for pid in (1, 2, 3, 4)] == [True, False, False, False]


async def test_a_newcomer_is_frozen_while_another_job_holds_the_node(tmp_path: Path) -> None:
    table = ProcessTable()
    backend = FreezeBackend(BackendConfig(node="n"))
    backend.attach(table)
    switches = SwitchActivities("n", backend, table)
    move = NodeMove(node="n", admit="a")
    await ActivityEnvironment().run(switches.switch, SwitchInput(group="g", epoch=1, move=move))
    newcomer = counter(tmp_path / "count")
    try:
        table.register("g", "b", newcomer)
        await wait_until_async(async_check(lambda: stopped(newcomer)), "the newcomer to stop")
    finally:
        kill(newcomer)


async def test_a_job_whose_processes_all_exited_is_reported_gone() -> None:
    table = ProcessTable()
    backend = FreezeBackend(BackendConfig(node="n"))
    backend.attach(table)
    switches = SwitchActivities("n", backend, table)
    worker = detached(sys.executable, "-c", "import time; time.sleep(30)")
    table.register("g", "a", worker)
    kill(worker)
    wait_until(lambda: table.gone("g", "a"), "the killed worker to be gone")
    move = NodeMove(node="n", admit="b", evict=["a"])
    output = await ActivityEnvironment().run(
        switches.switch, SwitchInput(group="g", epoch=2, move=move)
    )
    assert output.gone == ["a"]


async def test_stacked_backends_freeze_then_move_and_restore_in_reverse(tmp_path: Path) -> None:
    backend = load_backend("freeze+sim", BackendConfig(node="n", sim_state_bytes=0))
    assert backend.name == "freeze+sim"
    table = ProcessTable()
    backend.attach(table)
    worker = counter(tmp_path / "count")
    try:
        table.register("g", "a", worker)
        assert (await backend.restore("g", "a")).action == "restore"  # admitted on the sim
        assert await backend.resident_jobs("g") == ["a"]
        assert (await backend.checkpoint("g", "a")).action == "checkpoint"
        assert stopped(worker) and await backend.resident_jobs("g") == []
        assert (await backend.restore("g", "a")).action == "restore"
        assert not stopped(worker)
    finally:
        kill(worker)


@pytest.mark.parametrize("version", [2, 1])
async def test_a_job_in_its_own_cgroup_is_frozen_as_a_whole(tmp_path: Path, version: int) -> None:
    mounts = [h for h in hierarchies() if h.version == version]
    if not mounts or not os.access(mounts[0].mount, os.W_OK):
        pytest.skip(f"no writable cgroup v{version} freezer here (needs root)")
    cgroup = mounts[0].mount / f"timeshare-test-{os.getpid()}-{version}"
    cgroup.mkdir()
    table = ProcessTable()
    backend = FreezeBackend(BackendConfig(node="n"))
    backend.attach(table)
    worker = counter(tmp_path / "count")
    try:
        (cgroup / "cgroup.procs").write_text(str(worker))
        table.register("g", "a", worker)
        count(tmp_path / "count")  # counting before it is frozen
        assert (await backend.checkpoint("g", "a")).action == "checkpoint"
        assert own_cgroup([worker]) is not None and await backend.resident_jobs("g") == []
        frozen = count(tmp_path / "count")
        await asyncio.sleep(0.3)
        assert count(tmp_path / "count") == frozen
        assert (await backend.checkpoint("g", "a")).action == "noop"
        assert (await backend.restore("g", "a")).action == "restore"
        assert counts_past(tmp_path / "count", frozen)
    finally:
        frozen_cgroup = FreezerCgroup(mounts[0], cgroup)
        frozen_cgroup.request(False)  # a frozen process cannot die until thawed
        kill(worker)
        for _ in range(100):
            with contextlib.suppress(OSError):
                cgroup.rmdir()
                break
            await asyncio.sleep(0.05)


def test_only_root_or_the_owner_registers_another_process() -> None:
    sleeper = detached(sys.executable, "-c", "import time; time.sleep(30)")
    try:
        message = {"op": "register", "group": "g", "job": "a", "pid": sleeper}
        with pytest.raises(RegistrationRefused, match="root or the owner"):
            registration(message, peer_pid=12345, peer_uid=owner(sleeper) + 1000)
        assert registration(message, peer_pid=12345, peer_uid=0) == ("g", "a", sleeper)
        claimed = {"op": "register", "group": "g", "job": "a"}
        assert registration(claimed, peer_pid=12345, peer_uid=1000)[2] == 12345
    finally:
        kill(sleeper)
