"""The GPU emulator as tests use it: this test process loads the emulated driver
once per session (the emulator reads its configuration once per process), and
CUDA worker processes run on it through the real cuda-bindings.

Workers are started detached (not children of the test process, which plays
the node agent in backend tests and may not manage its own process tree); each
writes a ready file with its pid and the pids of its non-CUDA children."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType

from timeshare.activities.backends.gpus import DeviceMemory
from timeshare.gpu_check import emulator
from timeshare.gpu_check.emulator import wait_for
from timeshare.self_command import python_module_command
from timeshare.testing.processes import detached

ARGUMENTS = {
    "lock": "CUcheckpointLockArgs",
    "checkpoint": "CUcheckpointCheckpointArgs",
    "restore": "CUcheckpointRestoreArgs",
    "unlock": "CUcheckpointUnlockArgs",
}


@dataclass
class Emulator:
    lib_dir: Path
    state_dir: Path
    log: Path
    env: dict[str, str]
    driver: ModuleType

    def state(self, pid: int) -> tuple[int, int | None]:
        result, state = self.driver.cuCheckpointProcessGetState(pid)
        return int(result), None if state is None else int(state)

    def restore_tid(self, pid: int) -> tuple[int, int | None]:
        result, tid = self.driver.cuCheckpointProcessGetRestoreThreadId(pid)
        return int(result), tid

    def act(self, action: str, pid: int, timeout_ms: int = 0) -> int:
        arguments = getattr(self.driver, ARGUMENTS[action])()
        if action == "lock":
            arguments.timeoutMs = timeout_ms
        function = getattr(self.driver, f"cuCheckpointProcess{action.capitalize()}")
        (result,) = function(pid, arguments)
        return int(result)

    def utility(self, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(self.lib_dir / emulator.UTILITY), *args],
            env={**os.environ, **self.env, **env},
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )


# Set once emulator_in_this_process has loaded the emulated driver here: from
# then on this process's cuda-bindings is the emulator's, whatever a test wants.
_loaded_here: list[Path] = []


def loaded_in_this_process() -> bool:
    """Whether this process's driver is the emulator a test fixture loaded (a
    test meant for the real driver would run on the emulator unawares). A
    process started on the emulator's LD_LIBRARY_PATH on purpose (timeshare.gpu_check.main
    --emulator) does not count."""
    return bool(_loaded_here)


@contextmanager
def emulator_in_this_process(root: Path) -> Iterator[Emulator]:
    """Build the emulator, point this process's configuration at ``root`` and
    load its libcuda.so.1 here (before cuda-bindings looks for a driver)."""
    lib_dir = emulator.build(emulator.default_build_dir())
    env = emulator.environment(lib_dir, root / "state", root / "calls.jsonl", gpu_memory=1 << 30)
    saved = {name: os.environ.get(name) for name in env}
    # This process plays the agent: it loads the emulated driver itself (read once,
    # at the first CUDA call), so its configuration must be in place before. The
    # utility finds the state directory the same way; PATH and LD_LIBRARY_PATH stay.
    os.environ.update({n: v for n, v in env.items() if n not in ("LD_LIBRARY_PATH", "PATH")})
    try:
        emulator.load_into_this_process(lib_dir)
        _loaded_here.append(lib_dir)
        from cuda.bindings import driver

        (result,) = driver.cuInit(0)
        assert result == driver.CUresult.CUDA_SUCCESS
        yield Emulator(lib_dir, root / "state", root / "calls.jsonl", env, driver)
    finally:
        emulator.clear_faults(root / "state")
        for name, value in saved.items():
            if name in ("LD_LIBRARY_PATH", "PATH"):
                continue
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


@dataclass
class CudaWorker:
    """A detached CUDA process (a rank) and its children without CUDA."""

    pid: int
    counter: Path
    children: list[int] = field(default_factory=list)

    def count(self) -> int:
        text = self.counter.read_text()
        if not text.isdigit():
            raise AssertionError(f"worker {self.pid} reports {text!r}")
        return int(text)

    def child_count(self, index: int = 0) -> int:
        path = Path(f"{self.counter}.child{index}")
        text = path.read_text() if path.exists() else ""
        return int(text) if text.isdigit() else 0

    def advancing(self, steps: int = 3, timeout: float = 30) -> int:
        """Waits until the counter has moved ``steps`` further; returns it."""
        start = self.count()
        return wait_for(
            lambda: (n := self.count()) >= start + steps and n,
            timeout,
            f"worker {self.pid} to make progress from {start}",
        )

    def kill(self) -> None:
        for pid in [*self.children, self.pid]:
            with suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def start_worker(
    env: dict[str, str],
    directory: Path,
    name: str,
    nbytes: int = 1 << 20,
    children: int = 0,
    register: tuple[str, str, str] | None = None,
    timeout: float = 60,
    start_when: Path | None = None,
    device: int = 0,
) -> CudaWorker:
    """A CUDA worker on the emulator (or, with the real driver's environment,
    on a GPU), detached from this process; returns once it is up (with
    ``start_when``: once it runs, before it starts CUDA when that file appears)."""
    counter, ready = directory / f"{name}.count", directory / f"{name}.ready"
    options = ["--children", str(children), "--ready", str(ready), "--interval", "0.01",
               "--device", str(device)]  # fmt: skip
    if register:
        options += ["--register", *register]
    if start_when:
        options += ["--wait-for", str(start_when)]
    command = " ".join(
        [*(f"{k}='{v}'" for k, v in env.items()), "exec",
         *python_module_command(emulator.CUDA_WORKER), str(nbytes), str(counter), *options]
    )  # fmt: skip
    detached("sh", "-c", command)
    info = wait_for(
        lambda: ready.exists() and json.loads(ready.read_text()), timeout, f"worker {name} to start"
    )
    return CudaWorker(pid=int(info["pid"]), counter=counter, children=list(info["children"]))


def process_state(pid: int) -> str:
    """The state letter of /proc/<pid>/stat ("" if gone)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return ""


def nvml_device_memory(env: dict[str, str]) -> dict[str, DeviceMemory]:
    """What timeshare.activities.backends.gpus.device_memory would read through the real
    pynvml on the emulator, read in a child process (so that this test process
    never loads an NVML library, which other tests must not find)."""
    view = emulator.nvml_view(env)
    return {
        f"gpu{index}": DeviceMemory(
            free_bytes=gpu["free"], total_bytes=gpu["total"], by_pid=dict(gpu["processes"])
        )
        for index, gpu in enumerate(view["gpus"])
    }
