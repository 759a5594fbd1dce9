"""One switch at a time per GPU, whatever its group: two groups that claim
different GPUs of one node move their state at the same time (the sim
backend's record of each checkpoint). That two groups sharing a GPU switch one
after the other is tests/integration/test_checkpoint_backends.py's
test_switches_of_two_groups_on_one_node_never_overlap."""

from __future__ import annotations

import asyncio
from pathlib import Path

from temporalio.testing import ActivityEnvironment

from timeshare.activities.backends.base import BackendConfig
from timeshare.activities.backends.sim import SimBackend
from timeshare.activities.switch import SwitchActivities
from timeshare.models import NodeMove, SwitchInput

STATE = 2**26  # 64 MiB, moved at 256 MiB/s: a quarter of a second each way


def switch(group: str, gpus: list[int], admit: str, evict: list[str], plan: int) -> SwitchInput:
    return SwitchInput(
        group=group, epoch=plan, plan=plan, gpus=gpus,
        move=NodeMove(node="n", admit=admit, evict=evict),
    )  # fmt: skip


async def test_groups_on_other_gpus_of_a_node_switch_at_once(tmp_path: Path) -> None:
    first, second = [0], [1]
    config = BackendConfig(
        node="n", sim_gpus=2, sim_state_bytes=STATE, sim_bandwidth_bytes_per_second=STATE * 4,
        sim_state_path=str(tmp_path / "gpus.json"),
    )  # fmt: skip
    backend = SimBackend(config)
    agent = SwitchActivities("n", backend)
    run = ActivityEnvironment().run
    for group, gpus in (("g1", first), ("g2", second)):
        await run(agent.switch, switch(group, gpus, "a", [], 1))
    await asyncio.gather(
        run(agent.switch, switch("g1", first, "b", ["a"], 2)),
        run(agent.switch, switch("g2", second, "b", ["a"], 2)),
    )
    events = [e for e in backend.events if e["event"] == "checkpoint"]
    (one, two) = sorted(events, key=lambda e: e["start"])
    assert two["start"] < one["end"], (one, two)
