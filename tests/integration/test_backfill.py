"""Backfill jobs through a real stack (gateway, scheduler, a simulated
node): a backfill job that ignores should_yield is preempted after its
group's grace (evicted, with the reason, where its node moves state only
through the job's own hooks), and the regular job that asked gets the GPU;
the synthetic backfill job gives its turn back at a step boundary. The core's
decisions are in tests/unit/test_backfill.py."""

from __future__ import annotations

import asyncio

import pytest
from temporalio.client import Client

import timeshare
import timeshare.aio
from tests.conftest import SimNodes
from tests.integration.test_gateway import queued
from tests.integration.test_replay import record, replayer
from tests.polling import wait_until_async
from timeshare.activities.backends.app import AppBackend
from timeshare.activities.backends.base import BackendConfig
from timeshare.errors import Aborted
from timeshare.models import GroupPolicy
from timeshare.names import group_workflow_id
from timeshare.scheduling.watch import MEMO_KEY, WatchRecord
from timeshare.synthetic import BACKFILL_PHASE, SyntheticJobSpec, run_synthetic_job
from timeshare.workflows.group import GroupWorkflow

# How long the regular job takes to ask again after its turn, in the test of
# switch-cost-aware admission.
ASK_GAP_SECONDS = 2.0


async def group_on_a_sim_node(sim_nodes: SimNodes, unique: str) -> tuple[str, str]:
    """A group's name and a sim node of its own, started."""
    group, node = f"g-{unique}", f"n-{unique}"
    await sim_nodes.start(node)
    return group, node


async def test_a_backfill_job_that_does_not_yield_is_preempted_and_the_regular_job_granted(
    api: timeshare.aio.Client, gateway: str, sim_nodes: SimNodes, unique: str
) -> None:
    group, node = await group_on_a_sim_node(sim_nodes, unique)
    policy = GroupPolicy(backfill_grace_seconds=1.0, co_residency="off")
    backfill = await api.join(group, "bf", nodes=[node], policy=policy, backfill=True)
    regular = await api.join(group, "a", nodes=[node])

    def join_from_the_blocking_client() -> dict[str, bool]:
        with timeshare.connect(gateway) as client:
            other = client.join(group, "bf-sync", nodes=[node], backfill=True)
            jobs = {j.job: j.backfill for j in client.get_group(group).jobs}
            other.leave()
            return jobs

    jobs = await asyncio.to_thread(join_from_the_blocking_client)
    assert jobs == {"a": False, "bf": True, "bf-sync": True}

    held = await backfill.acquire()
    assert not (await backfill.heartbeat()).should_yield
    asking = asyncio.create_task(regular.acquire())
    await queued(api, group, ["a"])

    async def asked_to_yield() -> bool:
        return (await backfill.heartbeat()).should_yield or asking.done()

    await wait_until_async(asked_to_yield, "the backfill holder to be asked to yield", every=0.05)
    # The backfill job goes on computing, never yielding: after the grace it
    # is preempted and the regular job holds the GPU, its state restored.
    granted = await asyncio.wait_for(asking, timeout=60)
    assert granted.epoch > held.epoch
    status = await api.get_group(group)
    assert status.holder == "a" and status.preemptions == 1
    assert {j.job: j.preempted for j in status.jobs} == {"a": False, "bf": True}
    assert sim_nodes.backends[node].resident(group) == ["a"]
    # The switch that preempted it says what its checkpoint took: what the
    # group weighs before it hands the GPU to a backfill job again.
    (handover,) = [s for s in (await api.group_history(group)).switches if s.admitted == "a"]
    assert list(handover.checkpoint_seconds) == ["bf"]
    await regular.yield_()
    await regular.leave()
    await backfill.leave()


async def test_a_backfill_job_moved_only_by_its_hooks_is_evicted_after_the_grace(
    api: timeshare.aio.Client, sim_nodes: SimNodes, unique: str
) -> None:
    group, node = f"g-{unique}", f"n-{unique}"
    await sim_nodes.start_backend(node, AppBackend(BackendConfig(node=node)))
    policy = GroupPolicy(backfill_grace_seconds=1.0)
    backfill = await api.join(group, "bf", nodes=[node], policy=policy, backfill=True)
    regular = await api.join(group, "a", nodes=[node])
    await backfill.acquire()
    granted = await asyncio.wait_for(regular.acquire(), timeout=60)
    status = await api.get_group(group)
    assert status.holder == "a" and granted.epoch > 0
    assert [j.job for j in status.jobs] == ["a"]
    # Its next call hears why.
    with pytest.raises(Aborted) as evicted:
        await backfill.heartbeat()
    assert "did not yield within 1 s" in str(evicted.value)
    await regular.yield_()
    await regular.leave()


