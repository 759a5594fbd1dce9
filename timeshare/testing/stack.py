"""A timeshare stack of separate processes (Temporal, scheduler, gateway,
agents) that a test or a benchmark can start, kill and restart one by one,
plus synthetic jobs run against it. Every process dies with its parent.

Parts are named "temporal", "scheduler", "gateway", "agent" (the agent of
``node``) and "agent-<node>" (one for each of ``more_nodes``). With
``schedulers`` or ``gateways`` above 1, the further replicas are
"scheduler-2", "scheduler-3", ... and "gateway-2", ..., all against the one
Temporal."""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import timeshare
from timeshare.activities.backends.processes import alive, descendants
from timeshare.activities.backends.sim_memory import DEVICE_MEMORY_ROOT
from timeshare.history import GroupHistory
from timeshare.models import GroupStatus
from timeshare.self_command import timeshare_command
from timeshare.testing.ports import free_port
from timeshare.workers.common.children import spawn, stop_processes

READY_SECONDS = 90.0
# Tries of a part's first start, each on ports drawn again (PortTaken).
PORT_DRAWS = 3


class PortTaken(RuntimeError):
    """A part exited at start because a port the stack drew for it was taken."""


def device_memory_dir(fallback: Path) -> Path:
    """Where simulated GPUs keep what they hold: in memory that outlives the
    agent but not the machine, as a GPU's does, so a tmpfs (/dev/shm); on a
    disk every switch's state file waited for a journal commit (1.3 ms p50,
    2.9 ms p90 per write here, against 0.4 and 1.2 on tmpfs, while the
    embedded Temporal syncs its database). Removed by stop_all, or at the
    latest when this process exits."""
    try:
        made = Path(tempfile.mkdtemp(prefix="timeshare-sim-", dir=DEVICE_MEMORY_ROOT))
    except OSError:
        return fallback
    atexit.register(shutil.rmtree, made, True)
    return made


