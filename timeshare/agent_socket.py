"""Where a job finds its node agent's socket, and where `timeshare up` puts
its agent's, so that the two agree with no variable to set.

A job looks, in order, at:

1. ``TIMESHARE_AGENT_SOCKET``, when set (then nowhere else);
2. ``/run/timeshare/agent.sock``: a node's agent run as a service
   (`timeshare agent`, the Kubernetes DaemonSet, the systemd unit);
3. this user's own runtime folder: where `timeshare up` puts its agent's
   socket (``$XDG_RUNTIME_DIR/timeshare/agent.sock``; without that
   variable, /run/timeshare/agent.sock for root, else
   /tmp/timeshare-UID/agent.sock, a folder only its owner may use, as
   tmux's is). A folder of that name that another user owns, or that others
   may write to, is passed over: a socket there could be anyone's.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

AGENT_SOCKET_ENV = "TIMESHARE_AGENT_SOCKET"
SYSTEM_AGENT_SOCKET = "/run/timeshare/agent.sock"
SOCKET_NAME = "agent.sock"


def runtime_folder() -> Path:
    """This user's folder for `timeshare up`'s socket (not created here)."""
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if runtime:
        return Path(runtime) / "timeshare"
    if os.geteuid() == 0:
        return Path(SYSTEM_AGENT_SOCKET).parent
    return Path("/tmp") / f"timeshare-{os.geteuid()}"


def local_agent_socket() -> str:
    """Where `timeshare up` serves its agent's socket by default:
    TIMESHARE_AGENT_SOCKET when set, else this user's runtime folder."""
    return os.environ.get(AGENT_SOCKET_ENV) or str(runtime_folder() / SOCKET_NAME)


def private_to_me(folder: Path) -> bool:
    """The folder is this user's and nobody else may write into it."""
    try:
        info = folder.stat()
    except OSError:
        return False
    others_write = stat.S_IWGRP | stat.S_IWOTH
    return info.st_uid == os.geteuid() and not info.st_mode & others_write


def candidates() -> list[str]:
    """Where a job looks for its agent, in order (see the module's docstring)."""
    given = os.environ.get(AGENT_SOCKET_ENV)
    if given:
        return [given]
    own = runtime_folder() / SOCKET_NAME
    return list(dict.fromkeys([SYSTEM_AGENT_SOCKET, str(own)]))


def trusted(path: str) -> bool:
    """The service's socket (root's folder), or one in a folder that is this user's alone."""
    return path == SYSTEM_AGENT_SOCKET or private_to_me(Path(path).parent)


def agent_socket(path: str | None = None) -> str:
    """The socket a job talks to: ``path`` when given, else the first of the
    candidates that exists and is trusted, else the first candidate (whose
    absence the caller's error then names). A socket named by the variable
    is taken as it is: whoever set it chose it."""
    if path:
        return path
    found = candidates()
    if len(found) == 1:
        return found[0]
    for candidate in found:
        if os.path.exists(candidate) and trusted(candidate):
            return candidate
    return found[0]


def where_looked() -> str:
    """For an error: where a job looked for its agent, in words."""
    found = candidates()
    if len(found) == 1:
        return f"{found[0]} (from {AGENT_SOCKET_ENV})"
    return " and ".join(found)
