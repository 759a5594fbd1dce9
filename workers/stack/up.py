"""`timeshare up`: the whole stack on one machine, as separate processes.

Temporal, the scheduler, the gateway and the node agent start together;
each of the three waits for Temporal by itself and says it is ready once it
reaches it (as in production). Each child's output is forwarded with its
name; one Ctrl-C (or SIGTERM) stops them all, the workers before Temporal,
and none outlives this process.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass, field
from pathlib import Path

from timeshare.activities.backends.sim_memory import forget_if_nothing_held
from timeshare.self_command import timeshare_command
from timeshare.workers.common.children import die_with_parent
from timeshare.workers.common.service import StartupError, ready
from timeshare.workers.temporal.dev_server import check_port_free

STARTUP_SECONDS = 90.0
STOP_GRACE_SECONDS = 10.0
# Longer than the launcher's own grace for the dev server, so the launcher
# can still stop a slow server before it is killed itself.
TEMPORAL_STOP_GRACE_SECONDS = 30.0
# Child output lines longer than this are passed on in pieces.
LINE_LIMIT = 2**20


@dataclass
class StackOptions:
    data_dir: Path
    port: int
    ui_port: int
    listen: str
    node: str
    backend: str
    # The agent's registration socket, for the line that tells jobs where it is.
    socket: str = ""
    agent_args: list[str] = field(default_factory=list)
    # Where the simulated GPUs keep what they hold, when the stack chose it:
    # removed at a clean stop if they hold nothing.
    sim_state: Path | None = None


@dataclass
class Child:
    name: str
    process: asyncio.subprocess.Process
    ready: asyncio.Event
    forwarder: asyncio.Task[None]


async def start_child(name: str, args: list[str]) -> Child:
    process = await asyncio.create_subprocess_exec(
        *timeshare_command(*args),
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        preexec_fn=die_with_parent,
        start_new_session=True,  # Ctrl-C reaches `up` alone, which stops children in order
        limit=LINE_LIMIT,
    )
    is_ready = asyncio.Event()
    return Child(name, process, is_ready, asyncio.create_task(forward(name, process, is_ready)))


async def forward(name: str, process: asyncio.subprocess.Process, is_ready: asyncio.Event) -> None:
    assert process.stdout is not None
    while True:
        try:
            raw = await process.stdout.readline()
        except ValueError:  # an over-long line: pass on what there is
            raw = await process.stdout.read(LINE_LIMIT)
        if not raw:
            return
        line = raw.decode(errors="replace").rstrip()
        print(f"[{name}] {line}", flush=True)
        if f"timeshare {name}: ready:" in line:
            is_ready.set()


async def wait_ready(child: Child, stop: asyncio.Event) -> None:
    waits = {
        asyncio.ensure_future(child.ready.wait()): "ready",
        asyncio.ensure_future(child.process.wait()): "exited",
        asyncio.ensure_future(stop.wait()): "stopped",
    }
    done, pending = await asyncio.wait(
        waits, timeout=STARTUP_SECONDS, return_when=asyncio.FIRST_COMPLETED
    )
    for task in pending:
        task.cancel()
    outcome = waits[next(iter(done))] if done else "timeout"
    if outcome == "exited":
        await child.forwarder
        raise StartupError(f"{child.name} exited with code {child.process.returncode} at start")
    if outcome == "timeout":
        raise StartupError(f"{child.name} was not ready within {STARTUP_SECONDS:g} s")


async def stop_child(child: Child) -> None:
    grace = TEMPORAL_STOP_GRACE_SECONDS if child.name == "temporal" else STOP_GRACE_SECONDS
    if child.process.returncode is None:
        with contextlib.suppress(ProcessLookupError):
            child.process.terminate()
        try:
            await asyncio.wait_for(child.process.wait(), grace)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                child.process.kill()
            await child.process.wait()
    with contextlib.suppress(Exception):
        await child.forwarder


def listen_port(listen: str) -> int:
    host, _, port = listen.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise StartupError(f"--listen {listen!r}: give HOST:PORT, e.g. 127.0.0.1:50051")
    return int(port)


def jobs_line(options: StackOptions) -> str:
    """What a job started elsewhere needs to reach this stack; a job on this
    machine finds both by default (timeshare.agent_socket)."""
    return (
        f"timeshare up: for a job: TIMESHARE_ADDRESS={options.listen} "
        f"TIMESHARE_AGENT_SOCKET={options.socket} (a job on this machine, as this user, "
        "finds both without them)"
    )


async def serve_stack(stop: asyncio.Event, options: StackOptions) -> None:
    temporal = f"localhost:{options.port}"
    gateway_port = listen_port(options.listen)
    check_port_free(options.port, "Temporal gRPC")
    check_port_free(options.ui_port, "Temporal Web UI")
    check_port_free(gateway_port, "gateway")
    common = ["--temporal", temporal]
    plan = [
        ("temporal", ["temporal", f"--port={options.port}", f"--ui-port={options.ui_port}",
                      f"--data-dir={options.data_dir}"]),
        ("scheduler", ["scheduler", *common]),
        ("gateway", ["gateway", *common, f"--listen={options.listen}"]),
        ("agent", ["agent", *common, f"--node={options.node}", f"--backend={options.backend}",
                   *options.agent_args]),
    ]  # fmt: skip
    children: list[Child] = []
    try:
        # All at once: the scheduler, gateway and agent wait for Temporal
        # themselves, as they do in production while it starts or restarts.
        for name, args in plan:
            children.append(await start_child(name, args))
        for child in children:
            await wait_ready(child, stop)
            if stop.is_set():
                return
        ready(
            "up",
            f"gateway {options.listen}, Temporal {temporal}, "
            f"Web UI http://localhost:{options.ui_port}, node {options.node} "
            f"({options.backend}); Ctrl-C stops everything",
        )
        print(jobs_line(options), flush=True)
        exits = {asyncio.ensure_future(c.process.wait()): c for c in children}
        stopping = asyncio.ensure_future(stop.wait())
        done, _ = await asyncio.wait([stopping, *exits], return_when=asyncio.FIRST_COMPLETED)
        stopping.cancel()
        for task, child in exits.items():
            task.cancel()
            if task in done:
                raise StartupError(
                    f"{child.name} exited with code {child.process.returncode}; "
                    "stopped the rest of the stack"
                )
    finally:
        for child in reversed(children):
            await stop_child(child)
        if options.sim_state is not None:  # the agent has stopped writing it
            forget_if_nothing_held(options.sim_state)
        print("timeshare up: stopped", flush=True)
