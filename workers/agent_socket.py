"""The node agent's Unix socket, where a job's GPU worker processes register.

One JSON object per line each way. The process id comes from the kernel
(SO_PEERCRED), never from the message; only root or the owner of a process
may register it on its behalf (`timeshare register --pid`, for launchers
such as a Slurm prolog)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
import struct
from pathlib import Path
from typing import Any

from activities.processes import ProcessTable, RegistrationRefused, owner
from timeshare.names import check_name
from workers.service import StartupError

MAX_LINE_BYTES = 4096


def peer_credentials(writer: asyncio.StreamWriter) -> tuple[int, int, int]:
    sock: socket.socket = writer.get_extra_info("socket")
    raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    pid, uid, gid = struct.unpack("3i", raw)
    return pid, uid, gid


def registration(message: dict[str, Any], peer_pid: int, peer_uid: int) -> tuple[str, str, int]:
    """(group, job, pid) for a registration request, or RegistrationRefused."""
    try:
        group = check_name("group", str(message.get("group", "")))
        job = check_name("job", str(message.get("job", "")))
    except ValueError as error:
        raise RegistrationRefused(str(error)) from None
    pid = peer_pid
    if message.get("pid") is not None:
        pid = int(message["pid"])
        if peer_uid != 0 and peer_uid != owner(pid):
            raise RegistrationRefused(f"only root or the owner of process {pid} may register it")
    return group, job, pid


async def serve_agent_socket(path: str, processes: ProcessTable) -> asyncio.AbstractServer:
    socket_path = Path(path)
    try:
        socket_path.parent.mkdir(parents=True, exist_ok=True)
        if socket_path.exists():
            socket_path.unlink()  # left by an agent that did not stop cleanly
    except OSError as error:
        raise StartupError(f"cannot use agent socket {path}: {error}; pass --socket PATH") from None

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peer_pid, peer_uid, _ = peer_credentials(writer)
        try:
            line = await reader.readline()
            message = json.loads(line[:MAX_LINE_BYTES] or b"{}")
            if not isinstance(message, dict) or message.get("op") != "register":
                raise RegistrationRefused('expected {"op": "register", "group": ..., "job": ...}')
            group, job, pid = registration(message, peer_pid, peer_uid)
            processes.register(group, job, pid)
            reply: dict[str, Any] = {"ok": True, "pid": pid}
        except (RegistrationRefused, ValueError, OSError) as error:
            reply = {"ok": False, "error": str(error)}
        writer.write(json.dumps(reply).encode() + b"\n")
        await writer.drain()
        writer.close()

    server = await asyncio.start_unix_server(handle, path=str(socket_path), limit=MAX_LINE_BYTES)
    os.chmod(socket_path, 0o660)
    return server


def remove_socket(path: str) -> None:
    with contextlib.suppress(OSError):
        Path(path).unlink()
