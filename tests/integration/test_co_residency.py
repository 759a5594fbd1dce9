"""Co-residency on the sim backend: a job that yields stays on the device,
locked, while the next job fits beside it; the least recently run job leaves
first when room is needed. Through the workflow (policy to agent) and at the
switch activity itself.

Here the tests that start processes; the others are in
tests/unit/test_co_residency.py."""

from __future__ import annotations

from temporalio.client import Client

from tests.conftest import SimNodes
from tests.groups import acquire, join, yield_turn
from tests.unit.test_co_residency import STATE
from timeshare.activities.backends.sim import SimBackend
from timeshare.models import GroupPolicy
from timeshare.testing import overlaps

HANDOVERS = 20


async def take_turns(client: Client, sim_nodes: SimNodes, unique: str, room_for: int) -> SimBackend:
    """Jobs a and b hand the node over HANDOVERS times, with room for ``room_for`` jobs."""
    node = f"n-{unique}"
    backend = await sim_nodes.start(node, state_bytes=STATE, capacity_bytes=room_for * STATE)
    # No prefetch: after the last yield it would bring b back at its own pace,
    # an extra move that these tests, counting the hand-overs' own, might or
    # might not see (prefetch has tests of its own).
    policy = GroupPolicy(prefetch="off")
    handle = await join(client, f"g-{unique}", "a", [node], policy)
    await join(client, f"g-{unique}", "b", [node], policy)
    for turn in range(HANDOVERS + 1):
        job = "ab"[turn % 2]
        grant = await acquire(handle, job)
        await yield_turn(handle, job, grant.epoch)
    assert grant.epoch == HANDOVERS + 1
    assert overlaps(backend.events) == 0
    return backend


async def test_with_room_for_two_no_byte_moves(
    client: Client, sim_nodes: SimNodes, unique: str
) -> None:
    backend = await take_turns(client, sim_nodes, unique, room_for=2)
    events = [e["event"] for e in backend.events]
    assert "checkpoint" not in events
    assert sum(e.get("bytes", 0) for e in backend.events if e["event"] == "restore") == 0
    # Each job's first admission brings it in; every hand-over after costs a
    # lock and an unlock.
    assert events.count("restore") == 2 and events.count("unlock") == HANDOVERS - 1
    assert backend.resident(f"g-{unique}") == ["a", "b"]


async def test_with_room_for_one_every_switch_moves_the_previous_job(
    client: Client, sim_nodes: SimNodes, unique: str
) -> None:
    backend = await take_turns(client, sim_nodes, unique, room_for=1)
    checkpoints = [e for e in backend.events if e["event"] == "checkpoint"]
    assert [e["job"] for e in checkpoints] == ["ab"[turn % 2] for turn in range(HANDOVERS)]
    assert all(e["bytes"] == STATE for e in checkpoints)
    assert backend.resident(f"g-{unique}") == ["a"]
