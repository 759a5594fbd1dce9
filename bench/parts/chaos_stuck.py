"""Why a group was stuck at the end of a chaos run: the nondeterminism errors
the scheduler workers logged, and the group's history saved beside the run's
records, where `tests/integration/test_replay.py`'s replayer (or `temporal workflow
show`) can read it, before the stack and its Temporal stop."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

from timeshare.names import group_workflow_id
from timeshare.workers.common.service import StartupError, connect_temporal

# The SDK core's terminal colouring in its log lines.
ANSI = re.compile(r"\x1b\[[0-9;]*m")
# How the core quotes a failed workflow task's message in its log line.
NONDETERMINISM = re.compile(
    r'message: "(?P<message>(?:[^"\\]|\\.)*Nondeterminism error(?:[^"\\]|\\.)*)"'
)
# What the known SDK bug (docs/reliability.md, "Limits") says on replay.
SDK_BUG_SIGN = "Update machine does not handle this event"
SDK_BUG_HINT = (
    "the known SDK bug (docs/reliability.md, 'A known SDK bug can leave a group stuck'); "
    "compare the saved history with tests/histories/sdk-bugs/"
)


def nondeterminism_errors(log_text: str) -> list[str]:
    """Each distinct nondeterminism error in a scheduler's log, in order."""
    found: list[str] = []
    for match in NONDETERMINISM.finditer(ANSI.sub("", log_text)):
        message = match.group("message")
        if message not in found:
            found.append(message)
    return found


def explain(logs: list[Path]) -> list[str]:
    """What the schedulers' logs say about failed workflow tasks, one line each."""
    lines = []
    for path in logs:
        if not path.exists():
            continue
        for message in nondeterminism_errors(path.read_text(errors="replace")):
            hint = f" ({SDK_BUG_HINT})" if SDK_BUG_SIGN in message else ""
            lines.append(f"{path.name}: {message}{hint}")
    return lines


async def _save_all(address: str, groups: list[str], workdir: Path) -> list[str]:
    try:
        client = await connect_temporal(address)
    except StartupError as error:
        return [f"{group}: history not saved ({error})" for group in groups]
    lines = []
    for group in groups:
        path = workdir / f"{group}-history.json"
        try:
            history = await client.get_workflow_handle(group_workflow_id(group)).fetch_history()
            path.write_text(history.to_json())  # as the Temporal UI downloads it
            lines.append(f"{group}: history saved to {path}")
        except Exception as error:  # a report line, never a second failure
            lines.append(f"{group}: history not saved ({type(error).__name__}: {error})")
    return lines


def save_histories(address: str, groups: list[str], workdir: Path) -> list[str]:
    """Save each group's history; one line each saying where, or why not."""
    return asyncio.run(_save_all(address, groups, workdir))


def only_the_known_sdk_bug(report: list[str]) -> bool:
    """Whether a chaos run's report (its printed lines) failed only by groups
    stuck on the known SDK bug: each nondeterminism error logged is the bug's,
    and every lost acquire and every live job's error is in a stuck group.
    A double grant, an overlap or a part that exited by itself is never this."""
    stuck = {line.split(": ")[1] for line in report if line.startswith("stuck groups: ")}
    errors = [line.split(": ", 2)[2] for line in report if line.startswith("why stuck: ")]
    errors = [e for e in errors if "Nondeterminism error" in e]
    in_stuck = all(
        line.split(": ")[1].split("/")[0] in stuck
        for line in report
        if line.startswith(("lost acquires: ", "errors of live jobs: "))
    )
    others = any(line.startswith(("double grants: ", "parts that exited")) for line in report)
    last = dict(item.split("=", 1) for item in report[-1].split()) if report else {}
    return (
        bool(stuck and errors)
        and all(SDK_BUG_SIGN in e for e in errors)
        and in_stuck
        and not others
        and last.get("double_grants") == "0"
        and last.get("overlaps") == "0"
    )
