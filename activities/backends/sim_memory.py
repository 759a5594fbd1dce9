"""Where a simulated GPU keeps what it holds when nobody says (`--sim-state`).

A real GPU's memory outlives the agent (the job's processes hold it) but not
the machine, so the faithful place is a tmpfs: /dev/shm, when it is there and
writable. It is cheaper too: the agent rewrites the file at every simulated
move on its one event loop, and on a disk each rewrite waits for the file
system's journal (`python -m bench handover --sim-switch DIR`: 1.5 ms per
zero-byte switch on tmpfs against 2.4-4.9 ms on this project's disk).

The folder is named after the stack's data directory, so a stack started
again with the same directory finds what its GPUs held, and two stacks on one
machine never share a simulated GPU. A stack that stops with nothing on its
simulated GPUs removes both (forget_if_nothing_held).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
from pathlib import Path

from timeshare.activities.backends.sim import saved_state_holds_nothing

DEVICE_MEMORY_ROOT = Path("/dev/shm")
FOLDER_PREFIX = "timeshare-sim-"


def sim_state_path(data_dir: Path, node: str, root: Path = DEVICE_MEMORY_ROOT) -> Path:
    """The sim state file of ``node`` for the stack in ``data_dir``: under
    ``root`` (a tmpfs) if it can be written there, else in ``data_dir``."""
    name = f"sim-state-{node}.json"
    digest = hashlib.sha256(str(data_dir.resolve()).encode()).hexdigest()[:16]
    folder = root / f"{FOLDER_PREFIX}{digest}"
    # Made by the sim backend when it starts, so a stack that fails before
    # its agent runs leaves nothing here.
    where = folder if folder.exists() else root
    if not (where.is_dir() and os.access(where, os.W_OK)):  # no tmpfs, or another user's
        return data_dir / name
    return folder / name


def forget_if_nothing_held(state_path: Path) -> bool:
    """Remove a stopped stack's sim state file if its simulated GPUs hold
    nothing, and its device-memory folder once that is empty: a GPU that
    holds nothing leaves nothing to find at the next start. A file that
    holds a job (or that cannot be read) stays, as a GPU's memory would."""
    if not saved_state_holds_nothing(state_path):
        return False
    state_path.unlink(missing_ok=True)
    folder = state_path.parent
    if folder.name.startswith(FOLDER_PREFIX):
        # Something else in it is not ours to remove.
        with contextlib.suppress(OSError):
            folder.rmdir()
    return True
