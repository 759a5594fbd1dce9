"""`bench.scale` on a tiny load, as users run it with --quick: it measures
the floors, the idle jobs' history (now and with the old heartbeat) and a
paced load, and ends with its line of figures. No timing is asserted."""

from __future__ import annotations

import subprocess
import sys

from tests.conftest import REPO


def test_the_scale_benchmark_prints_its_figures() -> None:
    run = subprocess.run(
        [
            sys.executable, "-m", "bench.scale", "--quick", "--period=1", "--sizes=2",
            "--seconds=4", "--idle-groups=1", "--idle-lease=12", "--idle-seconds=6",
            "--floor-iterations=5", "--watch-groups=3", "--watch-seconds=2",
        ],
        capture_output=True, text=True, cwd=REPO, timeout=280,
    )  # fmt: skip
    output = run.stdout + run.stderr[-3000:]
    assert run.returncode == 0, output
    figures = dict(item.split("=", 1) for item in run.stdout.strip().splitlines()[-1].split())
    for key in (
        "p99_ms",
        "max_groups_p99_under_1s",
        "worker_cpu_ratio",
        "lost_leases",
        "history_events_per_idle_job_hour",
        "history_events_per_idle_job_hour_before",
    ):
        assert key in figures, output  # fmt: skip
    assert figures["groups"] == "2" and figures["lost_leases"] == "0", output
    # The old heartbeat wrote history that the count saw; renewals now write less.
    before = float(figures["history_events_per_idle_job_hour_before"])
    assert before > float(figures["history_events_per_idle_job_hour"]) >= 0, output
