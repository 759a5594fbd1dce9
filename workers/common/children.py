"""Child processes that never outlive the process that started them."""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from typing import IO, Any

_PR_SET_PDEATHSIG = 1
PARENT_VARIABLE = "TIMESHARE_DIE_WITH_PARENT"
# Looked up once here: between fork and exec only async-signal-safe work is
# allowed, and loading a library is not.
_prctl = ctypes.CDLL(None, use_errno=True).prctl if sys.platform.startswith("linux") else None


def die_with_parent() -> None:
    # Linux only: the kernel sends SIGTERM to the child when its parent dies,
    # even by SIGKILL, so no Temporal server or worker is ever left behind.
    if _prctl is not None:
        _prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


def die_with_parent_if_asked() -> None:
    """For a `timeshare` child started by spawn(..., timeshare_child=True)."""
    parent = os.environ.pop(PARENT_VARIABLE, "")
    if parent.isdigit():
        die_with_parent()
        if os.getppid() != int(parent):  # the parent died before we asked
            os._exit(1)


def spawn(
    command: Sequence[str],
    *,
    stdout: IO[Any] | int | None = None,
    new_session: bool = False,
    timeshare_child: bool = False,
    env: dict[str, str] | None = None,
) -> subprocess.Popen[bytes]:
    """Start a child that dies with this process.

    ``timeshare_child``: the command is `timeshare ...`, which asks the kernel
    itself at start. Then no Python code runs between fork and exec, which a
    parent with gRPC threads (a test or benchmark process) must avoid: gRPC's
    fork handlers can kill the child before it execs.

    ``env``: variables set for the child on top of this process's own.
    """
    extra = {PARENT_VARIABLE: str(os.getpid())} if timeshare_child else {}
    merged = {**os.environ, **(env or {}), **extra} if extra or env else None
    return subprocess.Popen(
        list(command),
        stdin=subprocess.DEVNULL,
        stdout=stdout,
        stderr=subprocess.STDOUT if stdout is not None else None,
        preexec_fn=None if timeshare_child else die_with_parent,
        start_new_session=new_session,
        env=merged,
    )


def stop_process(process: subprocess.Popen[bytes], grace: float = 10.0) -> None:
    stop_processes([process], grace)


def stop_processes(processes: Sequence[subprocess.Popen[bytes]], grace: float = 10.0) -> None:
    """Asked to stop all at once, each given ``grace`` seconds from then, then killed."""
    running = [process for process in processes if process.poll() is None]
    for process in running:
        process.terminate()
    deadline = time.monotonic() + grace
    for process in running:
        try:
            process.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
