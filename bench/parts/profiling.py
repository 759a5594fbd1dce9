"""Sampling profiles of running processes with py-spy, from outside (nothing
in the process changes), summarised as the functions and modules that took
the most samples. Only samples of a thread holding the GIL count: Python's
own CPU, not its waits; the SDK's Rust threads are not seen."""

from __future__ import annotations

import re
import shutil
import signal
import subprocess
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

# "name (path:line)" in py-spy's raw (collapsed) output.
FRAME = re.compile(r"^(?P<name>.*) \((?P<path>[^()]*?)(?::(?P<line>\d+))?\)$")
SAMPLES_PER_SECOND = 200


def py_spy() -> str:
    beside = Path(sys.executable).parent / "py-spy"
    found = str(beside) if beside.exists() else shutil.which("py-spy")
    if found is None:
        raise RuntimeError("py-spy is not installed: pip install py-spy (the dev extra has it)")
    return found


class Profiler:
    """py-spy on ``pid`` from entering to leaving; collapsed stacks to ``output``."""

    def __init__(self, pid: int, output: Path) -> None:
        self.pid, self.output = pid, output
        self._process: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> Profiler:
        command = [
            py_spy(), "record", f"--pid={self.pid}", f"--rate={SAMPLES_PER_SECOND}",
            "--format=raw", f"--output={self.output}", "--nonblocking", "--gil",
        ]  # fmt: skip
        self._process = subprocess.Popen(
            command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        return self

    def __exit__(self, *exc: object) -> None:
        if self._process is not None:
            self._process.send_signal(signal.SIGINT)  # py-spy writes what it has, then ends
            self._process.wait(60)


# Where a file's module path starts: installed packages, else the standard
# library, else this repository's packages.
MODULE_ROOTS = [
    re.compile(r"site-packages/(?P<rest>.*)$"),
    re.compile(r"/lib/python3\.\d+/(?P<rest>.*)$"),
    re.compile(r"/(?P<rest>(?:timeshare|bench)/.*)$"),
]


def relative(path: str) -> str:
    for root in MODULE_ROOTS:
        if match := root.search(path):
            return match["rest"]
    return path


def module_of(path: str) -> str:
    """The package a file is in, to three levels for temporalio (its worker's
    sandbox apart from the rest), two for everything else."""
    parts = relative(path).removesuffix(".py").split("/")
    return ".".join(parts[:3] if parts[0] == "temporalio" else parts[:2])


def parse(frame: str) -> tuple[str, str]:
    """(function with its file, module) of one frame."""
    match = FRAME.match(frame)
    if match is None:
        return frame, frame
    return f"{match['name']} ({relative(match['path'])})", module_of(match["path"])


@dataclass
class Profile:
    samples: int
    # Samples whose innermost frame is the function; that have the function,
    # or the module, anywhere in their stack.
    own: Counter[str]
    total: Counter[str]
    modules: Counter[str]

    @property
    def seconds(self) -> float:
        return self.samples / SAMPLES_PER_SECOND

    def top(self, counter: Counter[str], count: int) -> list[tuple[str, float]]:
        return [(name, n / max(1, self.samples)) for name, n in counter.most_common(count)]


def read_profile(path: Path) -> Profile:
    own: Counter[str] = Counter()
    total: Counter[str] = Counter()
    modules: Counter[str] = Counter()
    samples = 0
    for line in path.read_text().splitlines() if path.exists() else []:
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        frames = [parse(frame) for frame in stack.split(";")]
        if not frames:
            continue
        n = int(count)
        samples += n
        own[frames[-1][0]] += n
        for name in {function for function, _ in frames}:
            total[name] += n
        for module in {module for _, module in frames}:
            modules[module] += n
    return Profile(samples, own, total, modules)
