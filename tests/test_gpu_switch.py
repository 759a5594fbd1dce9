"""The GPU check's harness, run on the GPU emulator (no GPU here): two jobs of
two CUDA ranks and DataLoader-style children take turns through the stack with
the cuda, freeze+cuda and cuda-checkpoint backends and co-resident, every grant
finds each rank's data intact, NVML shows the waiting job's memory dropped (or
stayed, co-resident), and the agent reports each rank's bytes and seconds. No
figure it prints is a GPU figure. (On a GPU host: `python -m bench.gpu_switch`.)"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from tests import emulator
from tests.conftest import REPO


@pytest.mark.skipif(emulator.gcc() is None, reason="gcc is not installed: the emulator needs it")
def test_the_gpu_check_runs_on_the_emulator() -> None:
    scratch_before = set(Path(tempfile.gettempdir()).glob("gpu-switch-emulator-*"))
    result = subprocess.run(
        [sys.executable, "-m", "bench.gpu_switch", "--emulator", "--gib=0.02", "--handovers=4"],
        capture_output=True, text=True, cwd=REPO, timeout=280,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    assert "GPU EMULATOR: not a GPU figure" in result.stdout
    # The emulator's scratch folder goes with the run that used it.
    assert set(Path(tempfile.gettempdir()).glob("gpu-switch-emulator-*")) == scratch_before
    figures = {
        line.split()[0]: dict(pair.split("=", 1) for pair in line.split())
        for line in result.stdout.splitlines()
        if line.startswith("scenario=")
    }
    assert sorted(figures) == [
        "scenario=co-residency", "scenario=cuda", "scenario=cuda-checkpoint",
        "scenario=freeze+cuda",
    ]  # fmt: skip
    for name, scenario in figures.items():
        assert scenario["handovers"] == "4" and scenario["verified"] == "5/5", (name, scenario)
        assert "copy_ceiling_gbps" not in scenario  # no GPU, no ceiling
    for name in ("scenario=cuda", "scenario=freeze+cuda", "scenario=cuda-checkpoint"):
        assert figures[name]["memory_dropped"] == "true", figures[name]
        assert figures[name]["ranks_reported"] == "4"  # two jobs of two ranks
        assert figures[name]["emulated_checkpoint_gbps_per_rank_p50"] != "n/a"
    # Co-resident, the waiting job's memory stayed and nothing was moved after the first.
    assert figures["scenario=co-residency"]["memory_stayed"] == "true"
