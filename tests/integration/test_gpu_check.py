"""`timeshare gpu-check`, the one command an operator runs on a new GPU host, here on
the GPU emulator (no GPU; no figure it prints is a GPU figure, and no limit is
judged), run outside the checkout as an installed package runs it.

Its judging of figures: tests/unit/test_gpu_check.py."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from tests.polling import wait_until
from timeshare.gpu_check import emulator
from timeshare.gpu_check.steps import finished
from timeshare.testing.stack import processes_below


def running(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.skipif(emulator.gcc() is None, reason="gcc is not installed: the emulator needs it")
def test_the_gpu_check_runs_on_the_emulator(tmp_path: Path) -> None:
    scratch_before = set(Path(tempfile.gettempdir()).glob("gpu-check-emulator-*"))
    result = subprocess.run(
        [sys.executable, "-m", "timeshare", "gpu-check", "--emulator", "--gib=0.02",
         "--handovers=2", "--iterations=2", f"--out={tmp_path / 'out'}"],
        capture_output=True, text=True, cwd=tmp_path, timeout=420,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    tmp_path = tmp_path / "out"
    lines = result.stdout.splitlines()
    assert lines[-1].startswith("gpu_check=ok scenarios=9 failed=0 seconds=")
    # One line per step (the blog's per backend), as KEY=VALUE pairs (a reason is quoted).
    parsed = [dict(pair.split("=", 1) for pair in shlex.split(line))
              for line in lines if line.startswith("scenario=")]  # fmt: skip
    steps = {step["scenario"] + (f"/{step['backend']}" if "backend" in step else ""): step
             for step in parsed}  # fmt: skip
    assert list(steps) == ["probe", "conformance", "blog/hooks", "blog/cuda", "cuda",
                           "freeze+cuda", "cuda-checkpoint", "co-residency", "hooks"]  # fmt: skip
    assert steps["hooks"]["status"] == "not_measured"
    # Each backend's conformance against the (emulated) driver.
    assert (steps["conformance"]["passed"], steps["conformance"]["failed"]) == ("8", "0")
    # The blog's two jobs, alone and then sharing the GPU: busier together, every
    # grant's data intact, and the figures labelled emulated.
    for backend in ("hooks", "cuda"):
        blog = steps[f"blog/{backend}"]
        assert blog["status"] == "ok", blog
        checked, grants = blog["verified"].split("/")
        assert checked == grants and int(grants) > 0
        assert int(blog["switches"]) > 0
        assert float(blog["emulated_busy_shared"]) > float(blog["emulated_busy_alone"])
        assert "busy_shared" not in blog  # no unlabelled figure on the emulator
    for name in ("cuda", "freeze+cuda", "cuda-checkpoint"):
        step = steps[name]
        assert (step["status"], step["verified"], step["memory_dropped"]) == ("ok", "3/3", "true")
        assert step["ranks_reported"] == "4"  # two jobs of two ranks, by the agent's record
        # Next to the probe's raw driver rate; on the emulator, labelled and not judged.
        assert step["emulated_raw_checkpoint_gbps_per_rank"] != "n/a"
        assert step["emulated_checkpoint_driver_ratio"] != "n/a"
        assert (step["driver_ratio_limit"], step["limits"]) == ("0.90", "not_judged")
        assert step["overlap_p50"] != "n/a"
    assert steps["co-residency"]["memory_stayed"] == "true"
    # The probe's readings, as JSON and as a table.
    probe = json.loads((tmp_path / "probe.json").read_text())
    assert probe["emulated"] and not probe["failures"]
    calls = {(r["section"], r["call"]) for r in probe["readings"]}
    assert ("driver API", "cuCheckpointProcessCheckpoint") in calls
    assert ("utility", "--action restore") in calls
    assert ("device full", "cuCheckpointProcessRestore") in calls
    assert set(probe["rates"]) == {"solo", "parallel"}
    assert "GPU EMULATOR" in (tmp_path / "probe.md").read_text()
    summary = json.loads((tmp_path / "gpu-check.json").read_text())
    assert [step["name"] for step in summary["steps"]] == [key.split("/")[0] for key in steps]
    # The emulator's scratch folder goes with the run that used it.
    assert set(Path(tempfile.gettempdir()).glob("gpu-check-emulator-*")) == scratch_before


def test_a_step_past_its_limit_is_killed_with_everything_it_started(tmp_path: Path) -> None:
    from timeshare.gpu_check.steps import started

    process = started(["sh", "-c", "sleep 60 & sleep 60"], tmp_path / "log", dict(os.environ))
    time.sleep(0.3)
    family = processes_below(process.pid)
    assert family
    assert finished(process, 0.5) is None
    wait_until(lambda: not [pid for pid in family if running(pid)], "the step's children to go")
