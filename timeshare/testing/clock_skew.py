"""A process whose wall clock is off: what a host with a wrong clock does to
the parts that read it (bench chaos's ``clock-skew``, tests of the gateway's
clock). A small library built from C with gcc (clock_skew.c), preloaded into
the process; its monotonic clocks are left as they are."""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

SOURCE = Path(__file__).with_name("clock_skew.c")
LIBRARY = "libtimeshare_clock_skew.so"
SKEW_VARIABLE = "TIMESHARE_CLOCK_SKEW_SECONDS"


class ClockSkewUnavailable(RuntimeError):
    """No C compiler to build the library with."""


def library() -> Path:
    """The built library, in a per-user cache reused while its source is unchanged."""
    compiler = shutil.which(os.environ.get("CC", "gcc"))
    if compiler is None:
        raise ClockSkewUnavailable("gcc not found: a skewed clock is built from C")
    digest = hashlib.sha256(SOURCE.read_bytes()).hexdigest()[:16]
    directory = Path(tempfile.gettempdir()) / f"timeshare-clock-skew-{os.getuid()}"
    directory.mkdir(parents=True, exist_ok=True)
    built = directory / f"{digest}-{LIBRARY}"
    with open(directory / ".build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not built.exists():
            partial = directory / f"{built.name}.new"
            command = [compiler, "-O2", "-shared", "-fPIC", "-o", str(partial), str(SOURCE), "-ldl"]
            done = subprocess.run(command, capture_output=True, text=True, check=False)
            if done.returncode != 0:
                raise ClockSkewUnavailable(f"{' '.join(command)} failed: {done.stderr.strip()}")
            os.replace(partial, built)
    return built


def skewed_environment(seconds: float, base: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of a process whose wall clock runs ``seconds`` ahead
    (negative: behind): ``base`` (default: this process's) with the library preloaded."""
    env = dict(os.environ if base is None else base)
    preload = [str(library()), *filter(None, env.get("LD_PRELOAD", "").split(":"))]
    env["LD_PRELOAD"] = ":".join(preload)
    env[SKEW_VARIABLE] = repr(seconds)
    return env
