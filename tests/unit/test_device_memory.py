"""Where `timeshare up` keeps what its simulated GPUs hold: in memory that
outlives the stack but not the machine, one folder per stack, forgotten when
the stack stops with nothing on its simulated GPUs."""

from __future__ import annotations

from pathlib import Path

from timeshare.activities.backends.base import BackendConfig
from timeshare.activities.backends.sim import SimBackend
from timeshare.activities.backends.sim_memory import forget_if_nothing_held, sim_state_path


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


async def test_a_stopped_stack_forgets_simulated_gpus_that_hold_nothing(tmp_path: Path) -> None:
    """The sim backend's own file: kept while a job is on (or off) its GPU,
    gone with its folder once every job is released."""
    memory = tmp_path / "shm"
    memory.mkdir()
    path = sim_state_path(tmp_path / "data", "n", root=memory)
    path.parent.mkdir()
    backend = SimBackend(BackendConfig(node="n", sim_state_bytes=1 << 20, sim_state_path=str(path)))
    await backend.restore("g", "a")
    assert not forget_if_nothing_held(path)  # job a is on the GPU
    await backend.checkpoint("g", "a")
    assert not forget_if_nothing_held(path)  # job a's state is in host memory
    assert path.exists()
    await backend.release("g", "a")
    assert forget_if_nothing_held(path)
    assert not path.parent.exists()


def test_forgetting_leaves_what_is_not_the_stacks_own(tmp_path: Path) -> None:
    """A state file given by hand (in a folder that holds other things) loses
    only the file; an unreadable file stays."""
    given = tmp_path / "mine" / "gpus.json"
    given.parent.mkdir()
    given.write_text("[]")
    (given.parent / "notes.txt").write_text("keep")
    assert forget_if_nothing_held(given)
    assert not given.exists() and (given.parent / "notes.txt").exists()
    torn = tmp_path / "torn.json"
    torn.write_text("[{")
    assert not forget_if_nothing_held(torn) and torn.exists()
    assert not forget_if_nothing_held(tmp_path / "never-written.json")
