"""The whole machine lost at once, a node out of host memory while it
parks a job, and a group whose history its schedulers cannot replay, each
once in a chaos run: nothing lost, the group healed (tests/chaos_kinds.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.chaos_kinds import each_once


@pytest.mark.chaos
@pytest.mark.timeout(600)
def test_a_lost_machine_short_host_memory_and_a_stuck_group_lose_nothing(tmp_path: Path) -> None:
    each_once(["machine", "host-memory", "stuck-group"], 0.6, tmp_path)
