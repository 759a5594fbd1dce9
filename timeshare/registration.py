"""Register a GPU worker process with its node's agent, so that switches
freeze or checkpoint exactly the job's own processes.

Call it inside each GPU worker (not in the process that acquires turns: a
frozen coordinator could never ask for its next turn), after the job has
joined its group: the agent admits a process into a job only with that job's
token (timeshare.credentials), and knows the token only once Join made it."""

from __future__ import annotations

import json
import os
import socket
from typing import Any, BinaryIO

from timeshare.agent_socket import AGENT_SOCKET_ENV, agent_socket, candidates, where_looked
from timeshare.credentials import JOB_TOKEN_ENV, job_token
from timeshare.errors import FailedPrecondition, PermissionDenied, Unavailable, class_for_code


def register_process(
    group: str,
    job: str,
    socket_path: str | None = None,
    pid: int | None = None,
    *,
    token: str | None = None,
) -> int:
    """Register this process (or, for root or its owner, ``pid``) as one of
    ``job``'s processes on this node; returns the process id the agent saw.
    ``token`` is the job's token; by default the one a Join in this process
    got, else TIMESHARE_JOB_TOKEN."""
    message = {"op": "register", "group": group, "job": job, "pid": pid}
    message["token"] = presented_token(group, job, token)
    conn, _lines, reply = open_agent_connection(agent_socket(socket_path), message)
    conn.close()
    return int(reply["pid"])


def presented_token(group: str, job: str, token: str | None) -> str:
    """The job's token, or a refusal that says where it should have come from
    (without asking the agent, which would refuse it anyway)."""
    found = job_token(group, job, token)
    if not found:
        raise PermissionDenied(
            f"no job token for job {group}/{job}: the node agent admits a process into a job "
            f"only with the token its Join returned (job.token); pass token=, or set "
            f"{JOB_TOKEN_ENV} in the process's environment"
        )
    return found


# A release restores device state: gigabytes, on a busy node.
FORGET_SECONDS = 600.0


def forget_job(
    group: str, job: str, socket_path: str | None = None, *, token: str | None = None
) -> str:
    """Have this node's agent release a job's processes (thawed, restored where
    they fit, never left stopped) and forget them, as it does by itself when
    the job leaves its group; root or the owner of the processes only, and
    while the job is still in its group the owner also needs its token (by
    default as register_process finds it). Returns what the agent did, in words."""
    message = {"op": "forget", "group": group, "job": job, "token": job_token(group, job, token)}
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
        defaulted = path in candidates() and not os.path.exists(path)
        looked = f" (looked at {where_looked()})" if defaulted else ""
        raise Unavailable(
            f"no node agent answers on {path}{looked}: {error}. Start one with `timeshare up` "
            f"(or `timeshare agent` on a GPU host), or set {AGENT_SOCKET_ENV} to the socket "
            "`timeshare up` printed"
        ) from None
    if not isinstance(reply, dict) or not reply.get("ok"):
        conn.close()
        error_text = str(reply.get("error", "refused") if isinstance(reply, dict) else reply)
        code = str(reply.get("code", "")) if isinstance(reply, dict) else ""
        # Agents before refusal codes said only their words.
        refused = class_for_code(code) or (
            PermissionDenied if "only root or the owner" in error_text else FailedPrecondition
        )
        raise refused(error_text)
    conn.settimeout(None)
    return conn, lines, reply
