"""`timeshare profile GROUP [--json]`: each member job's profile, derived
from the group's recorded history."""

from __future__ import annotations

import argparse
import json
import sys

from timeshare.errors import TimeshareError
from timeshare.placement.profile import profile_group
from timeshare.placement.spec import GIB, JobSpec
from timeshare.status import table


def iteration_text(job: JobSpec) -> str:
    return " / ".join(f"{'gpu' if p.on_gpu else 'cpu'} {p.seconds:.3f}" for p in job.iteration)


def profiles_table(jobs: list[JobSpec]) -> str:
    rows = []
    for job in jobs:
        measured = job.measured
        assert measured is not None
        by_node = measured.state_bytes_by_node.items()
        state = ", ".join(f"{node} {count / GIB:.2f}" for node, count in by_node)
        rows.append(
            [
                job.name,
                f"{measured.turns} ({measured.iterations})",
                iteration_text(job),
                f"{measured.duty_cycle:.0%}",
                state or "unknown (never checkpointed)",
                f"{measured.switch_seconds_mean:.3f} ({measured.switches_in})",
            ]
        )
    headers = ["job", "turns (iterations)", "iteration s", "duty", "state GiB by node",
               "switch-in s (n)"]  # fmt: skip
    return table(headers, rows)


def cmd_profile(args: argparse.Namespace) -> int:
    import timeshare

    try:
        with timeshare.connect(args.address) as client:
            status = client.get_group(args.group)
            history = client.group_history(args.group)
    except (TimeshareError, ValueError) as error:
        print(f"timeshare profile: {error}", file=sys.stderr)
        return 1
    jobs, skipped = profile_group(status, history)
    if args.json:
        document = {
            "group": args.group,
            "jobs": [job.model_dump(mode="json") for job in jobs],
            "skipped": [f"job {name}: {why}" for name, why in skipped.items()],
        }
        print(json.dumps(document, indent=1))
        return 0
    if jobs:
        print(profiles_table(jobs))
    for name, why in skipped.items():
        print(f"not profiled: job {name}: {why}")
    if not jobs and not skipped:
        print(f"group {args.group} has no jobs")
    return 0
