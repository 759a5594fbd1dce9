"""The chaos run for half a minute, as users run it: random SIGKILLs of every
kind of process against a stack of three agents and three groups. No
acquire lost, no turn granted twice, no overlap, no group stuck (a group
whose history the scheduler could not replay heals by itself, and counts
as healed, not stuck).

The run's checks on made-up records: tests/unit/test_chaos.py."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

import pytest
from temporalio.client import Client, WorkflowHistory

from bench.parts.chaos_stuck import save_histories
from tests.conftest import REPO, SimNodes
from tests.groups import acquire, group_on_one_node
from tests.integration.test_replay import replayer


@pytest.mark.chaos
@pytest.mark.timeout(900)
def test_half_a_minute_of_chaos_loses_nothing(tmp_path: Path) -> None:
    run = subprocess.run(
        [sys.executable, "-m", "bench", "chaos", "--minutes", "0.5", "--workdir", str(tmp_path)],
        capture_output=True, text=True, cwd=REPO, timeout=840,
    )  # fmt: skip
    output = run.stdout + run.stderr[-4000:]
    last = run.stdout.strip().splitlines()[-1]
    figures = dict(item.split("=", 1) for item in last.split())
    assert list(figures) == [
        "turns", "faults", "lost", "double_grants", "overlaps", "stuck", "healed",
        "recovery_p50_s", "recovery_max_s",
    ], output  # fmt: skip
    # A group whose history its scheduler cannot replay heals (healed counts it);
    # one that did not heal is stuck, and fails the run.
    for clean in ("lost", "double_grants", "overlaps", "stuck"):
        assert figures[clean] == "0", output
    assert int(figures["turns"]) > 0 and int(figures["faults"]) > 0, output
    assert run.returncode == 0, output


async def test_a_stuck_groups_history_is_saved_as_replayable_json(
    temporal_address: str, client: Client, sim_nodes: SimNodes, unique: str, tmp_path: Path
) -> None:
    handle, _ = await group_on_one_node(client, sim_nodes, unique)
    await acquire(handle, "a")
    lines = await asyncio.to_thread(
        save_histories, temporal_address, [f"g-{unique}", "no-such-group"], tmp_path
    )
    saved = tmp_path / f"g-{unique}-history.json"
    assert lines[0] == f"g-{unique}: history saved to {saved}"
    assert lines[1].startswith("no-such-group: history not saved (RPCError: "), lines[1]
    history = WorkflowHistory.from_json(handle.id, saved.read_text())
    await replayer().replay_workflow(history)
