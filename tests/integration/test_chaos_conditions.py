"""A slow and a lossy link to Temporal, and a gateway whose clock is 2 s
off, each once in a chaos run: nothing lost (tests/chaos_kinds.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.chaos_kinds import each_once


@pytest.mark.chaos
@pytest.mark.timeout(600)
def test_a_slow_link_a_lossy_link_and_a_skewed_clock_lose_nothing(tmp_path: Path) -> None:
    each_once(["slow-link", "lossy-link", "clock-skew"], 0.5, tmp_path)
