"""`python -m bench floors`: Temporal's own floors.

- ``hops``: the pair's update awaiting an activity, in fresh worker
  processes, run by run, ending with its line of figures.
- ``layers`` on a tiny load: the pair floor and every hand-over-shaped
  layer (bench.parts.floor_layers), timeshare's GroupWorkflow among them,
  each in a worker process of its own, paced in one window. It must hand
  over in every layer and end with its line of figures.

No timing is asserted."""

from __future__ import annotations

import subprocess
import sys

from bench.parts.floor_layers import LAYERS
from tests.conftest import REPO


def floors(*args: str, timeout: float) -> tuple[subprocess.CompletedProcess[str], str]:
    run = subprocess.run(
        [sys.executable, "-m", "bench", "floors", *args],
        capture_output=True, text=True, cwd=REPO, timeout=timeout,
    )  # fmt: skip
    output = run.stdout + run.stderr[-3000:]
    assert run.returncode == 0, output
    return run, output


def test_the_hops_print_each_run() -> None:
    run, output = floors("hops", "--runs=2", "--iterations=3", timeout=200)
    figures = dict(item.split("=", 1) for item in run.stdout.strip().splitlines()[-1].split())
    assert figures["runs"] == "2", output
    # Each run's update awaited an activity: two dispatches and two workflow tasks.
    assert 0 < float(figures["floor_activity_ms_min"]) <= float(figures["floor_activity_ms_max"])


def test_every_layer_hands_over_and_the_figures_are_printed() -> None:
    run, output = floors(
        "layers", "--workflows=2", "--seconds=4", "--period=1", "--rounds=1", timeout=240
    )
    lines = run.stdout.strip().splitlines()
    figures = dict(item.split("=", 1) for item in lines[-1].split())
    assert figures["rounds"] == "1" and float(figures["pair_floor_cpu_ms"]) > 0, output
    assert figures["pair_floor_inline"] == "1", output  # as the layers, unless --floor-defaults
    for name in LAYERS:
        assert float(figures[f"{name}_ratio"]) > 0, output
    assert float(figures["group_over_shape"]) > 0, output
    # The round's row: the floor's pairs, then each layer's hand-overs, all counted.
    row = next(line for line in lines if line.startswith("1 "))
    counts = [int(n) for n in row.split()[-1].split("/")]
    assert len(counts) == 1 + len(LAYERS) and min(counts) > 0, output
    # A hand-over cut short by the window's end leaves no acquire waiting
    # on a workflow that the benchmark then ends.
    assert "exception was never retrieved" not in run.stderr, output