@dataclass
class LocalStack:
    """A stack in ``workdir`` (logs, records, Temporal's database). Start it
    whole with ``with LocalStack(workdir) as stack:`` (stopped on leaving),
    or part by part with ``start``; jobs connect to ``address`` and register
    their processes through ``socket_path``."""

    workdir: Path
    node: str = "node-a"
    # Further nodes, each with an agent process of its own.
    more_nodes: list[str] = field(default_factory=list)
    backend: str = "sim"
    # The simulated device: state per job and host<->device bandwidth.
    state_gib: float = 0.25
    bandwidth_gbps: float = 10.0
    # Restores at another speed (None: bandwidth_gbps).
    restore_bandwidth_gbps: float | None = None
    # None: the simulated GPU holds one job at a time (no co-residency).
    capacity_gib: float | None = None
    # Jobs whose simulated state is not state_gib, by job name.
    job_state_gib: dict[str, float] = field(default_factory=dict)
    temporal_port: int = field(default_factory=free_port)
    ui_port: int = field(default_factory=free_port)
    # Temporal's own Prometheus metrics (bench.parts.temporal_operations reads them).
    temporal_metrics_port: int = field(default_factory=free_port)
    gateway_port: int = field(default_factory=free_port)
    # Replicas: scheduler workers on the one task queue, gateways on ports of their own.
    schedulers: int = 1
    gateways: int = 1
    processes: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    # Set for every agent on top of this process's environment (the GPU
    # emulator's variables, say).
    agent_env: dict[str, str] = field(default_factory=dict)
    # Passed to every agent after the others (--call-timeout=..., say).
    agent_options: list[str] = field(default_factory=list)
    # Likewise for every gateway (--llmd-compat, say), and set in its environment.
    gateway_options: list[str] = field(default_factory=list)
    gateway_env: dict[str, str] = field(default_factory=dict)
    # Each group's simulated GPUs per node (sim backend).
    sim_gpus: int = 1
    more_gateway_ports: list[int] = field(default_factory=list)
    # What the simulated GPUs hold (None: device_memory_dir).
    device_dir: Path | None = None
    # Passed to `timeshare temporal` after the others (--dynamic-config=..., say).
    temporal_options: list[str] = field(default_factory=list)
    # By part name, for a part changed for a while (bench chaos's faults): the
    # Temporal address it reaches (a proxy, say), options after its others,
    # variables on top of its environment, or another command altogether.
    part_temporal: dict[str, str] = field(default_factory=dict)
    part_options: dict[str, list[str]] = field(default_factory=dict)
    part_env: dict[str, dict[str, str]] = field(default_factory=dict)
    part_command: dict[str, list[str]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.schedulers < 1 or self.gateways < 1:
            raise ValueError("a stack needs at least one scheduler and one gateway")
        if self.device_dir is None:
            self.device_dir = device_memory_dir(self.workdir)
        while len(self.more_gateway_ports) < self.gateways - 1:
            self.more_gateway_ports.append(free_port())

    @property
    def address(self) -> str:
        """The first gateway."""
        return self.addresses[0]

    @property
    def addresses(self) -> list[str]:
        """Every gateway replica's, in the order of ``gateway_parts``."""
        return [f"127.0.0.1:{port}" for port in (self.gateway_port, *self.more_gateway_ports)]

    def job_address(self, index: int) -> str:
        """Where the ``index``-th job connects: with one gateway, to it; with
        several, to all of them, starting at a different one for neighbouring
        jobs (gRPC's pick_first takes the first that answers and moves on to
        the next when its connection breaks, as a job behind a load balancer
        would reach another replica)."""
        if len(self.addresses) == 1:
            return self.address
        first = index % len(self.addresses)
        ordered = self.addresses[first:] + self.addresses[:first]
        return "ipv4:" + ",".join(ordered)

    @staticmethod
    def _replicas(part: str, count: int) -> list[str]:
        return [part, *(f"{part}-{n}" for n in range(2, count + 1))]

    @property
    def scheduler_parts(self) -> list[str]:
        return self._replicas("scheduler", self.schedulers)

    @property
    def gateway_parts(self) -> list[str]:
        return self._replicas("gateway", self.gateways)

    @property
    def temporal(self) -> str:
        return f"localhost:{self.temporal_port}"

    @property
    def nodes(self) -> list[str]:
        return [self.node, *self.more_nodes]

    def agent(self, node: str) -> str:
        """The part name of a node's agent."""
        return "agent" if node == self.node else f"agent-{node}"

    @property
    def agents(self) -> list[str]:
        return [self.agent(node) for node in self.nodes]

    @property
    def record_path(self) -> Path:
        return self._node_file(self.node, "residency", ".jsonl")

    def _node_file(self, node: str, stem: str, suffix: str, under: Path | None = None) -> Path:
        # `node`'s files keep the names they had before there were more nodes.
        name = f"{stem}{suffix}" if node == self.node else f"{stem}-{node}{suffix}"
        return (under or self.workdir) / name

    @property
    def socket_path(self) -> Path:
        return self.socket_for(self.node)

    def socket_for(self, node: str) -> Path:
        return self._node_file(node, "agent", ".sock")

    def commands(self) -> dict[str, list[str]]:
        commands = {
            "temporal": timeshare_command(
                "temporal", f"--port={self.temporal_port}", f"--ui-port={self.ui_port}",
                f"--data-dir={self.workdir / 'data'}",
                f"--metrics-port={self.temporal_metrics_port}", *self.temporal_options,
            ),
            **{
                part: timeshare_command("scheduler", self._reaching(part))
                for part in self.scheduler_parts
            },
            **{
                part: timeshare_command(
                    "gateway", self._reaching(part), f"--listen={address}",
                    *self.gateway_options,
                )
                for part, address in zip(self.gateway_parts, self.addresses, strict=True)
            },
            **{self.agent(node): self._agent_command(node) for node in self.nodes},
        }  # fmt: skip
        for part, command in commands.items():
            command += self.part_options.get(part, [])
        return {**commands, **self.part_command}

    def _reaching(self, part: str) -> str:
        return f"--temporal={self.part_temporal.get(part, self.temporal)}"

    def _agent_command(self, node: str) -> list[str]:
        return timeshare_command(
            "agent", self._reaching(self.agent(node)), f"--node={node}",
            f"--backend={self.backend}",
            f"--sim-state-gib={self.state_gib}", f"--sim-bandwidth-gbps={self.bandwidth_gbps}",
            *([f"--sim-capacity-gib={self.capacity_gib}"] if self.capacity_gib else []),
            *([f"--sim-restore-bandwidth-gbps={self.restore_bandwidth_gbps}"]
              if self.restore_bandwidth_gbps else []),
            *[f"--sim-job-state={job}={gib}" for job, gib in self.job_state_gib.items()],
            f"--sim-record={self._node_file(node, 'residency', '.jsonl')}",
            f"--sim-state={self._node_file(node, 'sim-state', '.json', self.device_dir)}",
            f"--record={self._node_file(node, 'process-record', '.jsonl')}",
            f"--sim-gpus={self.sim_gpus}",
            f"--socket={self.socket_for(node)}", *self.agent_options,
        )  # fmt: skip

    def start(self, name: str) -> None:
        """Start one part (again) and wait until it says it is ready."""
        self.wait_ready(name, self.spawn(name))

    def spawn(self, name: str) -> int:
        """Start one part (again) without waiting for it; where its log begins."""
        log_path = self.workdir / f"{name}.log"
        offset = log_path.stat().st_size if log_path.exists() else 0
        env = (
            self.agent_env
            if name in self.agents
            else self.gateway_env
            if name in self.gateway_parts
            else None
        )
        if name in self.part_env:
            env = {**(env or {}), **self.part_env[name]}
        if name in self.agents and self.device_dir is not None:
            self.device_dir.mkdir(parents=True, exist_ok=True)
        with log_path.open("ab") as log:
            self.processes[name] = spawn(
                self.commands()[name], stdout=log, timeshare_child=True, env=env
            )
        return offset

    def log_since(self, name: str, offset: int = 0) -> str:
        return (self.workdir / f"{name}.log").read_bytes()[offset:].decode(errors="replace")

    def wait_ready(self, name: str, offset: int = 0) -> None:
        """Until the part, started with its log at ``offset``, says it is ready."""
        deadline = time.monotonic() + READY_SECONDS
        while time.monotonic() < deadline:
            text = self.log_since(name, offset)
            if f"timeshare {name.split('-')[0]}: ready" in text:
                return
            if self.processes[name].poll() is not None:
                taken = "in use" in text and name in ("temporal", *self.gateway_parts)
                error = PortTaken if taken else RuntimeError
                raise error(f"{name} exited at start: {text.strip()[-500:]}")
            time.sleep(0.1)
        raise RuntimeError(f"{name} was not ready within {READY_SECONDS:g} s")

    def start_all(self) -> None:
        """Temporal, then the others together (each waits for Temporal itself)."""
        self.workdir.mkdir(parents=True, exist_ok=True)
        self._on_drawn_ports("temporal", self.spawn("temporal"))
        parts = (*self.scheduler_parts, *self.gateway_parts, *self.agents)
        offsets = {name: self.spawn(name) for name in parts}
        for name in parts:
            self._on_drawn_ports(name, offsets[name])

    def _on_drawn_ports(self, name: str, offset: int) -> None:
        """Until the part, spawned with its log at ``offset``, is ready. A port
        the stack drew was free when drawn, but another stack starting at the
        same moment (the suite's workers) may take it first: the part then
        starts again on ports drawn again, up to PORT_DRAWS in all."""
        for draw in range(1, PORT_DRAWS + 1):
            try:
                self.wait_ready(name, offset)
                return
            except PortTaken:
                if draw == PORT_DRAWS:
                    raise
                self._draw_ports(name)
                offset = self.spawn(name)

    def _draw_ports(self, name: str) -> None:
        if name == "temporal":
            self.temporal_port, self.ui_port = free_port(), free_port()
            self.temporal_metrics_port = free_port()
        elif name in self.gateway_parts:
            index = self.gateway_parts.index(name)
            if index == 0:
                self.gateway_port = free_port()
            else:
                self.more_gateway_ports[index - 1] = free_port()

    def kill(self, name: str, signum: int = signal.SIGKILL) -> None:
        """Signal one part. SIGKILL takes its own children too, as a crash of
        the part would (a killed `timeshare temporal` cannot stop its server),
        and returns once they are gone, so the part's ports are free again."""
        process = self.processes[name]
        family = processes_below(process.pid) if signum == signal.SIGKILL else []
        for pid in family:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signum)
        process.send_signal(signum)
        process.wait(60)
        wait_gone(family)

    def kill_all_at_once(self) -> None:
        """SIGKILL every part and what each started in the same instant, as
        a machine that loses power; returns once all are gone."""
        running = {name: p for name, p in self.processes.items() if p.poll() is None}
        families = [pid for p in running.values() for pid in processes_below(p.pid)]
        for pid in [*families, *(p.pid for p in running.values())]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        for process in running.values():
            process.wait(60)
        wait_gone(families)

    def restart(self, name: str, signum: int = signal.SIGKILL, downtime: float = 0.0) -> None:
        self.kill(name, signum)
        time.sleep(downtime)
        self.start(name)

    def stop_all(self) -> None:
        # Tier by tier, the agents first and Temporal last; each tier's parts at once.
        tiers = (self.agents, self.gateway_parts, self.scheduler_parts, ["temporal"])
        for tier in tiers:
            stop_processes([self.processes[name] for name in tier if name in self.processes], 30)
        if self.device_dir is not None and self.device_dir != self.workdir:
            shutil.rmtree(self.device_dir, ignore_errors=True)

    def __enter__(self) -> LocalStack:
        try:
            self.start_all()
        except BaseException:
            self.stop_all()
            raise
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop_all()

    def job(
        self, group: str, job: str, report: Path, *options: str, nodes: list[str] | None = None
    ) -> subprocess.Popen[bytes]:
        """A synthetic job process (its options: see `timeshare synthetic-job --help`) on
        ``nodes`` (default: ``node``)."""
        return self.launch(
            job,
            timeshare_command(
                "synthetic-job", f"--group={group}", f"--job={job}", f"--address={self.address}",
                f"--nodes={','.join(nodes or [self.node])}", f"--report={report}",
                f"--socket={self.socket_for((nodes or [self.node])[0])}", *options,
            ),
        )  # fmt: skip

    def launch(self, name: str, command: list[str]) -> subprocess.Popen[bytes]:
        """A client process (not a part of the stack), its output in ``name``.log."""
        with (self.workdir / f"{name}.log").open("ab") as log:
            return spawn(command, stdout=log, timeshare_child=True)

    def group(self, group: str) -> GroupStatus:
        with timeshare.connect(self.address) as client:
            return client.get_group(group)

    def history(self, group: str) -> GroupHistory:
        with timeshare.connect(self.address) as client:
            return client.group_history(group)

    def wait_for(self, group: str, state: str, timeout: float = 60) -> GroupStatus:
        """Poll the group until it is in ``state`` (e.g. "switching")."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                status = self.group(group)
                if status.state == state:
                    return status
            except timeshare.TimeshareError:
                pass
            time.sleep(0.02)
        raise RuntimeError(f"group {group} never reached {state!r} within {timeout:g} s")

    def record(self) -> list[dict[str, Any]]:
        """The residency record of every node's simulated GPUs."""
        return self._read_records("residency")

    def process_record(self) -> list[dict[str, Any]]:
        """What every node's process backends did: freeze and thaw events, and each CUDA
        rank's checkpoint and restore (bytes, seconds)."""
        return self._read_records("process-record")

    def _read_records(self, stem: str) -> list[dict[str, Any]]:
        paths = [self._node_file(node, stem, ".jsonl") for node in self.nodes]
        return [
            json.loads(line)
            for path in paths
            if path.exists()
            for line in path.read_text().splitlines()
        ]


@contextlib.contextmanager
def temporal_only() -> Iterator[LocalStack]:
    """A stack of which only the Temporal dev server runs, in a scratch
    folder: for benchmarks that bring workers of their own."""
    with tempfile.TemporaryDirectory() as scratch:
        stack = LocalStack(Path(scratch))
        try:
            stack.start("temporal")
            yield stack
        finally:
            stack.stop_all()


def processes_below(pid: int) -> list[int]:
    """Every process below ``pid``, not ``pid`` itself."""
    return [member for member in descendants(pid) if member != pid]


def wait_gone(pids: list[int], timeout: float = 60) -> None:
    """Wait until none of ``pids`` runs (a zombie no longer holds its ports)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not [pid for pid in pids if alive(pid)]:
            return
        time.sleep(0.05)
    raise RuntimeError(f"processes {pids} still run {timeout:g} s after SIGKILL")
