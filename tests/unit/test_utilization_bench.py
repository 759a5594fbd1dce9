"""bench utilization's profiles: llm-d's recorded costs scaled into the
simulated GPU's speeds, the runs each flag chooses, and options that
`timeshare synthetic-job` takes; and the timeline figures the bench prints
(busy between two moments, waits behind a backfill job)."""

from __future__ import annotations

import pytest

from bench.utilization import (
    LLMD_DUTY,
    LLMD_SCALE,
    STATE_GIB,
    Profile,
    cost_runs,
    stack_options,
)
from timeshare.cli import build_parser
from timeshare.history import GroupHistory, TurnRecord
from timeshare.synthetic import BACKFILL_PHASE, PhaseRecord, SyntheticJobReport, SyntheticJobSpec
from timeshare.timeline import busy_between, waits_behind

GIB = 2**30


def test_the_llmd_profile_moves_each_jobs_state_in_the_recorded_times_scaled() -> None:
    options = stack_options("llmd-costs", room=2)
    moved_gb = STATE_GIB * GIB / 1e9
    checkpoint = moved_gb / float(options["bandwidth_gbps"])  # type: ignore[arg-type]
    restore = moved_gb / float(options["restore_bandwidth_gbps"])  # type: ignore[arg-type]
    assert checkpoint * LLMD_SCALE == pytest.approx(21.3)
    assert restore * LLMD_SCALE == pytest.approx(2.5)
    assert "restore_bandwidth_gbps" not in stack_options("blog", room=2)


def test_an_llmd_iteration_is_one_recorded_step_scaled_at_the_recorded_duty() -> None:
    (option,) = Profile(jobs=2, duty=LLMD_DUTY, costs="llmd-costs").job_options()
    gpu, cpu = option.removeprefix("--iteration=").split(",")
    gpu_seconds, cpu_seconds = float(gpu.split(":")[1]), float(cpu.split(":")[1])
    assert (gpu_seconds + cpu_seconds) * LLMD_SCALE == pytest.approx(13 * 60, abs=0.1)
    assert gpu_seconds / (gpu_seconds + cpu_seconds) == pytest.approx(0.555, abs=1e-4)


def test_each_flag_chooses_its_runs() -> None:
    llmd = cost_runs("llmd-costs", backfill=True)
    assert [(p.backfill, p.switch_cost_aware) for p in llmd] == [
        ("", True), ("", False), ("steps", True)
    ]  # fmt: skip
    assert {p.costs for p in llmd} == {"llmd-costs"} and {p.duty for p in llmd} == {LLMD_DUTY}
    assert [p.backfill for p in cost_runs("llmd-costs", backfill=False)] == ["", ""]
    blog = cost_runs("blog", backfill=True)
    assert [(p.backfill, p.variant) for p in blog] == [
        ("", ""), ("steps", ""), ("", "co-resident"), ("steps", "co-resident"), ("ignores", "")
    ]  # fmt: skip
    assert {p.duty for p in blog} == {0.4}
    assert len({p.label for p in [*llmd, *blog]}) == 8  # a group of its own each


@pytest.mark.parametrize("profile", [*cost_runs("llmd-costs", True), *cost_runs("blog", True)])
def test_the_synthetic_job_takes_every_option_the_bench_gives(profile: Profile) -> None:
    common = ["synthetic-job", "--group", "g", "--job", "j"]
    regular = build_parser().parse_args([*common, *profile.job_options(), *profile.options()])
    assert regular.switch_cost_aware == ("on" if profile.switch_cost_aware else "off")
    backfill = build_parser().parse_args([*common, *profile.backfill_options()])
    assert backfill.backfill and backfill.step_seconds == 0.05
    assert (backfill.ignore_should_yield is not None) == (profile.backfill == "ignores")
    assert (backfill.backfill_grace_seconds is not None) == (profile.backfill == "ignores")


def report(job: str, *gpu: tuple[float, float]) -> SyntheticJobReport:
    spec = SyntheticJobSpec(group="g", job=job, backfill=job == "bf")
    phase = BACKFILL_PHASE if spec.backfill else "gpu"
    return SyntheticJobReport(
        spec=spec, phases=[PhaseRecord(phase=phase, start=a, end=b) for a, b in gpu]
    )


def test_busy_between_counts_every_jobs_gpu_phases_clipped_to_the_window() -> None:
    reports = [report("a", (0.0, 4.0)), report("bf", (4.0, 6.0), (9.0, 12.0))]
    assert busy_between(reports, 0.0, 10.0) == pytest.approx(0.7)
    assert busy_between(reports[1:], 2.0, 10.0) == pytest.approx(3 / 8)
    assert busy_between(reports, 5.0, 5.0) == 0.0


def test_a_wait_behind_a_backfill_job_ends_when_the_gpus_go_to_a_regular_job() -> None:
    turns = [
        TurnRecord(job="bf", epoch=1, requested_at=0.0, granted_at=1.0, released_at=5.0),
        TurnRecord(job="a", epoch=2, requested_at=4.0, granted_at=5.5, switch_seconds=0.3),
        # Asked while bf held, then waited for a as well: 1.5 s of it for bf.
        TurnRecord(job="b", epoch=3, requested_at=4.5, granted_at=7.0, switch_seconds=0.2),
        TurnRecord(job="a", epoch=4, requested_at=6.0, granted_at=7.5),  # bf did not hold
        TurnRecord(job="bf", epoch=5, requested_at=7.5, granted_at=8.0),  # still holds
        TurnRecord(job="b", epoch=6, requested_at=9.5, granted_at=0.0),  # not granted yet
    ]
    history = GroupHistory(group="g", captured_at=20.0, turns=turns)
    assert waits_behind(history, {"bf"}) == [(1.5, 0.3), (1.0, 0.3)]
