"""acquire_all: a job holding two groups at once (a trainer pool and a sampler
pool during weight sync) cannot deadlock with others doing the same, however
each lists its groups. Three jobs, each a member of two groups, take 200
rounds of both-groups turns, each round listing the groups in a random
order, beside a fourth job that takes plain turns in one group. Each job has
nodes of its own (so turns need no switches after the first: the test is about
the order of acquisitions, and stays short), and the groups still grant one
turn at a time."""

from __future__ import annotations

import asyncio
import itertools
import random

import pytest

import timeshare.aio
from tests.conftest import SimNodes
from timeshare.errors import InvalidArgument
from timeshare.models import GroupPolicy

ROUNDS = 200


async def test_three_jobs_over_two_groups_never_deadlock(
    api: timeshare.aio.Client, sim_nodes: SimNodes, unique: str
) -> None:
    groups = [f"trainers-{unique}", f"samplers-{unique}"]
    nodes = [f"t-{unique}", f"s-{unique}"]
    for node in nodes:
        await sim_nodes.start(node, state_bytes=0)
    policy = GroupPolicy(ordering="fifo")
    members = {
        name: [
            await api.join(g, name, nodes=[n], policy=policy)
            for g, n in zip(groups, nodes, strict=True)
        ]
        for name in ("x", "y", "z")
    }
    solo = await api.join(groups[0], "solo", nodes=[nodes[0]])
    loop = asyncio.get_running_loop()
    held: dict[str, list[tuple[float, float, str]]] = {g: [] for g in groups}
    rounds = iter(range(ROUNDS))
    seeded = random.Random(7)

    async def both(name: str) -> None:
        for _ in rounds:
            jobs = members[name][:]
            seeded.shuffle(jobs)
            async with timeshare.aio.acquire_all(jobs, phase="weight_sync") as turns:
                start = loop.time()
                assert [t.phase for t in turns] == ["weight_sync", "weight_sync"]
                await asyncio.sleep(0.001)
                end = loop.time()
            for job in jobs:
                held[job.group].append((start, end, name))

    async def alone() -> None:
        for _ in range(30):
            async with solo.turn(phase="train"):
                start = loop.time()
                await asyncio.sleep(0.001)
                held[groups[0]].append((start, loop.time(), "solo"))

    await asyncio.wait_for(asyncio.gather(*(both(n) for n in members), alone()), 420)
    assert sum(len(h) for h in held.values()) == 2 * ROUNDS + 30
    for group, intervals in held.items():
        intervals.sort()
        for (_, end, first), (start, _, second) in itertools.pairwise(intervals):
            assert start >= end, f"{group}: {first} and {second} held it at once"


async def test_acquire_all_refuses_two_jobs_of_one_group(
    api: timeshare.aio.Client, sim_nodes: SimNodes, unique: str
) -> None:
    node = f"n-{unique}"
    await sim_nodes.start(node)
    a = await api.join(f"g-{unique}", "a", nodes=[node])
    b = await api.join(f"g-{unique}", "b", nodes=[node])
    with pytest.raises(InvalidArgument, match="one job per group"):
        async with timeshare.aio.acquire_all([a, b]):
            pass
    assert (await api.get_group(f"g-{unique}")).holder == ""
