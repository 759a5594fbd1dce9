"""The scheduler heals itself: leases, failed switches, silent agents, turn
limits, operator controls and continue-as-new, on a real dev server."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import sys
from collections.abc import AsyncIterator, Awaitable
from pathlib import Path

import pytest
from temporalio.client import (
    Client,
    WorkflowUpdateFailedError,
    WorkflowUpdateRPCTimeoutOrCancelledError,
)
from temporalio.worker import Worker

from tests.conftest import SimNodes
from tests.credentials import known_jobs, token_of
from tests.groups import (
    Handle,
    acquire,
    eventually,
    group_on_one_node,
    heartbeat,
    join,
    refusal_type,
    yield_turn,
)
from tests.integration.test_replay import record, replayer
from tests.processes import detached, kill
from timeshare.activities.backends.base import BackendConfig
from timeshare.activities.backends.hook_registry import HookRegistry
from timeshare.activities.backends.loading import load_backend
from timeshare.activities.backends.processes import ProcessTable
from timeshare.activities.switch import SwitchActivities
from timeshare.hooks import WorkloadHooks, serve_hooks
from timeshare.hooks.protocol import EvictMode
from timeshare.models import GroupPolicy
from timeshare.names import node_task_queue
from timeshare.scheduling import events as ev
from timeshare.workers.agent.registration_socket import serve_agent_socket
from timeshare.workflows.group import GroupWorkflow


@contextlib.asynccontextmanager
async def heartbeating(handle: Handle, job: str) -> AsyncIterator[None]:
    async def beat() -> None:
        while True:
            await heartbeat(handle, job)
            await asyncio.sleep(0.3)

    task = asyncio.create_task(beat())
    try:
        yield
    finally:
        task.cancel()
        # A cancel that lands mid-update surfaces as the SDK's own error.
        with contextlib.suppress(asyncio.CancelledError, WorkflowUpdateRPCTimeoutOrCancelledError):
            await task


async def refused(call: Awaitable[object]) -> str | None:
    with pytest.raises(WorkflowUpdateFailedError) as failure:
        await call
    return refusal_type(failure.value)


async def test_a_silent_holder_is_evicted_and_told_why(
    client: Client, sim_nodes: SimNodes, unique: str
) -> None:
    policy = GroupPolicy(lease_seconds=2)
    handle, backend = await group_on_one_node(client, sim_nodes, unique, policy=policy)
    first = await acquire(handle, "a")
    async with heartbeating(handle, "b"):
        second = await acquire(handle, "b")  # a sends nothing: its lease runs out
    assert second.epoch == first.epoch + 1
    assert await refused(yield_turn(handle, "a", first.epoch)) == "ABORTED"
    status = await handle.query(GroupWorkflow.status)
    assert [j.job for j in status.jobs] == ["b"] and status.evictions == 1
    assert not [e for e in backend.events if e["event"] == "overlap"]


async def test_a_restore_that_keeps_failing_aborts_that_acquire_only(
    client: Client, sim_nodes: SimNodes, unique: str
) -> None:
    handle, backend = await group_on_one_node(client, sim_nodes, unique, jobs=("a", "b", "c"))
    first = await acquire(handle, "a")
    backend.inject_failure("restore", "b", times=100)
    waiting_b = asyncio.create_task(acquire(handle, "b"))
    await eventually(handle, lambda s: s.queue == ["b"])
    waiting_c = asyncio.create_task(acquire(handle, "c"))
    await eventually(handle, lambda s: s.queue == ["b", "c"])
    await yield_turn(handle, "a", first.epoch)
    assert await refused(waiting_b) == "ABORTED"
    granted_c = await waiting_c
    assert granted_c.job == "c"
    assert backend.resident(f"g-{unique}") == ["c"]


async def test_a_silent_agent_degrades_the_group_until_it_returns(
    client: Client, sim_nodes: SimNodes, unique: str
) -> None:
    node = f"n-{unique}"
    handle = await join(client, f"g-{unique}", "a", [node], GroupPolicy(agent_timeout_seconds=1))
    waiting = asyncio.create_task(acquire(handle, "a"))
    status = await eventually(handle, lambda s: s.state == "degraded")
    assert node in status.degraded_cause and "did not answer" in status.degraded_cause
    assert not waiting.done()
    await sim_nodes.start(node)
    grant = await asyncio.wait_for(waiting, 60)
    assert grant.epoch == 1
    assert (await handle.query(GroupWorkflow.status)).state == "held"


async def test_an_over_long_turn_is_preempted_and_resumed(
    client: Client, sim_nodes: SimNodes, unique: str
) -> None:
    # The grace is long enough for the heartbeat below to land within it on
    # a loaded machine: after it, a is preempted and no longer asked to yield.
    policy = GroupPolicy(max_turn_seconds=0.5, preempt_grace_seconds=3.0)
    handle, backend = await group_on_one_node(client, sim_nodes, unique, policy=policy)
    first = await acquire(handle, "a")
    waiting = asyncio.create_task(acquire(handle, "b"))
    await eventually(handle, lambda s: s.queue == ["b"])
    await asyncio.sleep(0.6)
    assert (await heartbeat(handle, "a")).should_yield
    second = await waiting  # a ignored the hint and was preempted
    beat = await heartbeat(handle, "a")
    assert beat.preempted and beat.holding and beat.epoch == first.epoch
    await yield_turn(handle, "b", second.epoch)
    status = await eventually(handle, lambda s: s.holder == "a")
    assert status.preemptions == 1
    await yield_turn(handle, "a", first.epoch)  # a yields the epoch it was given
    # Nobody holds or waits (b's state may be coming back ahead of its next ask).
    status = await handle.query(GroupWorkflow.status)
    assert status.holder == "" and status.queue == []
    assert not [e for e in backend.events if e["event"] == "overlap"]


async def test_pause_holds_new_turns_until_resumed(
    client: Client, sim_nodes: SimNodes, unique: str
) -> None:
    handle, _ = await group_on_one_node(client, sim_nodes, unique, jobs=("a",))
    paused = await handle.execute_update(GroupWorkflow.pause, ev.Pause(paused=True))
    assert paused.state == "paused"
    waiting = asyncio.create_task(acquire(handle, "a"))
    await eventually(handle, lambda s: s.queue == ["a"])
    assert not waiting.done()
    await handle.execute_update(GroupWorkflow.pause, ev.Pause(paused=False))
    assert (await waiting).job == "a"


async def test_a_drained_node_is_passed_over_until_undrained(
    client: Client, sim_nodes: SimNodes, unique: str
) -> None:
    group = f"g-{unique}"
    for node in ("n1", "n2"):
        await sim_nodes.start(f"{node}-{unique}")
    x = await join(client, group, "x", [f"n1-{unique}"])
    await join(client, group, "y", [f"n2-{unique}"])
    drain = ev.Drain(node=f"n1-{unique}", drained=True)
    await x.execute_update(GroupWorkflow.drain, drain)
    waiting_x = asyncio.create_task(acquire(x, "x"))
    await eventually(x, lambda s: s.queue == ["x"])
    granted_y = await acquire(x, "y")  # arrived later, but x needs a drained node
    assert granted_y.job == "y" and not waiting_x.done()
    await yield_turn(x, "y", granted_y.epoch)
    await x.execute_update(GroupWorkflow.drain, dataclasses.replace(drain, drained=False))
    assert (await waiting_x).job == "x"


async def test_an_operator_eviction_aborts_the_waiting_acquire(
    client: Client, sim_nodes: SimNodes, unique: str
) -> None:
    handle, _ = await group_on_one_node(client, sim_nodes, unique)
    await acquire(handle, "a")
    waiting = asyncio.create_task(acquire(handle, "b"))
    await eventually(handle, lambda s: s.queue == ["b"])
    message = ev.Evict(job="b", reason="maintenance")
    assert await handle.execute_update(GroupWorkflow.evict, message)
    assert not await handle.execute_update(GroupWorkflow.evict, message)  # idempotent
    with pytest.raises(WorkflowUpdateFailedError) as failure:
        await waiting
    assert refusal_type(failure.value) == "ABORTED"
    assert "maintenance" in str(failure.value.cause)


async def test_continue_as_new_loses_no_acquire_in_100_handovers(
    client: Client, sim_nodes: SimNodes, unique: str
) -> None:
    jobs = ("a", "b", "c")
    policy = GroupPolicy(continue_as_new_every=4, ordering="fifo")
    handle, backend = await group_on_one_node(client, sim_nodes, unique, jobs, policy)
    backend.state_bytes = 0
    turns_each = 34  # 102 turns in all, over 25 runs
    grants = []

    async def cycle(job: str) -> None:
        for _ in range(turns_each):
            grant = await acquire(handle, job)
            grants.append(grant)
            await yield_turn(handle, job, grant.epoch)

    await asyncio.wait_for(asyncio.gather(*(cycle(job) for job in jobs)), 240)
    epochs = sorted(g.epoch for g in grants)
    assert epochs == list(range(1, len(jobs) * turns_each + 1))  # none lost, none twice
    by_epoch = sorted(grants, key=lambda g: g.epoch)
    tickets = [g.ticket for g in by_epoch]
    assert tickets == sorted(tickets)
    status = await handle.query(GroupWorkflow.status)
    assert status.runs > 20 and status.grants == len(grants)
    assert not [e for e in backend.events if e["event"] == "overlap"]


async def test_a_job_whose_processes_exited_is_dropped(
    client: Client, sim_nodes: SimNodes, unique: str
) -> None:
    node, group = f"n-{unique}", f"g-{unique}"
    table = ProcessTable()
    await sim_nodes.start(node, processes=table)
    handle = await join(client, group, "a", [node])
    await join(client, group, "b", [node])
    worker = detached(sys.executable, "-c", "import time; time.sleep(60)")
    table.register(group, "a", worker)
    first = await acquire(handle, "a")
    await yield_turn(handle, "a", first.epoch)
    kill(worker)  # job a's only process dies
    await acquire(handle, "b")  # the switch finds a's processes gone
    status = await eventually(handle, lambda s: [j.job for j in s.jobs] == ["b"])
    assert status.evictions == 1
    with pytest.raises(WorkflowUpdateFailedError) as refused:
        await heartbeat(handle, "a")
    assert "exited" in str(refused.value.cause)


async def test_a_leaving_job_whose_other_agent_is_gone_waits_for_a_drain(
    client: Client, sim_nodes: SimNodes, unique: str
) -> None:
    group, n1, n2 = f"g-{unique}", f"n1-{unique}", f"n2-{unique}"
    policy = GroupPolicy(agent_timeout_seconds=1)
    backends = {node: await sim_nodes.start(node) for node in (n1, n2)}
    a = await join(client, group, "a", [n1, n2], policy)
    b = await join(client, group, "b", [n2])
    first = await acquire(a, "a")
    await sim_nodes.stop_node(n1)
    waiting = asyncio.create_task(acquire(b, "b"))
    await eventually(a, lambda s: s.queue == ["b"])
    await yield_turn(a, "a", first.epoch)
    status = await eventually(a, lambda s: s.state == "degraded")
    assert n1 in status.degraded_cause and not waiting.done()
    await a.execute_update(GroupWorkflow.drain, ev.Drain(node=n1, drained=True))
    granted = await asyncio.wait_for(waiting, 60)
    assert granted.job == "b"
    assert backends[n2].running(group) == ["b"] and backends[n1].resident(group) == ["a"]


class AlwaysFailing(WorkloadHooks):
    """A job's own hooks, broken: its state can never be put away by them."""

    def __init__(self) -> None:
        self.evictions = 0

    def evict(self, mode: EvictMode) -> None:
        self.evictions += 1
        raise RuntimeError("the engine will not sleep")

    def admit(self) -> None:
        pass


