"""Processes for checks of process backends: not children of the checking
process, which plays the node agent there and must not manage its own process
tree (the backends' conformance checks, the GPU emulator's CUDA workers)."""

from __future__ import annotations

import contextlib
import os
import shlex
import signal
import subprocess


def detached(*command: str, env: dict[str, str] | None = None) -> int:
    """Start a process that is not this test's child (the agent here is this
    process, and it refuses its own process tree); return its pid. ``env``:
    variables added to its environment (a job token, say)."""
    settings = [f"{name}={value}" for name, value in (env or {}).items()]
    quoted = " ".join(
        shlex.quote(part) for part in (["env", *settings] if env else []) + list(command)
    )
    shell = subprocess.run(
        ["sh", "-c", f"{quoted} >/dev/null 2>&1 & echo $!"], capture_output=True, text=True
    )
    return int(shell.stdout)


def kill(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
