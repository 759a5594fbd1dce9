"""The node agent's Unix socket, where a job's GPU worker processes register
and serve their workload hooks.

One JSON object per line each way. The process id comes from the kernel
(SO_PEERCRED), never from the message; only root or the owner of a process
may register it on its behalf (`timeshare register --pid`, for launchers
such as a Slurm prolog). A `register` conversation is one line each way; a
`hooks` one stays open for the agent's calls (timeshare.hooks.protocol). A
`forget` one (`timeshare forget`, root or the owner of the job's processes,
with the job's token while the job is in its group) releases a job's
processes here by hand and drops its registrations.

Registering into a job and serving its hooks take the job's token ("token"),
checked against the group's record (workers/agent/credentials.py): on a node
shared by tenants, reaching the socket is not belonging to a job. Who may
reach the socket at all is its group (--socket-group), mode 0660."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
import struct
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from timeshare.activities.backends.hook_registry import HookConnection, HookRegistry
from timeshare.activities.backends.processes import (
    NotPermitted,
    ProcessTable,
    RegistrationRefused,
    owner,
)
from timeshare.hooks.protocol import MAX_LINE_BYTES, HookHello
from timeshare.models import ReleaseOutput
from timeshare.names import check_name
from timeshare.workers.agent.credentials import JobCredentials
from timeshare.workers.common.service import StartupError

# Every conversation starts with one line from the process: a peer that says
# nothing is answered and hung up on after this long, so that connections
# nobody uses cannot pile up in the agent (any local user of the socket's
# group can open them).
FIRST_LINE_SECONDS = 10.0


def peer_credentials(writer: asyncio.StreamWriter) -> tuple[int, int, int]:
    sock: socket.socket = writer.get_extra_info("socket")
    raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    pid, uid, gid = struct.unpack("3i", raw)
    return pid, uid, gid


def names(message: dict[str, Any]) -> tuple[str, str]:
    try:
        group = check_name("group", str(message.get("group", "")))
        job = check_name("job", str(message.get("job", "")))
    except ValueError as error:
        raise RegistrationRefused(str(error)) from None
    return group, job


def registration(message: dict[str, Any], peer_pid: int, peer_uid: int) -> tuple[str, str, int]:
    """(group, job, pid) for a registration request, or RegistrationRefused."""
    group, job = names(message)
    pid = peer_pid
    if message.get("pid") is not None:
        pid = int(message["pid"])
        if peer_uid != 0 and peer_uid != owner(pid):
            raise NotPermitted(f"only root or the owner of process {pid} may register it")
    return group, job, pid


def token_of(message: dict[str, Any]) -> str:
    token = message.get("token")
    return token if isinstance(token, str) else ""


def hook_hello(message: dict[str, Any], hooks: HookRegistry) -> HookHello:
    if not hooks.accepting:
        raise RegistrationRefused(
            "this node's agent calls no workload hooks; run it with a backend that does "
            "(--backend app+cuda, or app)"
        )
    try:
        return HookHello.model_validate(message)
    except ValidationError as error:
        raise RegistrationRefused(f"malformed hooks request: {error.errors()[0]['msg']}") from None


def hook_connection(
    message: dict[str, Any],
    hello: HookHello,
    peer_pid: int,
    hooks: HookRegistry,
    processes: ProcessTable,
    writer: asyncio.StreamWriter,
) -> HookConnection:
    """Admit a process's hooks (and, if it asks, register the process); its
    credential was checked already."""
    group, job = names(message)
    connection = HookConnection(group, job, peer_pid, hello.mode, hello.evicted, writer)
    # In the registry before the process is registered: a newcomer locked at
    # registration is evicted through its hooks too.
    hooks.add(connection)
    try:
        if hello.register_process:
            processes.register(group, job, peer_pid)
    except RegistrationRefused:
        hooks.remove(connection)
        raise
    return connection


Forget = Callable[[str, str], Awaitable[ReleaseOutput]]


async def forgotten(
    message: dict[str, Any],
    peer_uid: int,
    processes: ProcessTable,
    forget: Forget | None,
    credentials: JobCredentials,
) -> dict[str, Any]:
    """Release a job's processes by hand and forget them: root, or the owner
    of all of them (with the job's token while the job is in its group)."""
    group, job = names(message)
    if forget is None:
        raise RegistrationRefused("this agent cannot release jobs")
    pids = processes.processes(group, job)
    if not pids:
        raise RegistrationRefused(f"job {group}/{job} has no live process registered here")
    if peer_uid != 0:
        others = [pid for pid in pids if owner(pid) != peer_uid]
        if others:
            raise NotPermitted(
                f"only root or the owner of processes {others} may release job {group}/{job}"
            )
        await credentials.verify_release(group, job, token_of(message))
    released = await forget(group, job)
    processes.forget(group, job)
    return {"ok": True, "released": released.model_dump()}


async def serve_agent_socket(
    path: str,
    processes: ProcessTable,
    hooks: HookRegistry | None = None,
    forget: Forget | None = None,
    *,
    credentials: JobCredentials,
    socket_group: int | None = None,
) -> asyncio.AbstractServer:
    """Serve the socket at ``path``, mode 0660, group ``socket_group`` (default:
    the agent's own): the processes that may reach it."""
    socket_path = Path(path)
    hooks = hooks or HookRegistry()
    try:
        socket_path.parent.mkdir(parents=True, exist_ok=True)
        if socket_path.exists():
            socket_path.unlink()  # left by an agent that did not stop cleanly
    except OSError as error:
        raise StartupError(f"cannot use agent socket {path}: {error}; pass --socket PATH") from None

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peer_pid, peer_uid, _ = peer_credentials(writer)
        connection = None
        try:
            try:
                line = await asyncio.wait_for(reader.readline(), FIRST_LINE_SECONDS)
            except TimeoutError:
                raise RegistrationRefused(
                    f"said nothing within {FIRST_LINE_SECONDS:g} s; hanging up"
                ) from None
            message = json.loads(line[:MAX_LINE_BYTES] or b"{}")
            op = message.get("op") if isinstance(message, dict) else None
            if op == "register":
                group, job, pid = registration(message, peer_pid, peer_uid)
                await credentials.verify(group, job, token_of(message))
                processes.register(group, job, pid)
            elif op == "hooks":
                hello = hook_hello(message, hooks)
                group, job = names(message)
                await credentials.verify(group, job, token_of(message))
                connection = hook_connection(message, hello, peer_pid, hooks, processes, writer)
                pid = peer_pid
            elif op == "forget":
                pid = 0
            else:
                raise RegistrationRefused(
                    'expected {"op": "register", "hooks" or "forget", "group", "job"}'
                )
            reply: dict[str, Any] = {"ok": True, "pid": pid}
            if op == "forget":
                reply = await forgotten(message, peer_uid, processes, forget, credentials)
        except RegistrationRefused as error:
            reply = {"ok": False, "error": str(error), "code": error.code}
        except (ValueError, OSError) as error:
            reply = {"ok": False, "error": str(error)}
        except Exception as error:  # a failed release: said to the caller, in one line
            reply = {"ok": False, "error": f"{type(error).__name__}: {error}"}
        # Written before any hook call can be: the process reads this first.
        writer.write(json.dumps(reply).encode() + b"\n")
        try:
            await writer.drain()
            if connection is not None:
                await connection.serve(reader)
        except ConnectionError:
            pass
        finally:
            if connection is not None:
                hooks.remove(connection)
            writer.close()

    server = await asyncio.start_unix_server(handle, path=str(socket_path), limit=MAX_LINE_BYTES)
    try:
        if socket_group is not None:
            os.chown(socket_path, -1, socket_group)
        os.chmod(socket_path, 0o660)
    except OSError as error:
        server.close()
        hint = "; the agent must run as root or be a member of that group" if socket_group else ""
        raise StartupError(
            f"cannot set group {socket_group} and mode 0660 on agent socket {path}: {error}{hint}"
        ) from None
    return server


def remove_socket(path: str) -> None:
    with contextlib.suppress(OSError):
        Path(path).unlink()
