"""The chaos run's checks, on records made up for them: they see lost acquires
and double grants, a stuck group is explained from the schedulers' logs, and
a run whose only failure is a group stuck on the known SDK bug
(docs/reliability.md, "Limits") is told apart. The run itself:
tests/integration/test_chaos.py."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from bench.parts.chaos_check import JobRecord, double_grants, errors, lost, turns_completed
from bench.parts.chaos_stuck import SDK_BUG_HINT, explain, only_the_known_sdk_bug


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


# The report of a chaos run that met the SDK bug (its stuck group's and lost
# acquires' lines, shortened).
SDK_BUG_REPORT = [
    "job processes: 10 started, 1 killed and replaced",
    "lost acquires: chaos-2/g2-j0: no answer",
    "lost acquires: chaos-2/g2-j1.9: no answer",
    "stuck groups: chaos-2: UNAVAILABLE: group 'chaos-2' is stuck: the scheduler fails its "
    "workflow task",
    "why stuck: chaos-2: history saved to /tmp/run/chaos-2-history.json",
    "why stuck: scheduler.log: [TMPRL1100] Nondeterminism error: Update machine does not handle "
    f"this event: HistoryEvent(id: 167, UpsertWorkflowSearchAttributes) ({SDK_BUG_HINT})",
    "errors of live jobs: chaos-2/g2-j2 after yielding: UNAVAILABLE: group 'chaos-2' is stuck",
    "turns=78 faults=3 lost=3 double_grants=0 overlaps=0 stuck=1 recovery_p50_s=2.92 "
    "recovery_max_s=5.29",
]


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
        f"event: HistoryEvent(id: 140, UpsertWorkflowSearchAttributes) ({SDK_BUG_HINT})",
        'scheduler.log: Nondeterminism error: Timer machine does not handle this event: \\"x\\"',
    ]


def test_only_a_group_stuck_on_the_known_sdk_bug_is_told_apart() -> None:
    assert only_the_known_sdk_bug(SDK_BUG_REPORT)
    clean_run = ["turns=78 faults=3 lost=0 double_grants=0 overlaps=0 stuck=0"]
    assert not only_the_known_sdk_bug(clean_run)
    own_bug = [
        line.replace("Update machine does not handle", "Timer machine does not handle")
        for line in SDK_BUG_REPORT
    ]
    assert not only_the_known_sdk_bug(own_bug)
    lost_elsewhere = [*SDK_BUG_REPORT[:1], "lost acquires: chaos-0/g0-j1: no answer"]
    assert not only_the_known_sdk_bug(lost_elsewhere + SDK_BUG_REPORT[1:])
    error_elsewhere = [*SDK_BUG_REPORT[:1], "errors of live jobs: chaos-1/g1-j0 after yielding: x"]
    assert not only_the_known_sdk_bug(error_elsewhere + SDK_BUG_REPORT[1:])
    granted_twice = ["double grants: chaos-2: epoch 4 granted 2 times", *SDK_BUG_REPORT]
    assert not only_the_known_sdk_bug(granted_twice)
    overlap = [*SDK_BUG_REPORT[:-1], SDK_BUG_REPORT[-1].replace("overlaps=0", "overlaps=1")]
    assert not only_the_known_sdk_bug(overlap)
    unexplained = [line for line in SDK_BUG_REPORT if "Nondeterminism" not in line]
    assert not only_the_known_sdk_bug(unexplained)
