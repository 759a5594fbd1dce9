"""The deployment files for hosts without Kubernetes: the systemd units pass
`systemd-analyze verify`, and the Slurm scripts parse and do what they say
against a real agent socket."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.credentials import known_jobs, token_env
from tests.deploy_files import (
    DEPLOY,
    SLURM,
    UNITS,
)
from timeshare.activities.backends.processes import ProcessTable
from timeshare.workers.agent.registration_socket import serve_agent_socket


@pytest.fixture
def orphan() -> Iterator[int]:
    """A process that is not the test's child: the agent refuses its own tree."""
    output = subprocess.run(
        ["sh", "-c", "sleep 120 >/dev/null 2>&1 & echo $!"],
        capture_output=True,
        text=True,
        check=True,
        timeout=30,
    )
    pid = int(output.stdout)
    yield pid
    os.kill(pid, signal.SIGKILL)


def run_task_prolog(environment: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", str(SLURM / "prolog.sh")],
        # PYTHONPATH passed on: the timeshare it runs is the one under test.
        env={"PATH": os.environ["PATH"], **environment}
        | {k: v for k, v in os.environ.items() if k == "PYTHONPATH"},
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.skipif(
    shutil.which("systemd-analyze") is None, reason="systemd-analyze is not installed here"
)
def test_systemd_units_verify(tmp_path: Path) -> None:
    # verify insists that ExecStart's program exists: point the units at this
    # checkout's own `timeshare` instead of /opt/timeshare's.
    timeshare = Path(sys.executable).parent / "timeshare"
    assert timeshare.exists()
    for name in UNITS:
        text = (DEPLOY / "systemd" / f"timeshare-{name}.service").read_text()
        assert "/opt/timeshare/bin/timeshare" in text
        (tmp_path / f"timeshare-{name}.service").write_text(
            text.replace("/opt/timeshare/bin/timeshare", str(timeshare))
        )
    result = subprocess.run(
        ["systemd-analyze", "verify", *sorted(str(p) for p in tmp_path.glob("*.service"))],
        capture_output=True,
        text=True,
        timeout=120,
    )
    # Unknown keys and bad values are only warnings (exit 0): no output at all.
    assert (result.returncode, result.stdout + result.stderr) == (0, "")


@pytest.mark.parametrize("name", ["prolog.sh", "epilog.sh", "grpo-pair.sbatch"])
def test_slurm_script_parses(name: str) -> None:
    result = subprocess.run(
        ["bash", "-n", str(SLURM / name)], capture_output=True, text=True, timeout=30
    )
    assert (result.returncode, result.stderr) == (0, "")


async def test_task_prolog_registers_the_task_with_the_agent(tmp_path: Path, orphan: int) -> None:
    scontrol = tmp_path / "scontrol"
    scontrol.write_text(
        '#!/bin/sh\n[ "$*" = "show hostnames gpu[01-02]" ] && printf "gpu01\\ngpu02\\n"\n'
    )
    scontrol.chmod(0o755)
    socket_path = tmp_path / "agent.sock"
    processes = ProcessTable()
    server = await serve_agent_socket(
        str(socket_path), processes, credentials=known_jobs("grpo-pair")
    )
    slurm = {
        "SLURM_JOB_ID": "42",
        "SLURM_JOB_NODELIST": "gpu[01-02]",
        "SLURM_TASK_PID": str(orphan),
        "TIMESHARE_BIN": str(Path(sys.executable).parent / "timeshare"),
        "SCONTROL_BIN": str(scontrol),
        "TIMESHARE_AGENT_SOCKET": str(socket_path),
    }
    try:
        untouched = await asyncio.to_thread(run_task_prolog, slurm)
        assert (untouched.returncode, untouched.stdout) == (0, "")  # not a timeshare job

        grouped = {**slurm, "TIMESHARE_GROUP": "grpo-pair"}
        exported = await asyncio.to_thread(run_task_prolog, grouped)
        assert exported.returncode == 0, exported.stdout + exported.stderr
        assert exported.stdout.splitlines() == [
            "export TIMESHARE_JOB=slurm-42",
            "export TIMESHARE_NODES=gpu01,gpu02",
        ]
        assert processes.jobs("grpo-pair") == []  # registering is per step, on request

        # The job's token, from the Join its batch script made (deploy/slurm/README.md).
        unproven = {**grouped, "TIMESHARE_REGISTER_TASK": "1"}
        denied = await asyncio.to_thread(run_task_prolog, unproven)
        assert denied.returncode == 1 and "no job token" in denied.stdout
        assert processes.jobs("grpo-pair") == []
        registering = {**unproven, **token_env("slurm-42")}
        registered = await asyncio.to_thread(run_task_prolog, registering)
        assert registered.returncode == 0, registered.stdout + registered.stderr
        assert processes.processes("grpo-pair", "slurm-42") == [orphan]

        refused = await asyncio.to_thread(run_task_prolog, {**registering, "SLURM_TASK_PID": "1"})
        assert refused.returncode == 1
        assert refused.stdout.splitlines()[-1].startswith("print timeshare: task 1 of slurm-42")
    finally:
        server.close()
        await server.wait_closed()


def test_epilog_never_fails_when_the_gateway_is_unreachable(tmp_path: Path) -> None:
    # Slurm sets a node DOWN when its Epilog fails.
    result = subprocess.run(
        ["bash", str(SLURM / "epilog.sh")],
        env={
            "SLURM_JOB_ID": "42",
            "TIMESHARE_SLURM_ENV": str(tmp_path / "absent.env"),
            "TIMESHARE_PYTHON": sys.executable,
            "TIMESHARE_ADDRESS": "127.0.0.1:1",
        },
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
