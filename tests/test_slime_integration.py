"""The Slime phase callback against a real scheduler and gateway (sim nodes):
Slime's phase sequences map to turns in the trainer and sampler groups, weight
sync holds both, two jobs whose spans name the groups in opposite orders never
deadlock, and the callback is a no-op without its environment. Slime has no
phase hook upstream (THUDM/slime's train.py calls no callback) and is not on
PyPI; the sequences replayed here are those llm-d's fork calls (see
timeshare/integrations/slime.py)."""

from __future__ import annotations

import asyncio
import threading

import pytest

import timeshare
from tests.conftest import SimNodes
from timeshare.integrations.slime import SAMPLER, TRAINER, RoleTurns, TimeshareCallback

# Slime's sync driver (train.py) as llm-d's fork brackets it, one rollout.
SYNC_STEP = [("generate", "sampler"), ("train", "trainer"), ("weight_sync", "both")]


def holders(client: timeshare.Client, *groups: str) -> list[str]:
    return [client.get_group(group).holder for group in groups]


def role_turns(client: timeshare.Client, job: str, trainer: str, sampler: str,
               nodes: dict[str, str]) -> RoleTurns:  # fmt: skip
    handles = {group: client.join(group, job, [nodes[group]]) for group in {trainer, sampler}}
    return RoleTurns({TRAINER: handles[trainer], SAMPLER: handles[sampler]})


@pytest.fixture
async def pools(sim_nodes: SimNodes, unique: str) -> dict[str, str]:
    """Two groups, each on a node of its own: group -> node."""
    nodes = {f"trainers-{unique}": f"nt-{unique}", f"samplers-{unique}": f"ns-{unique}"}
    for node in nodes.values():
        await sim_nodes.start(node)
    return nodes


async def test_phases_become_turns_and_weight_sync_holds_both(
    gateway: str, pools: dict[str, str]
) -> None:
    trainers, samplers = pools

    def scenario() -> None:
        with timeshare.connect(gateway) as client:
            callback = TimeshareCallback(role_turns(client, "job-a", trainers, samplers, pools))
            seen = []
            for phase, role in [("init", "both"), *SYNC_STEP, *SYNC_STEP]:
                callback.on_phase_begin(phase, role, {"rollout_id": 0})
                seen.append((phase, holders(client, trainers, samplers)))
                callback.on_phase_end(phase, role, {"rollout_id": 0})
                assert holders(client, trainers, samplers) == ["", ""], f"{phase} leaked a turn"
            callback.close()
        assert seen[:4] == [
            ("init", ["job-a", "job-a"]),
            ("generate", ["", "job-a"]),
            ("train", ["job-a", ""]),
            ("weight_sync", ["job-a", "job-a"]),
        ]

    await asyncio.to_thread(scenario)


async def test_a_trainer_request_while_holding_the_sampler_alone_is_refused(
    gateway: str, pools: dict[str, str]
) -> None:
    trainers, samplers = pools

    def scenario() -> None:
        with timeshare.connect(gateway) as client:
            turns = role_turns(client, "job-a", trainers, samplers, pools)
            turns.begin("offload", "sampler")
            with pytest.raises(RuntimeError, match="trainer-first"):
                turns.begin("train", "trainer")
            assert holders(client, trainers, samplers) == ["", "job-a"]
            turns.end("offload", "sampler")
            turns.close()

    await asyncio.to_thread(scenario)


async def test_spans_over_both_groups_in_opposite_orders_never_deadlock(
    gateway: str, pools: dict[str, str]
) -> None:
    # Job b's trainer pool is job a's sampler pool and the other way round: a
    # job that took its trainer group first would wait for the other's.
    first, second = pools
    rounds = 8
    errors: list[BaseException] = []

    def job(name: str, trainer: str, sampler: str, start: threading.Barrier) -> None:
        try:
            with timeshare.connect(gateway) as client:
                turns = role_turns(client, name, trainer, sampler, pools)
                start.wait()
                for _ in range(rounds):
                    turns.begin("weight_sync", "both")
                    turns.end("weight_sync", "both")
                    turns.begin("train", "trainer")
                    turns.end("train", "trainer")
                turns.close()
        except BaseException as error:  # reported by the test thread
            errors.append(error)

    def scenario() -> None:
        start = threading.Barrier(2)
        threads = [
            threading.Thread(target=job, args=("job-a", first, second, start)),
            threading.Thread(target=job, args=("job-b", second, first, start)),
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(120)
        assert not any(t.is_alive() for t in threads), "the two jobs deadlocked"
        assert not errors, errors

    await asyncio.to_thread(scenario)


async def test_llmd_environment_names_one_shared_pool(
    gateway: str, sim_nodes: SimNodes, unique: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    node, group = f"n-{unique}", f"pool-{unique}"
    await sim_nodes.start(node)
    # What a job spec written for llm-d's callback sets, with one pool for both roles.
    for variable, value in {
        "TIMESLICE_JOB_ID": "job-a", "TIMESLICE_ORCH_ADDR": gateway,
        "TIMESLICE_TRAINER_GROUP": group, "TIMESLICE_SAMPLER_GROUP": group,
        "TIMESHARE_NODES": node,
    }.items():  # fmt: skip
        monkeypatch.setenv(variable, value)

    def scenario() -> None:
        callback = TimeshareCallback()
        assert callback.turns is not None
        with timeshare.connect(gateway) as client:
            callback.on_phase_begin("weight_sync", "both")
            status = client.get_group(group)
            assert status.holder == "job-a" and status.grants == 1  # one turn covers both roles
            callback.on_phase_end("weight_sync", "both")
            callback.on_phase_begin("generate", "sampler")
            assert client.get_group(group).holder == "job-a"
            callback.on_phase_end("generate", "sampler")
            callback.close()
            assert client.get_group(group).jobs == []

    await asyncio.to_thread(scenario)


def test_without_its_environment_the_callback_does_nothing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for variable in ("TIMESHARE_JOB", "TIMESLICE_JOB_ID", "TIMESHARE_TRAINER_GROUP",
                     "TIMESLICE_TRAINER_GROUP", "TIMESHARE_SAMPLER_GROUP",
                     "TIMESLICE_SAMPLER_GROUP"):  # fmt: skip
        monkeypatch.delenv(variable, raising=False)
    # Nowhere to connect: any call that tried would fail.
    monkeypatch.setenv("TIMESHARE_ADDRESS", "127.0.0.1:1")
    callback = TimeshareCallback()
    assert callback.turns is None
    for phase, role in [("init", "both"), *SYNC_STEP]:
        callback.on_phase_begin(phase, role)
        callback.on_phase_end(phase, role)
    callback.close()
