"""What `timeshare up` checks before it starts a process: that its agent's
socket is its own to take. The agent would remove a socket left where it
serves (one left by an agent that did not stop cleanly), so a second `up`
must not silently take over the first one's."""

from __future__ import annotations

import os
import socket
from pathlib import Path

from timeshare.agent_socket import private_to_me
from timeshare.workers.common.service import StartupError

PRIVATE_FOLDER_MODE = 0o700


def someone_answers(path: str) -> bool:
    """A process accepts connections on the Unix socket at ``path``."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        probe.settimeout(1.0)
        try:
            probe.connect(path)
        except OSError:
            return False
    return True


def check_agent_socket_free(path: str, given: bool) -> None:
    """Raise StartupError, in one line, where the agent could not serve at
    ``path`` or would take it from another agent. For the default path (not
    ``given``), make its folder, private to this user, as the jobs that look
    there expect (timeshare.agent_socket)."""
    if os.path.exists(path) and someone_answers(path):
        raise StartupError(
            f"an agent already serves {path} (another `timeshare up`?): stop it, "
            "or give this stack its own with --socket PATH"
        )
    if given:
        return
    folder = Path(path).parent
    try:
        folder.mkdir(mode=PRIVATE_FOLDER_MODE, parents=True, exist_ok=True)
    except OSError as error:
        raise StartupError(f"cannot make {folder}: {error.strerror}; pass --socket PATH") from None
    if not private_to_me(folder):
        raise StartupError(
            f"{folder} is not this user's alone (another user owns it, or others may "
            "write to it), so jobs would not trust a socket there: pass --socket PATH"
        )
