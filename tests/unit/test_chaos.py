"""The chaos run's checks, on records made up for them: they see lost acquires
and double grants, a stuck group is explained from the schedulers' logs, and
the groups the schedulers healed are read from their logs. The run itself:
tests/integration/test_chaos.py."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from bench.parts.chaos_check import JobRecord, double_grants, errors, lost, turns_completed
from bench.parts.chaos_stuck import explain, heals, heals_made


def record(path: Path, group: str, job: str, *events: dict[str, Any]) -> JobRecord:
    path.write_text("".join(json.dumps(e) + "\n" for e in events))
    return JobRecord(group, job, path)


def step(event: str, at: float, **fields: Any) -> dict[str, Any]:
    return {"event": event, "at": at, **fields}


ESC = "\x1b"


# A scheduler's log line as the SDK core writes it when a workflow task fails
# on replay (coloured even into a file), with the known SDK bug's message.
SDK_BUG_LINE = (
    f"{ESC}[2m2026-12-03T19:02:11.5Z{ESC}[0m {ESC}[33m WARN{ESC}[0m Failing workflow task "
    f"{ESC}[3mrun_id{ESC}[0m{ESC}[2m={ESC}[0m01a2 {ESC}[3mfailure{ESC}[0m{ESC}[2m={ESC}[0m"
    'Failure { failure: Some(Failure { message: "[TMPRL1100] Nondeterminism error: Update '
    "machine does not handle this event: HistoryEvent(id: 140, UpsertWorkflowSearchAttributes)"
    '", source: "", stack_trace: "" }) }'
)


OWN_BUG_LINE = (
    "Failing workflow task run_id=01a3 failure=Failure { failure: Some(Failure { message: "
    '"Nondeterminism error: Timer machine does not handle this event: \\"x\\"", source: "" }) }'
)


def test_the_checks_see_what_went_wrong(tmp_path: Path) -> None:
    a = record(
        tmp_path / "a", "g", "a", step("joined", 0), step("requested", 1),
        step("granted", 2, epoch=1), step("yielding", 5), step("yielded", 5.1),
        step("requested", 6),
    )  # fmt: skip
    # b's turn starts inside a's, and repeats a's epoch later.
    b = record(
        tmp_path / "b", "g", "b", step("requested", 1), step("granted", 4, epoch=2),
        step("yielding", 6), step("yielded", 6.1), step("requested", 7),
        step("granted", 8, epoch=1), step("yielding", 9), step("error", 9.5, message="gone"),
    )  # fmt: skip
    # Killed while waiting: its acquire is not lost. Its turn in another group
    # ends when it was killed, before c's.
    dead = record(tmp_path / "dead", "h", "dead", step("granted", 1, epoch=1), step("requested", 3))
    dead.killed_at = 2.0
    c = record(tmp_path / "c", "h", "c", step("requested", 1), step("granted", 2.5, epoch=2))

    assert turns_completed([a, b, dead, c]) == 2
    assert lost([a, b, dead, c]) == ["g/a: no answer"]
    assert errors([a, b, dead, c]) == ["g/b after yielding: gone"]
    assert double_grants([a, b, dead, c], run_end=20) == [
        "g: b (epoch 2) granted while a (epoch 1) held",
        "g: epoch 1 granted 2 times",
    ]
    dead.killed_at = 3.0
    assert double_grants([dead, c], run_end=20) == [
        "h: c (epoch 2) granted while dead (epoch 1) held"
    ]


def test_a_stuck_group_is_explained_from_the_schedulers_logs(tmp_path: Path) -> None:
    (tmp_path / "scheduler.log").write_text(
        "\n".join(["ready", SDK_BUG_LINE, SDK_BUG_LINE, OWN_BUG_LINE, "other"]) + "\n"
    )
    (tmp_path / "scheduler-2.log").write_text("timeshare scheduler: ready\n")
    lines = explain([tmp_path / "scheduler.log", tmp_path / "scheduler-2.log"])
    assert lines == [
        "scheduler.log: [TMPRL1100] Nondeterminism error: Update machine does not handle this "
        "event: HistoryEvent(id: 140, UpsertWorkflowSearchAttributes)",
        'scheduler.log: Nondeterminism error: Timer machine does not handle this event: \\"x\\"',
    ]


def test_the_groups_a_scheduler_healed_are_read_from_its_log(tmp_path: Path) -> None:
    (tmp_path / "scheduler.log").write_text(
        "\n".join([
            "timeshare scheduler: ready",
            "group chaos-1 healed: run 01a2 failed its workflow task (nondeterminism: x); new "
            "run 01a3 rebuilt from the run's start and 9 later facts",
            # The new run's own line, from the workflow: not the scheduler's count.
            "group chaos-1: healed from the run's start and 9 later facts",
            f"{ESC}[2mgroup chaos-2 heals again in 41 s: it was rebuilt 3 times{ESC}[0m",
        ]) + "\n"
    )  # fmt: skip
    assert heals([tmp_path / "scheduler.log", tmp_path / "absent.log"]) == [
        "scheduler.log: chaos-1 healed: run 01a2 failed its workflow task (nondeterminism: x); "
        "new run 01a3 rebuilt from the run's start and 9 later facts",
        "scheduler.log: chaos-2 heals again in 41 s: it was rebuilt 3 times",
    ]


def test_a_run_healed_by_both_schedulers_counts_once() -> None:
    lines = [
        "scheduler.log: chaos-1 healed: run 01a2 failed its workflow task (x); new run 01a3 ...",
        "scheduler-2.log: chaos-1 healed: run 01a2 failed its workflow task (x); new run 01a3 ...",
        "scheduler-2.log: chaos-1 healed: run 01a3 failed its workflow task (x); new run 01a4 ...",
        "scheduler.log: chaos-2 heals again in 41 s: it was rebuilt 3 times",
    ]
    assert heals_made(lines) == 2
