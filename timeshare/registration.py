"""Register a GPU worker process with its node's agent, so that switches
freeze or checkpoint exactly the job's own processes.

Call it inside each GPU worker (not in the process that acquires turns: a
frozen coordinator could never ask for its next turn)."""

from __future__ import annotations

import json
import os
import socket

from timeshare.errors import FailedPrecondition, PermissionDenied, Unavailable

DEFAULT_SOCKET = "/run/timeshare/agent.sock"


def agent_socket(path: str | None = None) -> str:
    return path or os.environ.get("TIMESHARE_AGENT_SOCKET") or DEFAULT_SOCKET


def register_process(
    group: str, job: str, socket_path: str | None = None, pid: int | None = None
) -> int:
    """Register this process (or, for root or its owner, ``pid``) as one of
    ``job``'s processes on this node; returns the process id the agent saw."""
    path = agent_socket(socket_path)
    message = {"op": "register", "group": group, "job": job, "pid": pid}
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
            conn.settimeout(10)
            conn.connect(path)
            conn.sendall(json.dumps(message).encode() + b"\n")
            reply = json.loads(conn.makefile("rb").readline() or b"{}")
    except OSError as error:
        raise Unavailable(
            f"no node agent answers on {path} ({error}); start `timeshare agent`, "
            "or set TIMESHARE_AGENT_SOCKET"
        ) from None
    if not reply.get("ok"):
        error_text = str(reply.get("error", "refused"))
        refused = PermissionDenied if "root or the owner" in error_text else FailedPrecondition
        raise refused(error_text)
    return int(reply["pid"])
