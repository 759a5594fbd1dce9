"""Where `timeshare up` keeps what its simulated GPUs hold: in memory that
outlives the stack but not the machine, one folder per stack."""

from __future__ import annotations

from pathlib import Path

from timeshare.workers.device_memory import sim_state_path


def test_a_stack_finds_its_simulated_gpus_again_and_no_other_stack_shares_them(
    tmp_path: Path,
) -> None:
    memory = tmp_path / "shm"
    memory.mkdir()
    first = sim_state_path(tmp_path / "stack-a", "node-1", root=memory)
    assert first.is_relative_to(memory)
    assert first.name == "sim-state-node-1.json"
    # Started again, from another directory, with the same data directory.
    again = sim_state_path(tmp_path / "elsewhere" / ".." / "stack-a", "node-1", root=memory)
    assert again == first
    other = sim_state_path(tmp_path / "stack-b", "node-1", root=memory)
    assert other.parent != first.parent
    assert sim_state_path(tmp_path / "stack-a", "node-2", root=memory).parent == first.parent


def test_without_device_memory_the_state_stays_in_the_data_directory(tmp_path: Path) -> None:
    no_tmpfs = tmp_path / "absent"  # as on a machine without /dev/shm
    assert sim_state_path(tmp_path / "data", "n", root=no_tmpfs) == tmp_path / "data" / (
        "sim-state-n.json"
    )
