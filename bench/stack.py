"""A timeshare stack of separate processes (Temporal, scheduler, gateway,
agents) that a benchmark or a fault test can start, kill and restart one by
one, plus synthetic jobs run against it. Every process dies with its parent."""

from __future__ import annotations

import itertools
import json
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import timeshare
from timeshare.models import GroupStatus
from workers.children import spawn, stop_process

READY_SECONDS = 90.0


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def timeshare_command(*args: str) -> list[str]:
    return [sys.executable, "-m", "timeshare", *args]


@dataclass
class LocalStack:
    workdir: Path
    node: str = "node-a"
    backend: str = "sim"
    # The simulated device: state per job and host<->device bandwidth.
    state_gib: float = 0.25
    bandwidth_gbps: float = 10.0
    # None: the simulated GPU holds one job at a time (no co-residency).
    capacity_gib: float | None = None
    temporal_port: int = field(default_factory=free_port)
    ui_port: int = field(default_factory=free_port)
    gateway_port: int = field(default_factory=free_port)
    processes: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.gateway_port}"

    @property
    def temporal(self) -> str:
        return f"localhost:{self.temporal_port}"

    @property
    def record_path(self) -> Path:
        return self.workdir / "residency.jsonl"

    @property
    def socket_path(self) -> Path:
        return self.workdir / "agent.sock"

    def commands(self) -> dict[str, list[str]]:
        common = [f"--temporal={self.temporal}"]
        return {
            "temporal": timeshare_command(
                "temporal", f"--port={self.temporal_port}", f"--ui-port={self.ui_port}",
                f"--data-dir={self.workdir / 'data'}",
            ),
            "scheduler": timeshare_command("scheduler", *common),
            "gateway": timeshare_command("gateway", *common, f"--listen={self.address}"),
            "agent": timeshare_command(
                "agent", *common, f"--node={self.node}", f"--backend={self.backend}",
                f"--sim-state-gib={self.state_gib}", f"--sim-bandwidth-gbps={self.bandwidth_gbps}",
                *([f"--sim-capacity-gib={self.capacity_gib}"] if self.capacity_gib else []),
                f"--sim-record={self.record_path}",
                f"--sim-state={self.workdir / 'sim-state.json'}",
                f"--socket={self.socket_path}",
            ),
        }  # fmt: skip

    def start(self, name: str) -> None:
        """Start one part (again) and wait until it says it is ready."""
        log_path = self.workdir / f"{name}.log"
        offset = log_path.stat().st_size if log_path.exists() else 0
        with log_path.open("ab") as log:
            self.processes[name] = spawn(self.commands()[name], stdout=log, timeshare_child=True)
        deadline = time.monotonic() + READY_SECONDS
        while time.monotonic() < deadline:
            text = log_path.read_bytes()[offset:].decode(errors="replace")
            if f"timeshare {name}: ready" in text:
                return
            if self.processes[name].poll() is not None:
                raise RuntimeError(f"{name} exited at start: {text.strip()[-500:]}")
            time.sleep(0.1)
        raise RuntimeError(f"{name} was not ready within {READY_SECONDS:g} s")

    def start_all(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        for name in ("temporal", "scheduler", "gateway", "agent"):
            self.start(name)

    def kill(self, name: str, signum: int = signal.SIGKILL) -> None:
        process = self.processes[name]
        process.send_signal(signum)
        process.wait(60)

    def restart(self, name: str, signum: int = signal.SIGKILL) -> None:
        self.kill(name, signum)
        self.start(name)

    def stop_all(self) -> None:
        for name in ("agent", "gateway", "scheduler", "temporal"):
            if name in self.processes:
                stop_process(self.processes[name], grace=30)

    def job(self, group: str, job: str, report: Path, *options: str) -> subprocess.Popen[bytes]:
        """A synthetic job process (its options: see `timeshare synthetic-job --help`)."""
        log = (self.workdir / f"{job}.log").open("ab")
        return spawn(
            timeshare_command(
                "synthetic-job", f"--group={group}", f"--job={job}", f"--address={self.address}",
                f"--nodes={self.node}", f"--report={report}", f"--agent-socket={self.socket_path}",
                *options,
            ),
            stdout=log,
            timeshare_child=True,
        )  # fmt: skip

    def group(self, group: str) -> GroupStatus:
        with timeshare.connect(self.address) as client:
            return client.get_group(group)

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
        if not self.record_path.exists():
            return []
        return [json.loads(line) for line in self.record_path.read_text().splitlines()]


def overlaps(record: list[dict[str, Any]]) -> int:
    """Times the simulated GPU broke its invariant, by the backend's own
    record: two jobs of a group running at once, or more resident than fits."""
    refused = sum(1 for e in record if e["event"] == "overlap")
    broken = 0
    for node, group in {(e["node"], e.get("group")) for e in record}:
        mine = [e for e in record if e["node"] == node and e.get("group") == group]
        running = [e for e in mine if e["event"] == "running"]
        broken += sum(
            1
            for a, b in itertools.combinations(running, 2)
            if a["job"] != b["job"] and a["start"] < b["end"] and b["start"] < a["end"]
        )
        broken += overfull([e for e in mine if e["event"] == "resident"])
    return refused + broken


def overfull(resident: list[dict[str, Any]]) -> int:
    """Residency intervals that began while the GPU held more than fits: more
    bytes than its capacity, or a second job where it has none (one at a time)."""
    count = 0
    for interval in resident:
        here = [e for e in resident if e["start"] <= interval["start"] < e["end"]]
        # One job's interval recorded twice (an agent restarted) is not two jobs.
        here = list({e["job"]: e for e in here}.values())
        capacity = interval.get("capacity")
        if len(here) > 1 and (capacity is None or sum(e.get("bytes", 0) for e in here) > capacity):
            count += 1
    return count
