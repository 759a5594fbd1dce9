"""Co-residency on the sim backend: a job that yields stays on the device,
locked, while the next job fits beside it; the least recently run job leaves
first when room is needed. Through the workflow (policy to agent) and at the
switch activity itself.

Here the tests that start no process; the others are in
tests/integration/test_co_residency.py."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from temporalio.testing import ActivityEnvironment

from bench.handover import switch_times
from timeshare.activities.backends.base import BackendConfig
from timeshare.activities.backends.sim import SimBackend
from timeshare.activities.switch import SwitchActivities
from timeshare.models import CoResidency, NodeMove, SwitchInput, SwitchOutput
from timeshare.node.room import extra, plan_room
from timeshare.testing import overlaps

STATE = 2**26


def sim_agent(room_for: int | None) -> tuple[SimBackend, SwitchActivities]:
    capacity = None if room_for is None else room_for * STATE
    config = BackendConfig(
        node="n", sim_state_bytes=STATE, sim_bandwidth_bytes_per_second=1e12,
        sim_capacity_bytes=capacity,
    )  # fmt: skip
    backend = SimBackend(config)
    return backend, SwitchActivities("n", backend)


async def admit(
    agent: SwitchActivities, job: str, epoch: int, co_residency: CoResidency = "auto"
) -> SwitchOutput:
    move = NodeMove(node="n", admit=job)
    given = SwitchInput(group="g", epoch=epoch, move=move, plan=epoch, co_residency=co_residency)
    return await ActivityEnvironment().run(agent.switch, given)


async def test_with_three_jobs_and_room_for_two_the_least_recently_run_leaves() -> None:
    backend, agent = sim_agent(room_for=2)
    await admit(agent, "a", 1)
    assert (await admit(agent, "b", 2)).co_resident == ["a"]
    third = await admit(agent, "c", 3)  # a ran longest ago
    assert third.co_resident == ["b"]
    assert [(x.job, x.action) for x in third.actions] == [
        ("b", "lock"), ("a", "checkpoint"), ("c", "restore")]  # fmt: skip
    await admit(agent, "b", 4)  # already on the device: an unlock, nothing leaves
    fifth = await admit(agent, "a", 5)  # c ran longest ago now
    assert [(x.job, x.action) for x in fifth.actions] == [
        ("b", "lock"), ("c", "checkpoint"), ("a", "restore")]  # fmt: skip
    assert overlaps(backend.events) == 0


async def test_policy_off_or_no_capacity_checkpoints_every_switch() -> None:
    cases: list[tuple[int | None, CoResidency]] = [(2, "off"), (None, "auto")]
    for room_for, policy in cases:
        backend, agent = sim_agent(room_for)
        await admit(agent, "a", 1, policy)
        second = await admit(agent, "b", 2, policy)
        assert [x.action for x in second.actions] == ["checkpoint", "restore"]
        assert second.co_resident == [] and backend.resident("g") == ["b"]


def test_room_is_made_least_recent_first_and_never_guessed() -> None:
    gpu = "gpu0"
    footprints = {"old": {gpu: 4}, "new": {gpu: 4}}
    assert plan_room({gpu: 4}, {gpu: 5}, ["old", "new"], footprints).evict == []
    assert plan_room({gpu: 8}, {gpu: 5}, ["old", "new"], footprints).evict == ["old"]
    assert plan_room({gpu: 20}, {gpu: 5}, ["old", "new"], footprints).evict == ["old", "new"]
    # A figure missing anywhere: everything leaves.
    assert plan_room(None, {gpu: 5}, ["old", "new"], footprints).evict == ["old", "new"]
    assert plan_room({gpu: 1}, None, ["old"], footprints).evict == ["old"]
    # A job partly on the device already needs only the rest.
    assert extra({gpu: 4}, {gpu: 1}) == {gpu: 3} and extra({gpu: 4}, None) is None
    # A victim of unknown size frees nothing to count on.
    unknown = {"old": None, "new": {gpu: 4}}
    assert plan_room({gpu: 8}, {gpu: 5}, ["old", "new"], unknown).evict == ["old", "new"]


async def test_an_agent_that_dies_mid_checkpoint_leaves_a_stopped_job_on_the_device(
    tmp_path: Path,
) -> None:
    config = BackendConfig(
        node="n", sim_state_bytes=STATE, sim_bandwidth_bytes_per_second=STATE / 30,
        sim_state_path=str(tmp_path / "gpu.json"), sim_record_path=str(tmp_path / "record"),
    )  # fmt: skip
    await SimBackend(config).restore("g", "a")
    dying = SimBackend(config)
    checkpoint = asyncio.create_task(dying.checkpoint("g", "a"))
    await asyncio.sleep(0.2)
    checkpoint.cancel()  # the agent died mid-checkpoint
    # The restarted agent copies fast: only the dying one had to be slow enough to cut off.
    restarted = SimBackend(config.model_copy(update={"sim_bandwidth_bytes_per_second": STATE * 20}))
    assert restarted.resident("g") == ["a"] and restarted.running("g") == []
    assert (await restarted.checkpoint("g", "a")).bytes == STATE  # the retry moves it
    record = [json.loads(line) for line in (tmp_path / "record").read_text().splitlines()]
    assert [e["event"] for e in record if e["job"] == "a"] == [
        "restore", "running", "checkpoint", "resident"]  # fmt: skip
    assert overlaps(record) == 0


@pytest.mark.parametrize(("state", "writes"), [(0, 1), (STATE, 2)])
async def test_a_move_with_an_in_between_is_written_at_its_start_too(
    tmp_path: Path, state: int, writes: int
) -> None:
    """A move that takes time writes the device's state as it begins (what a
    crash mid-move must find) and as it ends; one that takes none, only once
    (each write of the file on this machine's disk took 1.3 ms p50, 2.9 ms p90,
    on the agent's one event loop)."""
    config = BackendConfig(
        node="n", sim_state_bytes=state, sim_bandwidth_bytes_per_second=STATE * 100,
        sim_state_path=str(tmp_path / "gpu.json"),
    )  # fmt: skip
    sim = SimBackend(config)
    await sim.restore("g", "a")  # admitted: nothing to bring back
    saves: list[str] = []
    save = sim._save

    def counted() -> None:
        saves.append("save")
        save()

    sim._save = counted  # type: ignore[method-assign]
    await sim.checkpoint("g", "a")
    assert len(saves) == writes
    assert SimBackend(config).resident("g") == []  # what was written last is where it is
    await sim.restore("g", "a")
    assert len(saves) == 2 * writes
    assert SimBackend(config).running("g") == ["a"]


async def test_the_sim_switch_benchmark_times_each_switch_and_cleans_up(tmp_path: Path) -> None:
    times = await switch_times(tmp_path, 3)
    assert len(times) == 3 and all(ms > 0 for ms in times)
    assert list(tmp_path.iterdir()) == []
