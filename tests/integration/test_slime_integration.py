"""The Slime phase callback against a real scheduler and gateway (sim nodes),
driven by the call sites of llm-d's Slime fork (tests/slime_scripts.py): each
phase runs holding its role's groups, and two jobs running train.py's and
train_async.py's phase orders against each other never deadlock, whatever the
groups are named.

The callback without a scheduler: tests/unit/test_slime_integration.py."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest

import timeshare
from tests.conftest import SimNodes
from tests.slime_scripts import ARGUMENTS, SCRIPTS, SlimeArgs
from timeshare.integrations.slime import SAMPLER, TRAINER, RoleTurns, TimeshareCallback

ROUNDS = 50


# A deadlock shows as an acquire that is not granted in this long (each
# grant takes well under a second here).
ACQUIRE_TIMEOUT = 30.0


class Watching:
    """The callback, and after each begin: does the job hold the phase's groups?"""

    def __init__(self, turns: RoleTurns, client: timeshare.Client | None = None) -> None:
        self.callback = TimeshareCallback(turns)
        self.turns, self.client = turns, client
        self.seen: list[tuple[str, list[str]]] = []

    def on_phase_begin(self, phase: str, role: str, context: Any = None) -> None:
        self.callback.on_phase_begin(phase, role, context)
        assert self.turns.held(role), (phase, role)
        if self.client is not None:
            holders = [self.client.get_group(g).holder for g in self.turns.groups(role)]
            self.seen.append((phase, holders))

    def on_phase_end(self, phase: str, role: str, context: Any = None) -> None:
        self.callback.on_phase_end(phase, role, context)

    def close(self) -> None:
        self.callback.close()


def role_turns(
    client: timeshare.Client, job: str, trainer: str, sampler: str, nodes: dict[str, str]
) -> RoleTurns:
    handles = {group: client.join(group, job, nodes=[nodes[group]]) for group in {trainer, sampler}}
    return RoleTurns(
        {TRAINER: handles[trainer], SAMPLER: handles[sampler]}, acquire_timeout=ACQUIRE_TIMEOUT
    )


@pytest.fixture
async def pools(sim_nodes: SimNodes, unique: str) -> dict[str, str]:
    """Two groups named as llm-d's examples name them (the sampler pool's
    first by name), each on a node of its own: group -> node."""
    nodes = {f"trainers-{unique}": f"nt-{unique}", f"samplers-{unique}": f"ns-{unique}"}
    for node in nodes.values():
        await sim_nodes.start(node)
    return nodes


def run_jobs(
    gateway: str, jobs: dict[str, tuple[str, str, str]], nodes: dict[str, str], rounds: int
) -> None:
    """Run each job (name -> script, trainer group, sampler group) for
    ``rounds`` rollouts, all at once; fail on a deadlock (an acquire not
    granted in time) or any other error."""
    errors: list[BaseException] = []
    start = threading.Barrier(len(jobs))
    args = SlimeArgs(num_rollout=rounds)

    def job(name: str, script: str, trainer: str, sampler: str) -> None:
        try:
            with timeshare.connect(gateway) as client:
                turns = role_turns(client, name, trainer, sampler, nodes)
                start.wait()
                SCRIPTS[script](Watching(turns), args)
        except BaseException as error:  # reported by the test thread
            errors.append(error)

    threads = [threading.Thread(target=job, args=(name, *spec)) for name, spec in jobs.items()]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(rounds * 2 * ACQUIRE_TIMEOUT)
    assert not any(thread.is_alive() for thread in threads), "the jobs deadlocked"
    assert not errors, f"the jobs deadlocked or failed: {errors}"


@pytest.mark.parametrize("script", list(SCRIPTS))
async def test_each_phase_runs_holding_its_roles_groups(
    gateway: str, pools: dict[str, str], script: str
) -> None:
    trainers, samplers = pools

    def scenario() -> None:
        with timeshare.connect(gateway) as client:
            for args in ARGUMENTS[2::2]:  # release_train and eval; eval inside generate
                watching = Watching(role_turns(client, "job-a", trainers, samplers, pools), client)
                SCRIPTS[script](watching, args)
                assert all(holders == ["job-a"] * len(holders) for _, holders in watching.seen)
                status = [client.get_group(group) for group in (trainers, samplers)]
                assert [(s.holder, s.jobs) for s in status] == [("", [])] * 2  # closed: left

    await asyncio.to_thread(scenario)


async def test_an_eval_inside_a_pending_generate_keeps_the_sampler_pool(
    gateway: str, pools: dict[str, str]
) -> None:
    """train_async.py with weight updates every other rollout: an eval ends
    while the next generate still runs on the sampler pool."""
    trainers, samplers = pools

    def scenario() -> None:
        with timeshare.connect(gateway) as client:
            turns = role_turns(client, "job-a", trainers, samplers, pools)
            turns.begin("train", "trainer")
            turns.begin("generate", "sampler")  # inside train: both held
            assert turns.held("both")
            turns.end("train", "trainer")
            turns.begin("eval", "sampler")
            turns.end("eval", "sampler")
            assert client.get_group(samplers).holder == "job-a"  # generate still runs
            assert client.get_group(trainers).holder == ""
            turns.end("generate", "sampler")
            assert client.get_group(samplers).holder == ""
            turns.close()

    await asyncio.to_thread(scenario)


async def test_two_train_async_jobs_never_deadlock_over_fifty_rollouts(
    gateway: str, pools: dict[str, str]
) -> None:
    """llm-d's layout: both jobs share both pools. Without one order for the
    generate that train_async.py begins inside train, job a holds the trainer
    pool and waits for the sampler pool, which job b's weight sync took first
    (by name) while it waits for the trainer pool: each waits for ever."""
    trainers, samplers = pools
    jobs = {name: ("train_async.py", trainers, samplers) for name in ("job-a", "job-b")}
    await asyncio.to_thread(run_jobs, gateway, jobs, pools, ROUNDS)


async def test_train_py_against_train_async_and_swapped_pools_never_deadlock(
    gateway: str, sim_nodes: SimNodes, pools: dict[str, str], unique: str
) -> None:
    """At once, on two pairs of pools: a train.py job against a train_async.py
    job; and two train_async.py jobs whose pools swap roles (job d's trainer
    pool is job c's sampler pool), which no order by role could serve."""
    trainers, samplers = pools
    first, second = f"pool-a-{unique}", f"pool-b-{unique}"
    nodes = {**pools, first: f"na-{unique}", second: f"nb-{unique}"}
    for node in (nodes[first], nodes[second]):
        await sim_nodes.start(node)
    jobs = {
        "job-a": ("train_async.py", trainers, samplers),
        "job-b": ("train.py", trainers, samplers),
        "job-c": ("train_async.py", first, second),
        "job-d": ("train_async.py", second, first),
    }
    await asyncio.to_thread(run_jobs, gateway, jobs, nodes, ROUNDS // 5)


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
