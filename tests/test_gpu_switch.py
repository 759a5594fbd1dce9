"""The GPU check's harness, run on the CPU: two holders of known data take
turns through the stack in each scenario (the freeze backend; with the
PyTorch offload hook in front of it; beside a simulated GPU with room for
both, co-resident), and every grant finds its data intact. (On a GPU host:
`python -m bench.gpu_switch`.)"""

from __future__ import annotations

import subprocess
import sys

from tests.conftest import REPO


def test_the_gpu_check_runs_on_the_cpu() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "bench.gpu_switch", "--cpu", "--gib=0.02", "--handovers=4"],
        capture_output=True, text=True, cwd=REPO, timeout=280,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    figures = {
        line.split()[0]: dict(pair.split("=", 1) for pair in line.split())
        for line in result.stdout.splitlines()
        if line.startswith("scenario=")
    }
    assert sorted(figures) == ["scenario=checkpoint", "scenario=co-residency", "scenario=hooks"]
    for scenario in figures.values():
        assert scenario["handovers"] == "4" and scenario["verified"] == "5", scenario
    # Co-resident, the simulated GPU moved nothing after the jobs first came in.
    assert figures["scenario=co-residency"]["sim_moved_bytes"] == "0"
