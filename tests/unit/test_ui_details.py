"""What a group's page in the Temporal UI says, as text: the current details
one field per line, the static details from the policy. Read from the dev
server's own UI in headless Chromium: tests/integration/test_ui_details.py."""

from __future__ import annotations

from timeshare.models import GroupPolicy
from timeshare.scheduling.reporting import GroupSummary
from timeshare.workflows.ui_text import current_details, group_details


def test_a_degraded_group_names_its_cause_on_a_line_of_its_own() -> None:
    summary = GroupSummary(
        group="g",
        state="degraded",
        holder="a",
        holder_phase="train",
        yield_epoch=3,
        epoch=3,
        switches=5,
        degraded_cause="switch failing: node n1: *boom*\n| again (attempt 2)",
        queue=("b", "c"),
        ordering="fifo",
        phase_priority=(("rollout", -1), ("train", 2)),
        resident=(("n1", "a"), ("n2", "c")),
        backfill=("c",),
    )
    assert current_details(summary).splitlines()[2:] == [
        "- **holder**: a (train), asked to yield",
        "- **queue**: b, c",
        "- **backfill**: c",
        "- **state**: degraded, epoch 3, 5 switches",
        # Markup in a cause is shown as written, and a line break as a space.
        r"- **degraded**: switch failing: node n1: \*boom\* \| again (attempt 2)",
        "- **ordering**: fifo",
        "- **phase priority**: rollout -1, train +2",
        "- **node n1**: a",
        "- **node n2**: c",
    ]


def test_static_details_follow_the_policy() -> None:
    default = group_details("g", GroupPolicy()).splitlines()
    assert "- **GPUs**: all of each node's" in default
    assert "- **long turns**: no limit: a job holds the turn until it yields" in default
    assert not any(line.startswith("- **phase priority**") for line in default)
    chosen = group_details(
        "g",
        GroupPolicy(ordering="fifo", gpus=[1, 0], co_residency="off", phase_priority={"train": 1}),
    ).splitlines()
    assert "- **GPUs**: 0, 1 of each node" in chosen
    assert "- **co-residency**: off: every switch checkpoints the job that ran" in chosen
    assert "- **phase priority**: train +1" in chosen
    assert any(line.startswith("- **ordering**: fifo") for line in chosen)
