"""Child processes that never outlive the process that started them."""

from __future__ import annotations

import ctypes
import signal
import subprocess
import sys
from collections.abc import Sequence
from typing import IO, Any

_PR_SET_PDEATHSIG = 1
# Looked up once here: between fork and exec only async-signal-safe work is
# allowed, and loading a library is not.
_prctl = ctypes.CDLL(None, use_errno=True).prctl if sys.platform.startswith("linux") else None


def die_with_parent() -> None:
    # Linux only: the kernel sends SIGTERM to the child when its parent dies,
    # even by SIGKILL, so no Temporal server or worker is ever left behind.
    if _prctl is not None:
        _prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


def spawn(
    command: Sequence[str], *, stdout: IO[Any] | int | None = None, new_session: bool = False
) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        list(command),
        stdin=subprocess.DEVNULL,
        stdout=stdout,
        stderr=subprocess.STDOUT if stdout is not None else None,
        preexec_fn=die_with_parent,
        start_new_session=new_session,
    )


def stop_process(process: subprocess.Popen[bytes], grace: float = 10.0) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(grace)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