@contextlib.asynccontextmanager
async def hooked_node(
    client: Client, group: str, node: str, tmp_path: Path
) -> AsyncIterator[tuple[str, SwitchActivities]]:
    """A node agent with backend app+sim (hooks first, then the simulated GPU),
    its socket at the path yielded: a job's hooks are called on every switch."""
    config = BackendConfig(
        node=node, sim_state_bytes=2**20, sim_bandwidth_bytes_per_second=1e10,
        hook_timeout_seconds=2.0,
    )  # fmt: skip
    backend = load_backend("app+sim", config)
    processes, hooks = ProcessTable(), HookRegistry()
    backend.attach(processes)
    backend.attach_hooks(hooks)
    agent = SwitchActivities(node, backend, processes)
    path = str(tmp_path / "agent.sock")
    async with await serve_agent_socket(path, processes, hooks, credentials=known_jobs(group)):
        worker = Worker(
            client, task_queue=node_task_queue(node), activities=[agent.switch, agent.release]
        )
        async with worker:
            yield path, agent
        hooks.close_all()


async def test_a_job_whose_hook_always_fails_is_evicted_and_the_others_go_on(
    client: Client, scheduler: Worker, tmp_path: Path, unique: str
) -> None:
    group, node = f"g-{unique}", f"n-{unique}"
    async with hooked_node(client, group, node, tmp_path) as (path, _):
        for job in ("bad", "a", "b"):
            handle = await join(client, group, job, [node])
        hooks = AlwaysFailing()
        served = await asyncio.to_thread(
            serve_hooks, hooks, group, "bad", path, register=False, token=token_of("bad")
        )
        try:
            first = await acquire(handle, "bad")
            await yield_turn(handle, "bad", first.epoch)
            # The switch must put bad's state away, and its hook raises every
            # time: after the switch activity's retries, bad is evicted, and a
            # gets its turn (before, the group waited for as long as it failed).
            granted = await acquire(handle, "a", timeout=45)
            assert hooks.evictions >= 3
            status = await handle.query(GroupWorkflow.status)
            assert [j.job for j in status.jobs] == ["a", "b"] and status.evictions == 1
            with pytest.raises(WorkflowUpdateFailedError) as refused:
                await heartbeat(handle, "bad")
            assert refusal_type(refused.value) == "ABORTED"
            said = str(refused.value.cause)
            assert "its workload hooks failed" in said and "the engine will not sleep" in said

            # The rest of the group keeps taking turns, and bad's hooks are
            # not called again: they cannot fail another switch.
            calls = hooks.evictions
            epochs = [granted.epoch]
            await yield_turn(handle, "a", granted.epoch)
            for job in ("b", "a", "b"):
                turn = await acquire(handle, job, timeout=45)
                epochs.append(turn.epoch)
                await yield_turn(handle, job, turn.epoch)
            assert epochs == sorted(epochs) and len(set(epochs)) == 4
            assert hooks.evictions == calls
        finally:
            await asyncio.to_thread(served.close)
    # The patched path is deterministic: its history replays (and is kept in
    # tests/histories/ with TIMESHARE_RECORD_HISTORIES=1, for later changes).
    history = await handle.fetch_history()
    await handle.terminate()
    await replayer().replay_workflow(history)
    record(history, "group-hook-eviction")
