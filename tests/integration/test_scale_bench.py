"""`bench.scale` on a tiny load, as users run it with --quick: it measures
the floors (back to back, and paced beside a second run of the load), the
idle jobs' history (now and with the old heartbeat) and a paced load, and
ends with its line of figures. No timing is asserted."""

from __future__ import annotations

import subprocess
import sys

import pytest

from bench.parts.temporal_operations import parse
from tests.conftest import REPO


def test_the_scale_benchmark_prints_its_figures() -> None:
    run = subprocess.run(
        [
            sys.executable, "-m", "bench", "scale", "--quick", "--period=1", "--sizes=2",
            "--seconds=4", "--idle-groups=1", "--idle-lease=12", "--idle-seconds=6",
            "--floor-iterations=5", "--watch-groups=3", "--watch-seconds=2", "--floor-inline",
            "--floor-publishes", "--floor-handovers",
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
        "worker_cpu_ratio_back_to_back",
        "lost_leases",
        "history_events_per_idle_job_hour",
        "history_events_per_idle_job_hour_before",
        "temporal_requests_per_handover",
        "temporal_store_requests_per_handover",
        "temporal_cpu_ratio",
        "workflow_tasks_per_handover",
        "handover_floor_ratio",
        "worker_cpu_ratio_vs_handover_floor",
        "asking_watch_temporal_cores_per_100_groups",
    ):
        assert key in figures, output  # fmt: skip
    assert figures["groups"] == "2" and figures["lost_leases"] == "0", output
    # The ratio's floor was paced as the load, beside it, in one window.
    assert "the two, paced: 2 workflows" in run.stdout and "beside the paced floor" in run.stdout
    # --floor-inline: its worker ran activations inline, as the scheduler does;
    # --floor-publishes: its updates upserted what a hand-over publishes (an
    # upsert of an unregistered search attribute would have failed its tasks).
    assert "pairs, activations inline, publishing as a hand-over does)" in run.stdout, output
    # --floor-handovers: the hand-over floor handed over in that same window.
    shape = next(line for line in run.stdout.splitlines() if "and the hand-over floor" in line)
    assert int(shape.split(" over ")[-1]) > 0 and figures["handover_floor_layer"] == "shape"
    # The first grants and last yields are measured apart from the hand-overs,
    # and add to them. Not strictly more: /proc counts CPU in clock ticks
    # (10 ms), and two groups' edges took less than one in a CI run.
    assert "counting each group's first grant and last yield too" in run.stdout, output
    assert float(figures["worker_cpu_ratio_with_edges"]) >= float(figures["worker_cpu_ratio"])
    # The old heartbeat wrote history that the count saw; renewals now write less.
    before = float(figures["history_events_per_idle_job_hour_before"])
    assert before > float(figures["history_events_per_idle_job_hour"]) >= 0, output
    # What the server did, from its own counters: updates and workflow tasks at least.
    assert float(figures["temporal_requests_per_handover"]) > 0, output
    # The server's CPU, in the load and in the floors: each measured, so neither is 0.
    assert float(figures["temporal_cpu_ms_per_handover"]) > 0, output
    assert float(figures["temporal_cpu_ratio"]) > 0, output
    # Its floor is the pair paced as the load, alone in a window of its own
    # (the server's CPU in one window cannot be split between load and floor);
    # the floor sent back to back gives the other ratio.
    paced_ms = float(figures["temporal_floor_cpu_ms"])
    assert "the floor paced alone: Temporal" in run.stdout and paced_ms > 0, output
    ratio = float(figures["temporal_cpu_ms_per_handover"]) / paced_ms
    assert float(figures["temporal_cpu_ratio"]) == pytest.approx(ratio, rel=0.02), output
    assert float(figures["temporal_cpu_ratio_back_to_back"]) > 0, output
    # Every hand-over's switch is scheduled by one workflow task and granted by
    # another, both inside the window its histories are counted in.
    assert float(figures["workflow_tasks_per_handover"]) >= 2, output
    assert "UpdateWorkflowExecution" in run.stdout and "RespondWorkflowTaskCompleted" in run.stdout
    # Each building block's store requests measured, and a hand-over's split by them.
    assert float(figures["temporal_store_requests_floor"]) > 0, output
    assert "store requests per hand-over at 2 groups, by block" in run.stdout, output
    assert "the rest: the acquire's own task" in run.stdout, output


def test_temporal_request_counters_are_summed_per_service_and_operation() -> None:
    page = "\n".join(
        [
            "# HELP service_requests service_requests counter",
            'service_requests{namespace="default",operation="UpdateWorkflowExecution",'
            'service_name="frontend"} 7',
            'service_requests{namespace="_unknown_",operation="UpdateWorkflowExecution",'
            'service_name="frontend"} 2',
            'service_requests{namespace="default",operation="UpdateWorkflowExecution",'
            'service_name="history"} 9',
            'persistence_requests{namespace="default",operation="UpdateWorkflowExecution",'
            'service_name="history"} 4e+00',
            'service_latency_bucket{operation="X",le="0.1"} 3',
        ]
    )
    counts = parse(page)
    assert counts == {
        ("service_requests", "frontend", "UpdateWorkflowExecution"): 9,
        ("service_requests", "history", "UpdateWorkflowExecution"): 9,
        ("persistence_requests", "history", "UpdateWorkflowExecution"): 4,
    }


def test_the_replicas_comparison_prints_both_runs() -> None:
    """`--compare-replicas`: the load alone on one scheduler and gateway,
    then on two of each; each run's workflow tasks shared among its schedulers."""
    run = subprocess.run(
        [sys.executable, "-m", "bench", "scale", "--compare-replicas", "--sizes=2",
         "--seconds=3", "--period=1"],
        capture_output=True, text=True, cwd=REPO, timeout=280,
    )  # fmt: skip
    output = run.stdout + run.stderr[-3000:]
    assert run.returncode == 0, output
    figures = dict(item.split("=", 1) for item in run.stdout.strip().splitlines()[-1].split())
    assert {"handovers_per_s_1", "handovers_per_s_2", "p99_ms_1", "p99_ms_2", "rate_ratio"} <= set(
        figures
    ), output
    # Alone, the one scheduler completed every workflow task it was counted for.
    assert "scheduler 100 %" in run.stdout and "scheduler-2 " in run.stdout, output
