"""The GPU check's harness, run on the CPU: two holders of known data take
turns through the stack with the freeze backend, and every grant finds its
data intact. (On a GPU host: `python -m bench.gpu_switch`.)"""

from __future__ import annotations

import subprocess
import sys

from tests.conftest import REPO


def test_the_gpu_check_runs_on_the_cpu() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "bench.gpu_switch", "--cpu", "--gib=0.02", "--handovers=4"],
        capture_output=True, text=True, cwd=REPO, timeout=240,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    last = dict(pair.split("=", 1) for pair in result.stdout.strip().splitlines()[-1].split())
    assert last["handovers"] == "4" and last["verified"] == "5"
