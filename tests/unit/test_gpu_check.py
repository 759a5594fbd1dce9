"""timeshare.gpu_check.main's judging, on figures given to it: each figure against its
limit on a GPU and never on the emulator, the suite's report counted from its
JUnit file, and the overlap of ranks. The command itself on the GPU
emulator: tests/integration/test_gpu_check.py."""

from __future__ import annotations

import importlib.util
import time
from pathlib import Path

import pytest

from timeshare.gpu_check.arguments import SWITCH_SCENARIOS
from timeshare.gpu_check.figures import RankMove, overlap
from timeshare.gpu_check.steps import Context, conformance_counts, judged
from timeshare.gpu_check.switch import SCENARIOS, Outcome


def context(emulated: bool, out: Path) -> Context:
    return Context(out=out, env={}, emulated=emulated, gib=4.0, handovers=6, iterations=6,
                   deadline=time.monotonic() + 60, scenario_seconds=60)  # fmt: skip


def finish(name: str, checkpoint: float, restore: float, **extra: object) -> dict[str, object]:
    scenario = next(s for s in SCENARIOS if s.name == name)
    outcome = Outcome(scenario=scenario, verified=3, checks=3, memory_as_expected=True,
                      checkpoint_gbps=[checkpoint] * 4, restore_gbps=[restore] * 4,
                      ranks_reported=4, overlap=[1.0], **extra)  # type: ignore[arg-type]  # fmt: skip
    return {"event": "finish", "outcome": outcome.model_dump(mode="json")}


def move(pid: int, start: float, seconds: float) -> RankMove:
    return RankMove(event="checkpoint", job="a", pid=pid, bytes=2**30, seconds=seconds,
                    start=start, end=start + seconds)  # fmt: skip


def test_each_figure_is_judged_against_its_limit_on_a_gpu_and_never_on_the_emulator(
    tmp_path: Path,
) -> None:
    from timeshare.gpu_check.steps import StepResult

    probe = StepResult(name="probe", status="ok",
                       data={"parallel": {"checkpoint": 1.7, "restore": 4.0}})  # fmt: skip
    gpu, emulated = context(False, tmp_path), context(True, tmp_path)
    at_par = judged(gpu, finish("cuda", 1.65, 3.8), probe, 0)
    assert at_par.status == "ok", at_par.reason
    assert at_par.fields["checkpoint_driver_ratio"] == "0.97"
    slow = judged(gpu, finish("cuda", 1.65, 2.28), probe, 0)
    assert slow.status == "failed"
    assert slow.reason == "restore_driver_ratio 0.57 is below 0.90"
    # Without the probe's rates the limit cannot be judged: a failure on a GPU.
    assert "could not be measured" in str(judged(gpu, finish("cuda", 1.65, 3.8), None, 0).reason)
    on_emulator = judged(emulated, finish("cuda", 1.65, 2.28), probe, 0)
    assert on_emulator.status == "ok" and on_emulator.fields["limits"] == "not_judged"
    assert "emulated_restore_driver_ratio" in on_emulator.fields
    # The hooks path: the hook's own rate against a pinned copy of the same bytes.
    hooks = finish("hooks", 0.5, 0.5, hook_gbps={"evict": [30.0], "admit": [20.0]},
                   ceiling_gbps={"evict": 55.0, "admit": 50.0})  # fmt: skip
    judged_hooks = judged(gpu, hooks, probe, 0)
    assert judged_hooks.status == "failed"
    assert judged_hooks.reason == "hook_admit_of_ceiling 0.40 is below 0.50"
    # A rank whose data came back wrong fails whatever the figures.
    wrong = finish("cuda", 1.65, 3.8)
    wrong["outcome"]["verified"] = 2  # type: ignore[index]
    assert "data read back wrong" in str(judged(emulated, wrong, probe, 0).reason)
    # Not measured: expected on the emulator, a gap on a GPU host.
    gap = {"event": "not_measured", "scenario": "hooks", "reason": "torch has no CUDA here"}
    assert judged(gpu, gap, probe, 0).failed(emulated=False)
    assert not judged(emulated, gap, probe, 0).failed(emulated=True)


def test_the_conformance_checks_are_counted_from_their_last_line(tmp_path: Path) -> None:
    log = tmp_path / "conformance.log"
    log.write_text(
        "check=round_trip backend=cuda status=ok\n"
        "conformance passed=9 failed=2 skipped=1\n"
        "some trailing noise\n"
    )
    assert conformance_counts(log) == {"passed": 9, "failed": 2, "skipped": 1}
    nothing = {"passed": 0, "failed": 0, "skipped": 0}
    assert conformance_counts(tmp_path / "missing.log") == nothing


def test_overlap_is_one_for_ranks_at_once_and_zero_one_after_another() -> None:
    assert overlap([move(1, 0.0, 1.0), move(2, 0.0, 0.8)]) == 1.0
    assert overlap([move(1, 0.0, 1.0), move(2, 1.0, 1.0)]) == 0.0
    assert overlap([move(1, 0.0, 1.0), move(2, 0.5, 1.0)]) == pytest.approx(0.5)
    assert overlap([move(1, 0.0, 1.0)]) is None


def test_the_checks_options_name_every_switch_scenario_in_order() -> None:
    # The options are read without the check's modules (every `timeshare` command
    # builds them); they must still name the scenarios the check runs.
    assert list(SWITCH_SCENARIOS) == [scenario.name for scenario in SCENARIOS]


def test_a_missing_python_part_is_named_with_the_extra_in_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    from timeshare.gpu_check import main

    found = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec",
        lambda name, *rest: None if name == "cuda.bindings" else found(name, *rest),
    )  # fmt: skip
    args = main.parse_arguments(["--emulator", f"--out={tmp_path}"])
    assert main.run(args) == 2
    [line] = capsys.readouterr().err.splitlines()
    assert line == (
        "timeshare gpu-check: cuda.bindings is not installed: pip install 'timeshare[gpu-check]'"
    )
    assert not list(tmp_path.iterdir())  # nothing started


def test_a_host_without_the_utility_or_torch_skips_only_their_steps(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from timeshare.gpu_check import main

    monkeypatch.setattr("timeshare.gpu_check.main.shutil.which", lambda name: None)
    monkeypatch.setattr(main, "torch_with_cuda", lambda: False)
    gaps = main.host_gaps(emulated=False)
    assert set(gaps) == {"cuda-checkpoint", "blog", "hooks"}
    assert "cuda-checkpoint utility is not on PATH" in gaps["cuda-checkpoint"]
    assert gaps["blog"] == gaps["hooks"] == "PyTorch with CUDA is not installed on this host"
