"""`timeshare plan` at its edges: bad input is one line naming the field and
exit code 2; YAML needs the `plan` extra, JSON nothing; profiles from
`timeshare profile --json` are accepted; plan.json says how to launch."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO
from tests.placement_cases import sets
from timeshare.models import GroupPolicy
from timeshare.placement.model import GroupModel
from timeshare.placement.profile import profile_job
from timeshare.placement.spec import JobSpec, Phase, StackCosts
from timeshare.testing import timeshare_command

EXAMPLE = REPO / "examples" / "placement" / "jobs.yaml"
GOOD = """\
jobs:
  - name: grpo-a
    gpus: 1
    state_gib: 20
    iteration:
      - {gpu: 6.0}
      - {cpu: 9.0}
      - {gpu: 4.0}
  - name: grpo-b
    state_gib: 20
    iteration:
      - {gpu: 2.0}
      - {cpu: 8.0}
gpu_sets:
  count: 3
  gpus: 1
  gpu_memory_gib: 80
  host_memory_gib: 512
  bandwidth_gbps: 25
max_slowdown: 1.5
"""
LAST_LINE = re.compile(
    r"plan_util=\d\.\d{3} naive_util=\d\.\d{3} dedicated_util=\d\.\d{3} "
    r"sets_used=\d+ sets_dedicated=\d+ max_slowdown=\d+\.\d{3}"
)
# Importing yaml fails, as on an install without the `plan` extra.
WITHOUT_YAML = "import sys; sys.modules['yaml'] = None; from timeshare.cli import main; main()"


def plan(*args: str, python: list[str] | None = None) -> subprocess.CompletedProcess[str]:
    command = [*(python or timeshare_command()), "plan", *args]
    return subprocess.run(command, capture_output=True, text=True, cwd=REPO, timeout=120)


def one_line_refusal(result: subprocess.CompletedProcess[str], *words: str) -> str:
    assert result.returncode == 2, result
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    for word in words:
        assert word in lines[0], lines[0]
    return lines[0]


def test_the_worked_example_prints_tables_and_the_summary_line(tmp_path: Path) -> None:
    out = tmp_path / "plan.json"
    result = plan(str(EXAMPLE), "--out", str(out))
    assert result.returncode == 0, result.stderr
    lines = result.stdout.strip().splitlines()
    assert LAST_LINE.fullmatch(lines[-1]), lines[-1]
    assert any(line.startswith("dedicated:") for line in lines)
    assert any(line.startswith("naive (input order") for line in lines)
    written = json.loads(out.read_text())
    launched = {entry["job"]: entry for entry in written["launch"]}
    assert sorted(launched) == sorted(j for g in written["groups"] for j in g["jobs"])
    for group in written["groups"]:
        for name in group["jobs"]:
            assert launched[name]["env"] == {
                "TIMESHARE_GROUP": group["group"],
                "TIMESHARE_JOB": name,
                "TIMESHARE_NODES": group["node"],
            }
    sets_used = int(lines[-1].split("sets_used=")[1].split()[0])
    assert len(written["groups"]) == sets_used < written["summary"]["sets_dedicated"]


@pytest.mark.parametrize(
    ("change", "words"),
    [
        (("gpus: 1\n    state", "gpuz: 1\n    state"), ["jobs[0] (grpo-a).gpuz", "Extra inputs"]),
        (("      - {cpu: 9.0}", "      - {cpu: 9.0, gpu: 1}"),
         ["jobs[0] (grpo-a).iteration[1]", "exactly one of gpu"]),
        (("  - name: grpo-b", "  - name: Grpo B"), ["jobs[1] (Grpo B).name", "invalid"]),
        (("  bandwidth_gbps: 25\n", ""), ["gpu_sets.bandwidth_gbps", "Field required"]),
        (("max_slowdown: 1.5", "max_slowdown: 0.5"), ["max_slowdown", "greater than or equal"]),
        (("max_slowdown: 1.5", "policy: {ordering_typo: 1}"), ["policy.ordering_typo"]),
        (("  - name: grpo-b", "  - name: grpo-a"), ["jobs[1].name", "named twice"]),
        (("      - {gpu: 2.0}\n      - {cpu: 8.0}", "      - {cpu: 8.0}"),
         ["jobs[1] (grpo-b).iteration", "at least one {gpu"]),
        (("      - {cpu: 9.0}", "      - {cpu: 9.0, phase: train}"),
         ["jobs[0] (grpo-a).iteration[1]", "a cpu phase has none"]),
        (("  - name: grpo-b\n", "  - name: grpo-b\n    weight: 0\n"),
         ["jobs[1] (grpo-b).weight", "greater than 0"]),
        (("gpu_sets:", "gpu_sets: ["), ["line 16, column 7"]),
    ],
)  # fmt: skip
def test_bad_yaml_is_one_line_naming_the_field(
    tmp_path: Path, change: tuple[str, str], words: list[str]
) -> None:
    assert change[0] in GOOD
    path = tmp_path / "jobs.yaml"
    path.write_text(GOOD.replace(*change))
    one_line_refusal(plan(str(path)), str(path), *words)


def test_yaml_needs_the_plan_extra_and_json_does_not(tmp_path: Path) -> None:
    yaml_path = tmp_path / "jobs.yaml"
    yaml_path.write_text(GOOD)
    without_yaml = [sys.executable, "-c", WITHOUT_YAML]
    one_line_refusal(plan(str(yaml_path), python=without_yaml), "timeshare[plan]")
    import yaml

    json_path = tmp_path / "jobs.json"
    json_path.write_text(json.dumps(yaml.safe_load(GOOD)))
    done = plan(str(json_path), python=without_yaml)
    assert done.returncode == 0, done.stderr
    assert LAST_LINE.fullmatch(done.stdout.strip().splitlines()[-1])


def test_profiles_from_timeshare_profile_are_accepted_as_jobs(tmp_path: Path) -> None:
    measured = [
        JobSpec(name=name, state_gib=4.0, iteration=[Phase(gpu=gpu), Phase(cpu=1.5)])
        for name, gpu in (("from-history-a", 0.5), ("from-history-b", 0.8))
    ]
    run = GroupModel(measured, sets(), GroupPolicy(co_residency="off"), StackCosts(),
                     record_history=True).run(10)  # fmt: skip
    assert run.history is not None
    profiles = [profile_job(j.name, ["n"], run.history, StackCosts()) for j in measured]
    # What `timeshare profile --json` prints for each job, measured figures included.
    jobs = [p.model_dump(mode="json") for p in profiles]
    assert all(job["measured"]["turns"] >= 10 for job in jobs)
    document = {"jobs": jobs, "gpu_sets": sets().model_dump(mode="json")}
    path = tmp_path / "profiled.json"
    path.write_text(json.dumps(document))
    result = plan(str(path))
    assert result.returncode == 0, result.stderr
    assert "from-history-a" in result.stdout and "from-history-b" in result.stdout


def test_a_job_that_fits_nowhere_is_one_line_and_exit_code_2(tmp_path: Path) -> None:
    path = tmp_path / "jobs.yaml"
    path.write_text(GOOD.replace("gpus: 1\n    state", "gpus: 2\n    state"))
    one_line_refusal(plan(str(path)), "job grpo-a cannot fit anywhere", "needs 2 GPUs")


def test_no_file_and_no_from_groups_is_refused() -> None:
    one_line_refusal(plan(), "FILE.yaml", "--from-groups")


def test_the_advisor_imports_no_temporalio() -> None:
    probe = (
        "import sys, timeshare.placement.plan_cli, timeshare.placement.profile_cli;"
        "sys.exit(1 if any(m.startswith('temporalio') for m in sys.modules) else 0)"
    )
    assert subprocess.run([sys.executable, "-c", probe], cwd=REPO).returncode == 0
