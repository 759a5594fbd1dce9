"""Faults against the real stack, as separate processes: after each, every
surviving job gets all its turns and the simulated GPU never held two jobs'
state. (Timings of the same scenarios: `python -m bench faults`.)"""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.faults import FAULTS, run_fault


@pytest.mark.parametrize("fault", list(FAULTS))
def test_the_stack_recovers_by_itself(fault: str, tmp_path: Path) -> None:
    result = run_fault(fault, tmp_path)
    assert result.failed_jobs == []
    assert result.lost_requests == 0
    assert result.overlaps == 0
