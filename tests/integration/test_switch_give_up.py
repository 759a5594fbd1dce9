"""A switch that keeps failing ends in an answer, never in a silent wait:
on the GPU emulator, through the real cuda-bindings, with every
checkpoint failing as the fault rule `* checkpoint error 999` makes it
(CUDA_ERROR_UNKNOWN), the job waiting for the GPU is told why within the
group's give-up time, the job whose state could not be moved is evicted,
and its processes run again. The real scheduler and gateway; this test
process plays the node agent."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from temporalio.client import Client
from temporalio.runtime import MetricBuffer
from temporalio.worker import Worker

import timeshare
import timeshare.aio
from tests.conftest import SimNodes
from tests.groups import acquire, metered_group, yield_turn
from tests.polling import wait_until_async
from timeshare.activities.backends.base import BackendConfig
from timeshare.activities.backends.cuda_driver import CudaDriverBackend
from timeshare.activities.backends.processes import ProcessTable
from timeshare.activities.switch import SwitchActivities
from timeshare.gpu_check import emulator
from timeshare.gpu_check.emulator import CHECKPOINTED, RUNNING
from timeshare.gpu_check.emulator.rig import CudaWorker, Emulator, nvml_device_memory, start_worker
from timeshare.models import GroupPolicy
from timeshare.names import node_task_queue
from timeshare.scheduling import events as ev
from timeshare.workflows.group import GroupWorkflow

MiB = 2**20
GIVE_UP_SECONDS = 3.0
CUDA_ERROR_UNKNOWN = 999


@pytest.fixture
def nvml(gpu_emulator: Emulator, monkeypatch: pytest.MonkeyPatch) -> None:
    """The backend reads NVML (through the real pynvml, in a child process)."""
    monkeypatch.setattr(
        "timeshare.activities.backends.checkpointing.device_memory",
        lambda: nvml_device_memory(gpu_emulator.env),
    )


@pytest.fixture
def ranks(gpu_emulator: Emulator) -> Iterator[list[CudaWorker]]:
    started: list[CudaWorker] = []
    yield started
    emulator.clear_faults(gpu_emulator.state_dir)
    for worker in started:
        worker.kill()


@pytest.fixture
async def agent(
    client: Client, scheduler: Worker, gpu_emulator: Emulator, nvml: None
) -> AsyncIterator[tuple[str, ProcessTable]]:
    node = f"give-up-{uuid.uuid4().hex[:6]}"
    table = ProcessTable()
    config = BackendConfig(node=node, lock_timeout_seconds=2.0, call_timeout_seconds=10.0)
    backend = CudaDriverBackend(config, gpu_emulator.driver)
    backend.attach(table)
    activities = SwitchActivities(node, backend, table)
    async with Worker(
        client,
        task_queue=node_task_queue(node),
        activities=[activities.switch, activities.release],
    ):
        yield node, table


async def test_a_switch_whose_checkpoints_keep_failing_ends_in_an_answer_naming_its_cause(
    api: timeshare.aio.Client,
    agent: tuple[str, ProcessTable],
    gpu_emulator: Emulator,
    ranks: list[CudaWorker],
    tmp_path: Path,
) -> None:
    emu, (node, table) = gpu_emulator, agent
    group = f"give-up-{uuid.uuid4().hex[:6]}"
    policy = GroupPolicy(co_residency="off", prefetch="off", switch_give_up_seconds=GIVE_UP_SECONDS)
    jobs = {name: await api.join(group, name, nodes=[node], policy=policy) for name in ("a", "b")}
    for name in jobs:
        rank = start_worker(emu.env, tmp_path, f"{group}-{name}", nbytes=8 * MiB)
        ranks.append(rank)
        table.register(group, name, rank.pid)
    rank_a, rank_b = ranks

    # a's turn moves b's state off the GPU; then every checkpoint fails.
    await jobs["a"].acquire()
    assert emu.state(rank_b.pid) == (0, CHECKPOINTED)
    await jobs["a"].yield_()
    emulator.add_fault(emu.state_dir, "*", "checkpoint", "error", CUDA_ERROR_UNKNOWN)

    waiting = asyncio.ensure_future(jobs["b"].acquire())
    await wait_until_async(
        lambda: _failing(api, group), "the group to show its switch failing", seconds=60
    )
    with pytest.raises(timeshare.SwitchFailed) as failed:
        await asyncio.wait_for(waiting, 120)
    # The answer names the job whose state could not be moved, and the cause.
    assert failed.value.job == "a"
    assert "CUDA_ERROR_UNKNOWN" in failed.value.cause
    assert "CUDA_ERROR_UNKNOWN" in str(failed.value)

    status = await api.get_group(group)
    assert [j.job for j in status.jobs] == ["b"], "a, whose state could not move, was evicted"
    assert status.state != "degraded" and status.degraded_cause == ""
    # a's processes run again (unlocked, never killed); b's state is still parked.
    await wait_until_async(
        lambda: _state_is(emu, rank_a.pid, RUNNING), "a's rank to run again", seconds=30
    )
    rank_a.advancing()
    with pytest.raises(timeshare.Aborted, match="evicted"):
        await jobs["a"].acquire()


async def _failing(api: timeshare.aio.Client, group: str) -> bool:
    status = await api.get_group(group)
    cause = status.degraded_cause
    return (
        cause.startswith("switch failing: ")
        and "CUDA_ERROR_UNKNOWN" in cause
        and ("(attempt " in cause)
    )


async def _state_is(emu: Emulator, pid: int, state: int) -> bool:
    return emu.state(pid) == (0, state)


async def test_a_failing_switch_shows_its_cause_and_attempts_in_a_metric(
    client: Client, sim_nodes: SimNodes, unique: str
) -> None:
    """`timeshare.switch.failing`: the scheduler's gauge of a failing switch,
    by cause, back to 0 once the switch stops failing. Read from the metrics of
    a scheduler worker of this test's own (its own task queue)."""
    buffer = MetricBuffer(10_000)
    node, group, queue = f"n-{unique}", f"metered-{unique}", f"scheduler-{unique}"
    backend = await sim_nodes.start(node)
    policy = GroupPolicy(prefetch="off", switch_give_up_seconds=GIVE_UP_SECONDS)
    async with metered_group(client, buffer, group, policy, queue) as handle:
        for job in ("a", "b"):
            await handle.execute_update(
                GroupWorkflow.join, ev.Join(job=job, nodes=[node], token_hash=f"hash-{job}")
            )
        grant = await acquire(handle, "a")
        await yield_turn(handle, "a", grant.epoch)
        backend.inject_failure("checkpoint", "a", 1000)
        # a, whose state cannot leave, is evicted (its state left where it
        # is: the simulated GPU has room for b beside it), and b goes on.
        assert (await acquire(handle, "b")).job == "b"
        status = await handle.query(GroupWorkflow.status)
        assert [job.job for job in status.jobs] == ["b"] and status.evictions == 1
    points = [
        (update.value, dict(update.attributes))
        for update in buffer.retrieve_updates()
        if update.metric.name == "timeshare.switch.failing"
    ]
    causes = {str(attributes["cause"]) for _, attributes in points}
    assert len(causes) == 1 and "simulated checkpoint failure" in causes.pop()
    attempts = [value for value, attributes in points if attributes["group"] == group]
    assert attempts[0] == 1 and max(attempts) >= 2 and attempts[-1] == 0, attempts
