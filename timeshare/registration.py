"""Register a GPU worker process with its node's agent, so that switches
freeze or checkpoint exactly the job's own processes.

Call it inside each GPU worker (not in the process that acquires turns: a
frozen coordinator could never ask for its next turn)."""

from __future__ import annotations

import json
import os
import socket
from typing import Any, BinaryIO

from timeshare.errors import FailedPrecondition, PermissionDenied, Unavailable

DEFAULT_SOCKET = "/run/timeshare/agent.sock"


def agent_socket(path: str | None = None) -> str:
    return path or os.environ.get("TIMESHARE_AGENT_SOCKET") or DEFAULT_SOCKET


def register_process(
    group: str, job: str, socket_path: str | None = None, pid: int | None = None
) -> int:
    """Register this process (or, for root or its owner, ``pid``) as one of
    ``job``'s processes on this node; returns the process id the agent saw."""
    message = {"op": "register", "group": group, "job": job, "pid": pid}
    conn, _lines, reply = open_agent_connection(agent_socket(socket_path), message)
    conn.close()
    return int(reply["pid"])


# A release restores device state: gigabytes, on a busy node.
FORGET_SECONDS = 600.0


def forget_job(group: str, job: str, socket_path: str | None = None) -> str:
    """Have this node's agent release a job's processes (thawed, restored where
    they fit, never left stopped) and forget them, as it does by itself when
    the job leaves its group; root or the owner of the processes only. Returns
    what the agent did, in words."""
    message = {"op": "forget", "group": group, "job": job}
    conn, _lines, reply = open_agent_connection(agent_socket(socket_path), message, FORGET_SECONDS)
    conn.close()
    released = reply.get("released") or {}
    return str(released.get("summary") or f"job {group}/{job} released")


def open_agent_connection(
    path: str, message: dict[str, Any], timeout: float = 10.0
) -> tuple[socket.socket, BinaryIO, dict[str, Any]]:
    """Send the first line of a conversation with the agent and read its
    answer; the connection stays open for what follows (workload hooks)."""
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        conn.settimeout(timeout)
        conn.connect(path)
        conn.sendall(json.dumps(message).encode() + b"\n")
        lines = conn.makefile("rb")
        reply = json.loads(lines.readline() or b"{}")
    except (OSError, ValueError) as error:
        conn.close()
        raise Unavailable(
            f"no node agent answers on {path} ({error}); start `timeshare agent`, "
            "or set TIMESHARE_AGENT_SOCKET"
        ) from None
    if not isinstance(reply, dict) or not reply.get("ok"):
        conn.close()
        error_text = str(reply.get("error", "refused") if isinstance(reply, dict) else reply)
        refused = PermissionDenied if "only root or the owner" in error_text else FailedPrecondition
        raise refused(error_text)
    conn.settimeout(None)
    return conn, lines, reply
