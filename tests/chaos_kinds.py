"""A chaos run of some of bench chaos's faults beyond a kill, each once in
turn (tests/integration/test_chaos_conditions.py, test_chaos_losses.py):
nothing lost, granted twice or overlapped, no group stuck, and each fault
did what it says (the run prints each one's outcome)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.conftest import REPO

# What each kind's line says it did.
DID = {
    "slow-link": "ms each way",
    "lossy-link": "every connection cut",
    "clock-skew": "clock ",
    "machine": "all started again",
    "host-memory": "switches failed naming it",
    "stuck-group": "healed",
}


def each_once(kinds: list[str], minutes: float, workdir: Path) -> None:
    """``minutes``: long enough for every fault (a gap of 1-2 s before each,
    then its own while of 1.5-2 s), while the jobs still ask for turns."""
    run = subprocess.run(
        [sys.executable, "-m", "bench", "chaos", "--minutes", str(minutes), "--kinds",
         ",".join(kinds), "--in-turn", "--faults", str(len(kinds)), "--gap", "1", "2",
         "--window", "1.5", "2", "--workdir", str(workdir)],
        capture_output=True, text=True, cwd=REPO, timeout=540,
    )  # fmt: skip
    output = run.stdout + run.stderr[-4000:]
    figures = dict(item.split("=", 1) for item in run.stdout.strip().splitlines()[-1].split())
    assert figures["faults"] == str(len(kinds)), output
    for clean in ("lost", "double_grants", "overlaps", "stuck"):
        assert figures[clean] == "0", output
    faults = [line for line in run.stderr.splitlines() if "] fault " in line]
    for kind in kinds:
        (line,) = [f for f in faults if f": {kind} on " in f]
        assert DID[kind] in line, output
    assert run.returncode == 0, output
