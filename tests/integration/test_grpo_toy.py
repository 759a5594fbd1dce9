"""Time-slicing does not change training results: the toy GRPO job gives the
same reward curve and bit-identical parameters alone and sharing a group with
another job, with the freeze backend really stopping its worker between turns."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from examples.grpo_toy.compare import compare
from tests.conftest import REPO, start_until_ready
from timeshare.testing import free_port, timeshare_command

STEPS = 8


def test_results_are_identical_alone_and_time_sliced(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    record = tmp_path / "freeze.jsonl"
    ports: list[int] = []

    def up_command() -> list[str]:
        ports[:] = [free_port(), free_port(), free_port()]
        return timeshare_command(
            "up", f"--port={ports[0]}", f"--ui-port={ports[1]}", f"--listen=127.0.0.1:{ports[2]}",
            f"--data-dir={tmp_path / 'data'}", "--node=toy-node", "--backend=freeze",
            f"--socket={tmp_path / 'agent.sock'}", f"--record={record}",
        )  # fmt: skip

    up = start_until_ready(up_command, "timeshare up: ready")
    monkeypatch.setenv("TIMESHARE_AGENT_SOCKET", str(tmp_path / "agent.sock"))
    try:
        alone, shared, other = compare(STEPS, f"127.0.0.1:{ports[2]}")
    finally:
        up.send_signal(signal.SIGINT)
        assert up.wait(60) == 0
    assert shared.reward_curve == alone.reward_curve
    assert shared.fingerprint == alone.fingerprint
    assert other.fingerprint != alone.fingerprint  # another seed: really another job
    events = [json.loads(line) for line in record.read_text().splitlines()]
    frozen = {pid for e in events if e["event"] == "freeze" for pid in e["pids"]}
    assert shared.worker_pid in frozen and other.worker_pid in frozen


def test_the_example_runs_alone_from_the_command_line() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "examples.grpo_toy.run", "--steps=3"],
        capture_output=True, text=True, cwd=REPO, timeout=60,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[-1].startswith("fingerprint=")
