"""`bench.policy` on a tiny budget, as users run it: every scenario runs on
the real stack and the last line carries each figure. No figure is asserted
(timings belong to the benchmark), only that each scenario ran."""

from __future__ import annotations

import subprocess
import sys

from tests.conftest import REPO

FIGURES = [
    "fifo_jain", "fair_jain",
    "two_jobs_ratio", "two_jobs_handovers", "two_jobs_idle_ms_per_handover", "two_jobs_busy",
    "two_jobs_no_anticipation_ratio", "two_jobs_no_anticipation_handovers",
    "two_jobs_no_anticipation_idle_ms_per_handover", "two_jobs_no_anticipation_busy",
    "same_priority_high_wait_p50_ms", "same_priority_low_wait_p50_ms",
    "priority_high_wait_p50_ms", "priority_low_wait_p50_ms",
    "trainer_step_alone_s", "trainer_step_fifo_s", "trainer_step_phase_priority_s",
    "trainer_step_phase_priority_preemption_s",
]  # fmt: skip


def test_the_policy_benchmark_runs_every_scenario() -> None:
    run = subprocess.run(
        [sys.executable, "-m", "bench", "policy", "--seconds=2"],
        capture_output=True, text=True, cwd=REPO, timeout=280,
    )  # fmt: skip
    output = run.stdout + run.stderr[-3000:]
    assert run.returncode == 0, output
    figures = dict(item.split("=", 1) for item in run.stdout.strip().splitlines()[-1].split())
    assert list(figures) == FIGURES, output
    assert all(float(value) >= 0 for value in figures.values()), output
