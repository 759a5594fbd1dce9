"""Scripted faults against the real stack, as separate processes: after
each, every acquire of a surviving job is answered, no live job meets an
error, and the simulated GPU never held two jobs' state. (Timings of the
same scenarios: `python -m bench chaos --scripted`.)"""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.parts.chaos_faults import SCRIPTED, run_scripted


@pytest.mark.parametrize("fault", list(SCRIPTED))
def test_the_stack_recovers_by_itself(fault: str, tmp_path: Path) -> None:
    result = run_scripted(fault, tmp_path)
    assert result.failed_jobs == []
    assert result.lost_requests == 0
    assert result.overlaps == 0
