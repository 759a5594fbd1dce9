"""`bench.floor_hops`: Temporal's own floor in fresh worker processes, run by
run, ending with its line of figures. No timing is asserted."""

from __future__ import annotations

import subprocess
import sys

from tests.conftest import REPO


def test_the_floor_hops_benchmark_prints_each_run() -> None:
    run = subprocess.run(
        [sys.executable, "-m", "bench", "floor_hops", "--runs=2", "--iterations=3"],
        capture_output=True, text=True, cwd=REPO, timeout=200,
    )  # fmt: skip
    output = run.stdout + run.stderr[-3000:]
    assert run.returncode == 0, output
    figures = dict(item.split("=", 1) for item in run.stdout.strip().splitlines()[-1].split())
    assert figures["runs"] == "2", output
    # Each run's update awaited an activity: two dispatches and two workflow tasks.
    assert 0 < float(figures["floor_activity_ms_min"]) <= float(figures["floor_activity_ms_max"])
