"""Why a group was stuck at the end of a chaos run, and which groups healed
on the way: the nondeterminism errors the scheduler workers logged, the
heals they logged, and a stuck group's history saved beside the run's
records, where `tests/integration/test_replay.py`'s replayer (or `temporal
workflow show`) can read it, before the stack and its Temporal stop."""

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
# What a scheduler logs when it heals a group, or holds a heal off a while
# (timeshare.workers.scheduler.healing.healer).
HEALED = re.compile(r"group (?P<group>\S+) (?P<what>healed: .*|heals again in .*)")
HEALED_RUN = re.compile(r" healed: run (\S+)")


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
    return [f"{name}: {message}" for name, text in _read(logs)
            for message in nondeterminism_errors(text)]  # fmt: skip


def heals(logs: list[Path]) -> list[str]:
    """Each group a scheduler healed, or found it could not, one line each."""
    return [f"{name}: {found.group('group')} {found.group('what')[:300]}"
            for name, text in _read(logs) for found in HEALED.finditer(text)]  # fmt: skip


def heals_made(lines: list[str]) -> int:
    """How many runs were healed: two schedulers that heal one failed run
    start the one new run (new_run.start_healed_run), and both log it."""
    return len({found.group(1) for line in lines if (found := HEALED_RUN.search(line))})


def _read(logs: list[Path]) -> list[tuple[str, str]]:
    """Each log that exists, by name, its colours taken out."""
    return [(p.name, ANSI.sub("", p.read_text(errors="replace"))) for p in logs if p.exists()]


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