async def test_the_synthetic_backfill_job_steps_aside_at_a_step_boundary(
    api: timeshare.aio.Client, gateway: str, sim_nodes: SimNodes, unique: str
) -> None:
    group, node = await group_on_a_sim_node(sim_nodes, unique)
    # A grace no run reaches: every turn the backfill job gives back is its own doing.
    policy = GroupPolicy(backfill_grace_seconds=600.0, co_residency="off")
    backfill = SyntheticJobSpec(
        group=group, job="bf", address=gateway, nodes=[node], policy=policy, backfill=True,
        iterations=80, step_seconds=0.05,
    )  # fmt: skip
    # The regular job asks for the GPU after the backfill job has it.
    regular = backfill.model_copy(update={
        "job": "a", "backfill": False, "iterations": 2, "sample_seconds": 0.2,
        "reward_seconds": 0.5, "train_seconds": 0.1, "start_delay_seconds": 1.0,
    })  # fmt: skip
    backfilled, ran = await asyncio.gather(
        asyncio.to_thread(run_synthetic_job, backfill),
        asyncio.to_thread(run_synthetic_job, regular),
    )
    assert len(ran.turns) >= 2 and {t.phase for t in ran.turns} == {"sample", "train"}
    # Each turn ends only at should_yield or after its last step: more than one
    # turn means it stepped aside for the regular job before it was done.
    assert len(backfilled.turns) >= 2
    assert {t.phase for t in backfilled.turns} == {BACKFILL_PHASE}
    assert [p.phase for p in backfilled.phases] == [BACKFILL_PHASE] * len(backfilled.turns)
    history = await api.group_history(group)
    assert [t.ended_by for t in history.turns if t.job == "bf"] == [""] * len(backfilled.turns)
    assert (await api.get_group(group)).preemptions == 0


async def test_a_backfill_job_waits_out_a_gap_shorter_than_its_switches_and_the_history_replays(
    api: timeshare.aio.Client, client: Client, sim_nodes: SimNodes, unique: str
) -> None:
    """Rules 4 on a real stack: the backfill job asks just as the regular job
    yields, into a gap its switches (an operator's 5 s each) would not pay
    for; it is granted only once the regular job's predicted request has
    passed unasked (the group's timer, not a message, looks again)."""
    group, node = await group_on_a_sim_node(sim_nodes, unique)
    policy = GroupPolicy(co_residency="off", prefetch="off", switch_cost_seconds=5.0)
    regular = await api.join(group, "a", nodes=[node], policy=policy)
    backfill = await api.join(group, "bf", nodes=[node], backfill=True)
    await regular.acquire()
    await regular.yield_()
    await asyncio.sleep(ASK_GAP_SECONDS)
    await regular.acquire()
    await regular.yield_()
    # a is expected to ask again ASK_GAP_SECONDS after this yield, sooner than
    # bf's way in and back (10 s): bf waits for that moment.
    await asyncio.wait_for(backfill.acquire(), timeout=60)
    turns = (await api.group_history(group)).turns
    (a_last,) = [t for t in turns if t.job == "a"][-1:]
    (bf_turn,) = [t for t in turns if t.job == "bf"]
    assert bf_turn.granted_at - a_last.released_at >= ASK_GAP_SECONDS / 2
    await backfill.yield_()
    await backfill.leave()
    await regular.leave()
    handle = client.get_workflow_handle_for(GroupWorkflow.run, group_workflow_id(group))
    history = await handle.fetch_history()
    await replayer().replay_workflow(history)
    record(history, "group-switch-costs")


async def test_the_group_publishes_its_backfill_waiters_and_when_it_will_ask_its_holder_to_yield(
    api: timeshare.aio.Client, client: Client, sim_nodes: SimNodes, unique: str
) -> None:
    """What the turn watches read (memo): how many waiters are backfill jobs,
    so that a regular holder keeps its turn unanswered; and the moment a
    backfill holder is to be asked to yield ahead of a predicted request."""
    group, node = await group_on_a_sim_node(sim_nodes, unique)
    policy = GroupPolicy(co_residency="off", prefetch="off", switch_cost_seconds=0.001)
    regular = await api.join(group, "a", nodes=[node], policy=policy)
    backfill = await api.join(group, "bf", nodes=[node], backfill=True)
    handle = client.get_workflow_handle(group_workflow_id(group))

    async def record() -> WatchRecord:
        description = await handle.describe()
        return await description.memo_value(MEMO_KEY, type_hint=WatchRecord)

    await regular.acquire()
    await regular.yield_()
    await backfill.acquire()  # nothing predicts a's next request yet
    await asyncio.sleep(ASK_GAP_SECONDS)
    asking = asyncio.create_task(regular.acquire())
    await queued(api, group, ["a"])
    await backfill.yield_()
    await asking  # a's gap between turns is measured
    waiting = asyncio.create_task(backfill.acquire())

    async def one_backfill_waiter() -> bool:
        return (await record()).backfill_waiting == 1

    await wait_until_async(one_backfill_waiter, "the group to publish its backfill waiter")
    await regular.yield_()
    turn = await waiting  # a's next request is predicted a gap away

    async def yield_moment_published() -> bool:
        return (await record()).yield_asked[0] == turn.epoch

    await wait_until_async(yield_moment_published, "the group to publish when bf is asked")
    published = await record()
    assert turn.granted_at < published.yield_asked[1]
    assert published.backfill_waiting == 0
    await backfill.yield_()
    await backfill.leave()
    await regular.leave()
