"""A job's processes after the job is gone from its group: whether it left, was
evicted by an operator, or fell silent (its coordinator exited and its lease
ran out), the agents of its nodes release its processes: thawed, restored where
they fit, never left stopped without an owner, so that a worker can at least be
stopped with SIGTERM. And a job whose CUDA state FAILED is evicted with the
reason. (This test process plays the node agent, on the real Temporal.)"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from temporalio.client import Client, WorkflowUpdateFailedError
from temporalio.worker import Worker

from tests.conftest import REPO, SimNodes
from tests.credentials import known_jobs
from tests.groups import acquire, eventually, group_on_one_node, heartbeat, join, yield_turn
from tests.polling import async_check, wait_until_async
from tests.processes import detached, kill
from timeshare.activities.backends.base import Backend, BackendConfig, Released
from timeshare.activities.backends.cuda_driver import CudaDriverBackend
from timeshare.activities.backends.freeze import FreezeBackend
from timeshare.activities.backends.processes import ProcessTable, RegistrationRefused, stopped
from timeshare.activities.backends.stacked import StackedBackend
from timeshare.activities.switch import SwitchActivities, release_summary
from timeshare.gpu_check.emulator.rig import CudaWorker, Emulator, nvml_device_memory, start_worker
from timeshare.models import GroupPolicy
from timeshare.names import node_task_queue
from timeshare.scheduling import events as ev
from timeshare.workers.agent.registration_socket import forgotten, serve_agent_socket
from timeshare.workflows.group import GroupWorkflow

COUNTER = (
    "import sys, time\n"
    "n = 0\n"
    "while True:\n"
    "    n += 1\n"
    "    open(sys.argv[1], 'w').write(str(n))\n"
    "    time.sleep(0.01)\n"
)


@contextlib.asynccontextmanager
async def node_agent(
    client: Client, node: str, backend: Backend, table: ProcessTable
) -> AsyncIterator[SwitchActivities]:
    backend.attach(table)
    agent = SwitchActivities(node, backend, table)
    worker = Worker(
        client, task_queue=node_task_queue(node), activities=[agent.switch, agent.release]
    )
    async with worker:
        yield agent


async def keep_alive(handle: object, job: str, stop: asyncio.Event) -> None:
    while not stop.is_set():
        with contextlib.suppress(Exception):
            await heartbeat(handle, job)  # type: ignore[arg-type]
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), 0.5)


@pytest.mark.parametrize("how", ["leave", "evict", "lease"])
async def test_a_frozen_worker_of_a_job_that_is_gone_runs_again_and_can_be_stopped(
    client: Client, scheduler: Worker, unique: str, tmp_path: Path, how: str
) -> None:
    group, node = f"g-{unique}", f"n-{unique}"
    table = ProcessTable()
    lease = 3.0 if how == "lease" else 60.0
    policy = GroupPolicy(lease_seconds=lease, idle_lease_seconds=lease)
    worker = detached(sys.executable, "-c", COUNTER, str(tmp_path / "count"))
    stop = asyncio.Event()
    try:
        async with node_agent(client, node, FreezeBackend(BackendConfig(node=node)), table):
            handle = await join(client, group, "a", [node], policy)
            await join(client, group, "b", [node], policy)
            table.register(group, "a", worker)
            first = await acquire(handle, "a")
            await yield_turn(handle, "a", first.epoch)
            keeping = asyncio.create_task(keep_alive(handle, "b", stop))
            await acquire(handle, "b")  # a's worker is frozen for b's turn
            assert stopped(worker)
            if how == "leave":
                await handle.execute_update(
                    GroupWorkflow.leave, ev.Leave(job="a", token_hash="hash-a")
                )
            elif how == "evict":
                await handle.execute_update(
                    GroupWorkflow.evict, ev.Evict(job="a", reason="operator")
                )
            # "lease": a's coordinator has gone quiet; its lease runs out.
            await eventually(handle, lambda s: [j.job for j in s.jobs] == ["b"])
            await wait_until_async(
                async_check(lambda: not stopped(worker)), "a's worker to run again"
            )
            os.kill(worker, signal.SIGTERM)
            await wait_until_async(
                async_check(lambda: not Path(f"/proc/{worker}/stat").exists()
                            or Path(f"/proc/{worker}/stat").read_text().split(")")[1].split()[0]
                            in ("Z", "X")),
                "a's worker to exit on SIGTERM",
            )  # fmt: skip
            # And a later switch of the group leaves what is left of it alone.
            assert table.released(group, "a") or not table.processes(group, "a")
            stop.set()
            await keeping
    finally:
        stop.set()
        kill(worker)


async def test_released_cuda_processes_come_back_where_they_fit_and_are_never_left_stopped(
    gpu_emulator: Emulator, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    emu, table = gpu_emulator, ProcessTable()
    config = BackendConfig(node="n", call_timeout_seconds=30, co_residency_margin_bytes=0)
    backend = CudaDriverBackend(config, emu.driver)
    stack = StackedBackend([FreezeBackend(config), backend])
    stack.attach(table)
    agent = SwitchActivities("n", stack, table)
    free: dict[str, int | None] = {"bytes": None}

    def memory() -> dict[str, object]:
        found = nvml_device_memory(emu.env)
        if free["bytes"] is not None:
            found["gpu0"] = found["gpu0"].model_copy(update={"free_bytes": free["bytes"]})
        return found  # type: ignore[return-value]

    monkeypatch.setattr("timeshare.activities.backends.checkpointing.device_memory", memory)
    workers: list[CudaWorker] = []
    try:
        for job in ("a", "b"):
            worker = start_worker(emu.env, tmp_path, job, nbytes=16 * 2**20, children=1)
            workers.append(worker)
            table.register("g", job, worker.pid)
            assert (await stack.checkpoint("g", job)).action == "checkpoint"
            assert stopped(worker.pid) and all(stopped(c) for c in worker.children)
        # Room on the device: a comes back and runs.
        released = await agent.release_job("g", "a")
        assert released.running == sorted([workers[0].pid, *workers[0].children])
        assert released.checkpointed == []
        await asyncio.to_thread(workers[0].advancing)
        # No room: b stays checkpointed, but none of its processes is stopped.
        free["bytes"] = 0
        released = await agent.release_job("g", "b")
        assert released.checkpointed == [workers[1].pid]
        assert "left checkpointed" in released.summary and "they may exit" in released.summary
        assert not any(stopped(pid) for pid in [workers[1].pid, *workers[1].children])
        # Released jobs are never frozen again here.
        assert (await stack.checkpoint("g", "b")).action == "noop"
        assert not stopped(workers[1].pid)
        workers[1].kill()
    finally:
        for worker in workers:
            worker.kill()


async def test_a_job_whose_state_failed_is_evicted_with_the_reason(
    client: Client, sim_nodes: SimNodes, unique: str
) -> None:
    handle, backend = await group_on_one_node(client, sim_nodes, unique)
    first = await acquire(handle, "a")
    await yield_turn(handle, "a", first.epoch)
    backend.inject_failure("checkpoint", "a", 1, terminal=True)
    granted = await acquire(handle, "b")  # a is evicted, b's switch goes on
    assert granted.job == "b"
    status = await handle.query(GroupWorkflow.status)
    assert [j.job for j in status.jobs] == ["b"] and status.evictions == 1
    with pytest.raises(WorkflowUpdateFailedError) as told:
        await heartbeat(handle, "a")
    assert "FAILED" in str(told.value.cause)
    await wait_until_async(
        async_check(lambda: backend.jobs.get((f"g-{unique}", "a")) is None),
        "the failed job's simulated state to be released",
    )


def test_release_summary_says_what_to_do() -> None:
    text = release_summary("g", "a", "n", Released(running=[1], checkpointed=[2], failed=[3]))
    assert "[1] run again" in text and "[2] left checkpointed" in text and "[3]" in text
    assert release_summary("g", "a", "n", Released()).endswith("no process left stopped")


async def test_forget_releases_a_jobs_processes_by_hand(tmp_path: Path) -> None:
    """`timeshare forget` on the node: for a job whose agent was down when it left."""
    table = ProcessTable()
    backend = FreezeBackend(BackendConfig(node="n"))
    backend.attach(table)
    agent = SwitchActivities("n", backend, table)
    path = str(tmp_path / "agent.sock")
    worker = detached(sys.executable, "-c", COUNTER, str(tmp_path / "count"))
    try:
        table.register("g", "a", worker)
        await backend.checkpoint("g", "a")
        assert stopped(worker)
        async with await serve_agent_socket(
            path, table, forget=agent.release_job, credentials=known_jobs()
        ):
            done = await asyncio.to_thread(
                subprocess.run,
                [sys.executable, "-m", "timeshare", "forget", "--group=g", "--job=a",
                 f"--socket={path}"],
                capture_output=True, text=True, timeout=120, cwd=REPO,
            )  # fmt: skip
            assert done.returncode == 0, done.stderr
            assert f"[{worker}] run again" in done.stdout
            assert not stopped(worker) and table.jobs("g") == []
            again = await asyncio.to_thread(
                subprocess.run,
                [sys.executable, "-m", "timeshare", "forget", "--group=g", "--job=a",
                 f"--socket={path}"],
                capture_output=True, text=True, timeout=120, cwd=REPO,
            )  # fmt: skip
            assert again.returncode == 1 and "no live process registered" in again.stderr
            bad = await asyncio.to_thread(
                subprocess.run,
                [sys.executable, "-m", "timeshare", "forget", "--group=Bad Name", "--job=a"],
                capture_output=True, text=True, timeout=120, cwd=REPO,
            )  # fmt: skip
            assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1
        table.register("g", "a", worker)
        with pytest.raises(RegistrationRefused, match="only root or the owner"):
            message = {"group": "g", "job": "a"}
            await forgotten(message, 4242, table, agent.release_job, known_jobs())
    finally:
        kill(worker)
