"""A worker under a coordinator takes its turns through the coordinator
(real scheduler and gateway, sim node): its handover and ``outside`` are one
request each, the ``outside`` call runs in the coordinator's process with the
turn given away, and the coordinator leaves once the worker has exited."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys

import pytest

import timeshare
from tests.conftest import REPO, SimNodes
from timeshare.integrations.coordinator import main as coordinator_main
from timeshare.integrations.coordinator import run_coordinated


async def test_a_worker_takes_its_turns_through_the_coordinator(
    gateway: str, sim_nodes: SimNodes, unique: str, monkeypatch: pytest.MonkeyPatch,
    capfd: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    node, group = f"n-{unique}", f"coord-{unique}"
    await sim_nodes.start(node)
    monkeypatch.setenv("TIMESHARE_NODES", node)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    command = [sys.executable, "-m", "tests.turns_worker", group, gateway]
    returncode, turns = await asyncio.to_thread(
        run_coordinated, command, group, "job-a", gateway, env
    )
    assert returncode == 0
    seen = json.loads(capfd.readouterr().out.strip().splitlines()[-1])
    assert seen["outside"]["holder"] == ""  # given away while it ran
    assert seen["outside"]["pid"] == os.getpid() != seen["pid"]  # in the coordinator
    assert "module-level function" in seen["refused"]
    assert seen["holding"] and seen["phase"] == "train"
    assert [r.phase for r in turns.records] == ["setup", "rollout", "train"]
    with timeshare.connect(gateway) as client:
        status = await asyncio.to_thread(client.get_group, group)
    assert status.jobs == [] and status.holder == ""  # left, after the worker exited


def test_the_coordinator_command_needs_a_command(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        coordinator_main(["--group", "g", "--job", "j"])
    assert exited.value.code == 2
    assert "give the command to run after --" in capsys.readouterr().err


def test_an_unreachable_gateway_is_one_line_and_exit_2() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "timeshare.integrations.coordinator", "--group=g", "--job=j",
         "--address=127.0.0.1:1", "--", sys.executable, "-c", "pass"],
        capture_output=True, text=True, cwd=REPO, timeout=60,
    )  # fmt: skip
    assert result.returncode == 2
    assert result.stderr.startswith("coordinator: UNAVAILABLE"), result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_a_process_asking_for_its_own_turns_refuses_a_stopping_backend() -> None:
    from timeshare.errors import FailedPrecondition
    from timeshare.integrations.turns import JobTurns
    from timeshare.models import NodeRecord

    class Nodes:
        def __init__(self, backend: str) -> None:
            self.backend = backend

        def list_nodes(self) -> list[NodeRecord]:
            return [NodeRecord(node="n1", backend=self.backend, simulated=False, alive=True,
                               last_seen=0.0, gpus=[], drained=False),
                    NodeRecord(node="other", backend="freeze", simulated=False, alive=True,
                               last_seen=0.0, gpus=[], drained=False)]  # fmt: skip

    class OnNode:
        group, name, nodes = "g", "j", ["n1"]

    for backend in ("freeze", "freeze+cuda", "app+freeze"):
        turns = JobTurns(OnNode(), Nodes(backend))  # type: ignore[arg-type]
        with pytest.raises(FailedPrecondition, match=r"timeshare\.integrations\.coordinator"):
            turns.refuse_stopping_backends()
    for backend in ("cuda", "app+cuda", "cuda-checkpoint", "sim"):
        JobTurns(OnNode(), Nodes(backend)).refuse_stopping_backends()  # type: ignore[arg-type]
