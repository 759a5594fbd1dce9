"""A GPU emulator for tests: a ``libcuda.so.1`` and a ``libnvidia-ml.so.1`` built from C
with gcc, which the real cuda-bindings (``cuda.bindings.driver``) and the real pynvml
load through ``LD_LIBRARY_PATH``, plus a ``cuda-checkpoint`` utility on top of them.

The checkpoint API acts across processes as the driver's does: ``cuInit`` starts a
restore thread in the calling process, and a ``cuCheckpointProcess*`` call from
another process is carried out by that thread, so a frozen (SIGSTOPped) target makes
its callers wait. See ``libcuda.c`` for the behaviour and its sources.

Configuration (environment of every process that loads the libraries; read once per
process):

==========================================  ============================================
``TIMESHARE_EMULATOR_DIR``                  state directory shared by all processes
``TIMESHARE_EMULATOR_LOG``                  JSON-lines call log (appended): every API
                                            call but the loader's (cuGetProcAddress*,
                                            cuDriverGetVersion, cuGetError*), plus
                                            ``restoreThread.<op>`` for the work a
                                            target's restore thread does
``TIMESHARE_EMULATOR_LOG_CALLS``            log only calls starting with these
                                            comma-separated prefixes
``TIMESHARE_EMULATOR_DRIVER``               driver version string, "580.65.06"
``TIMESHARE_EMULATOR_CUDA_VERSION``         cuDriverGetVersion; default from the driver
                                            branch (580: 13000, 570: 12080, ...)
``TIMESHARE_EMULATOR_GPUS``                 number of GPUs, 1
``TIMESHARE_EMULATOR_GPU_MEMORY``           bytes per GPU ("80G", "81559M"), 80G
``TIMESHARE_EMULATOR_GPU_NAME``             "NVIDIA H100 80GB HBM3"
``TIMESHARE_EMULATOR_RESERVED_MEMORY``      bytes NVML counts used with no process
``TIMESHARE_EMULATOR_COPY_RATE``            bytes/s a checkpoint or restore copies
                                            (0: instant); the in-progress states last
                                            that long
``TIMESHARE_EMULATOR_LOCK_TIMEOUT_RESULT``  what a timed-out lock returns, 600
                                            (CUDA_ERROR_NOT_READY)
``TIMESHARE_EMULATOR_NVML_PROCESS_MEMORY``  "unavailable": usedGpuMemory is
                                            NVML_VALUE_NOT_AVAILABLE (pynvml: None)
``TIMESHARE_EMULATOR_NVML_INIT_ERROR``      an NVML return code nvmlInit fails with
``TIMESHARE_EMULATOR_UTILIZATION``          GPU utilization percent, or "unsupported"
``TIMESHARE_EMULATOR_TOGGLE_ONLY``          "1": cuda-checkpoint is the r550 utility
==========================================  ============================================

Faults are injected through the control file ``<state dir>/faults``
(:func:`add_fault`, :func:`clear_faults`), re-read at every call.
"""

from __future__ import annotations

import ctypes
import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Literal, TypedDict, TypeVar

HERE = Path(__file__).resolve().parent
SOURCES = ("emulator.h", "libcuda.c", "libnvidia_ml.c", "cuda_checkpoint.c")
CFLAGS = ("-O1", "-g", "-Wall", "-Wextra", "-Wno-format-truncation", "-pthread")
LIBCUDA = "libcuda.so.1"
LIBNVML = "libnvidia-ml.so.1"
UTILITY = "cuda-checkpoint"
STAMP = ".emulator-build"
# The CUDA process the emulator's checks run (python -m CUDA_WORKER).
CUDA_WORKER = "timeshare.gpu_check.emulator.cuda_worker"

# CUprocessState (cuda.h, CUDA 13.x)
RUNNING, LOCKED, CHECKPOINTED, FAILED, CHECKPOINTING, RESTORING = range(6)

# CUresult codes the emulator returns (cuda.h)
CUDA_SUCCESS = 0
CUDA_ERROR_INVALID_VALUE = 1
CUDA_ERROR_OUT_OF_MEMORY = 2
CUDA_ERROR_NOT_INITIALIZED = 3
CUDA_ERROR_OPERATING_SYSTEM = 304
CUDA_ERROR_ILLEGAL_STATE = 401
CUDA_ERROR_NOT_FOUND = 500
CUDA_ERROR_NOT_READY = 600
CUDA_ERROR_TIMEOUT = 909

FaultCall = Literal["lock", "checkpoint", "restore", "unlock", "get_state", "get_restore_tid", "*"]
FaultEffect = Literal["fail", "error", "hang", "delay"]


class EmulatorError(Exception):
    """The emulator could not be built."""


def gcc() -> str | None:
    """The C compiler the emulator is built with, if there is one."""
    return shutil.which(os.environ.get("CC", "gcc"))


def source_hash(compiler: str = "gcc") -> str:
    """What a build depends on: the sources, the flags and the compiler's version."""
    digest = hashlib.sha256()
    version = subprocess.run(
        [compiler, "-dumpfullversion"], capture_output=True, text=True, check=False
    ).stdout
    digest.update(version.encode())
    for name in SOURCES:
        digest.update(name.encode())
        digest.update((HERE / name).read_bytes())
    digest.update(" ".join(CFLAGS).encode())
    return digest.hexdigest()


def default_build_dir() -> Path:
    """A per-user cache outside the repository, reused while the sources are unchanged."""
    return Path(tempfile.gettempdir()) / f"timeshare-emulator-{os.getuid()}"


def build(directory: Path) -> Path:
    """Compile libcuda.so.1, libnvidia-ml.so.1 and cuda-checkpoint into ``directory``
    (created if needed) and return it. Skipped when the last build there came from the
    same sources; concurrent builders wait for each other."""
    compiler = gcc()
    if compiler is None:
        raise EmulatorError("gcc not found: the GPU emulator is built from C at test time")
    directory.mkdir(parents=True, exist_ok=True)
    wanted = source_hash(compiler)
    outputs = [directory / LIBCUDA, directory / LIBNVML, directory / UTILITY]
    with open(directory / ".build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        stamp = directory / STAMP
        if stamp.exists() and stamp.read_text() == wanted and all(p.exists() for p in outputs):
            return directory
        shared = [*CFLAGS, "-shared", "-fPIC", "-fvisibility=hidden"]
        steps = [
            [compiler, *shared, f"-Wl,-soname,{LIBCUDA}", "-o", f"{LIBCUDA}.new", "libcuda.c"],
            [compiler, *shared, f"-Wl,-soname,{LIBNVML}", "-o", f"{LIBNVML}.new", "libnvidia_ml.c"],
        ]
        for command in steps:
            _compile(command, directory)
        # The utility links the freshly built driver, found next to it at run time.
        os.replace(directory / f"{LIBCUDA}.new", directory / LIBCUDA)
        os.replace(directory / f"{LIBNVML}.new", directory / LIBNVML)
        _compile(
            [compiler, *CFLAGS, "-o", f"{UTILITY}.new", "cuda_checkpoint.c",
             f"-L{directory}", f"-l:{LIBCUDA}", "-Wl,-rpath,$ORIGIN"],
            directory,
        )  # fmt: skip
        os.replace(directory / f"{UTILITY}.new", directory / UTILITY)
        stamp.write_text(wanted)
    return directory


def _compile(command: list[str], directory: Path) -> None:
    resolved = [str(HERE / part) if part.endswith(".c") else part for part in command]
    resolved = [str(directory / part) if part.endswith(".new") else part for part in resolved]
    done = subprocess.run(resolved, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise EmulatorError(f"{' '.join(resolved)} failed:\n{done.stderr}")


def environment(
    lib_dir: Path,
    state_dir: Path,
    log_path: Path,
    *,
    gpus: int = 1,
    gpu_memory: int | None = None,
    driver: str = "580.65.06",
    cuda_version: int | None = None,
    extra: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """The variables a process needs to run on the emulator: merge them over
    ``os.environ`` for a child process. ``LD_LIBRARY_PATH`` keeps what was there after
    the emulator's directory."""
    state_dir.mkdir(parents=True, exist_ok=True)
    previous = os.environ.get("LD_LIBRARY_PATH", "")
    env = {
        "LD_LIBRARY_PATH": f"{lib_dir}:{previous}" if previous else str(lib_dir),
        "TIMESHARE_EMULATOR_DIR": str(state_dir),
        "TIMESHARE_EMULATOR_LOG": str(log_path),
        "TIMESHARE_EMULATOR_GPUS": str(gpus),
        "TIMESHARE_EMULATOR_DRIVER": driver,
        "PATH": f"{lib_dir}:{os.environ.get('PATH', '')}",  # the cuda-checkpoint utility
    }
    if gpu_memory is not None:
        env["TIMESHARE_EMULATOR_GPU_MEMORY"] = str(gpu_memory)
    if cuda_version is not None:
        env["TIMESHARE_EMULATOR_CUDA_VERSION"] = str(cuda_version)
    env.update(extra or {})
    return env


def load_into_this_process(lib_dir: Path) -> None:
    """Load the emulated libcuda.so.1 into this process before cuda-bindings looks for
    the driver: cuda.pathfinder first asks the dynamic loader whether a library with
    that soname is already loaded, so this one is used without LD_LIBRARY_PATH (which
    the loader only reads at process start). Raises if another libcuda.so.1 is already
    loaded here. The emulator's environment must be in os.environ before the first
    CUDA call: it is read once per process."""
    ours = (lib_dir / LIBCUDA).resolve()
    for line in Path("/proc/self/maps").read_text().splitlines():
        path = line.split()[-1] if line.split() else ""
        if path.endswith("/" + LIBCUDA) and Path(path).resolve() != ours:
            raise EmulatorError(f"another {LIBCUDA} is already loaded here: {path}")
    ctypes.CDLL(str(ours), mode=ctypes.RTLD_GLOBAL)


# ------------------------------------------------------------------ faults


def faults_path(state_dir: Path) -> Path:
    return state_dir / "faults"


def add_fault(
    state_dir: Path,
    pid: int | Literal["*"],
    call: FaultCall,
    effect: FaultEffect,
    argument: int | None = None,
) -> str:
    """Append a rule to the control file and return its line (for :func:`remove_fault`).
    ``fail [code]``: the call fails and the process enters CU_PROCESS_STATE_FAILED;
    ``error <code>``: the call returns code, state unchanged; ``hang``: the call does not
    return while the rule is there (checkpoint/restore show their in-progress state);
    ``delay <ms>``: the operation takes that much longer."""
    line = f"{pid} {call} {effect}" + ("" if argument is None else f" {argument}")
    with faults_path(state_dir).open("a") as file:
        file.write(line + "\n")
    return line


def remove_fault(state_dir: Path, line: str) -> None:
    path = faults_path(state_dir)
    kept = [rule for rule in path.read_text().splitlines() if rule.strip() != line.strip()]
    partial = path.with_name("faults.partial")
    partial.write_text("".join(rule + "\n" for rule in kept))
    os.replace(partial, path)


def clear_faults(state_dir: Path) -> None:
    faults_path(state_dir).unlink(missing_ok=True)


# ------------------------------------------------------------------ the call log


class LogEntry(TypedDict):
    t: float
    call: str
    pid: int
    caller: int
    tid: int
    result: int | None
    phase: Literal["begin", "end"]


# Where each call log was when mark() was last called: the log of one process's
# emulator (a test session's) outlives each test, and process ids are reused.
_marks: dict[Path, int] = {}


def mark(path: Path) -> None:
    """From now on read_log(path) and its users see only what comes after."""
    _marks[path] = path.stat().st_size if path.exists() else 0


def read_log(path: Path) -> list[LogEntry]:
    """Every complete line of the JSON-lines call log since the last mark(),
    in file order."""
    if not path.exists():
        return []
    with path.open("rb") as file:
        file.seek(_marks.get(path, 0))
        text = file.read().decode()
    entries: list[LogEntry] = []
    for line in text.splitlines(keepends=True):
        if line.endswith("\n") and line.strip():
            entries.append(json.loads(line))
    return entries


def calls(path: Path, call: str, pid: int | None = None) -> list[LogEntry]:
    """The log lines of one function, optionally for one (target) pid."""
    return [e for e in read_log(path) if e["call"] == call and (pid is None or e["pid"] == pid)]


def intervals(path: Path, call: str) -> list[tuple[float, float, int]]:
    """(begin, end, pid) of each completed call of ``call``, pairing a begin with the
    next end of the same caller thread and target."""
    open_calls: dict[tuple[int, int], float] = {}
    done: list[tuple[float, float, int]] = []
    for entry in read_log(path):
        if entry["call"] != call:
            continue
        key = (entry["tid"], entry["pid"])
        if entry["phase"] == "begin":
            open_calls[key] = entry["t"]
        elif key in open_calls:
            done.append((open_calls.pop(key), entry["t"], entry["pid"]))
    return done


# ------------------------------------------------------------------ observing processes

T = TypeVar("T")


def wait_for(probe: Callable[[], T | None], timeout: float, what: str, interval: float = 0.01) -> T:
    """Poll ``probe`` until it returns something other than None or False; raise
    AssertionError naming ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = probe()
        if value is not None and value is not False:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(interval)


NVML_QUERY = """
import json, warnings
with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    import pynvml
pynvml.nvmlInit()
gpus = []
for index in range(pynvml.nvmlDeviceGetCount()):
    handle = pynvml.nvmlDeviceGetHandleByIndex(index)
    memory = pynvml.nvmlDeviceGetMemoryInfo(handle)
    gpus.append({
        "uuid": pynvml.nvmlDeviceGetUUID(handle),
        "total": memory.total, "used": memory.used, "free": memory.free,
        "processes": [[p.pid, p.usedGpuMemory]
                      for p in pynvml.nvmlDeviceGetComputeRunningProcesses(handle)],
    })
print(json.dumps({"driver": pynvml.nvmlSystemGetDriverVersion(), "gpus": gpus}))
pynvml.nvmlShutdown()
"""


class NvmlGpu(TypedDict):
    uuid: str
    total: int
    used: int
    free: int
    processes: list[tuple[int, int | None]]


class NvmlView(TypedDict):
    driver: str
    gpus: list[NvmlGpu]


def nvml_view(env: Mapping[str, str]) -> NvmlView:
    """What the real pynvml reports on the emulator, read in a child process (so this
    process never loads an NVML library)."""
    done = subprocess.run(
        [sys.executable, "-c", NVML_QUERY],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    if done.returncode != 0:
        raise AssertionError(f"pynvml query failed: {done.stderr}")
    raw = json.loads(done.stdout)
    gpus: list[NvmlGpu] = [
        {
            "uuid": gpu["uuid"],
            "total": gpu["total"],
            "used": gpu["used"],
            "free": gpu["free"],
            "processes": [(int(pid), count) for pid, count in gpu["processes"]],
        }
        for gpu in raw["gpus"]
    ]
    return {"driver": raw["driver"], "gpus": gpus}


def nvml_process_memory(env: Mapping[str, str]) -> dict[int, int | None]:
    """Device bytes NVML reports per pid, over every GPU (None: not available)."""
    used: dict[int, int | None] = {}
    for gpu in nvml_view(env)["gpus"]:
        for pid, count in gpu["processes"]:
            before = used.get(pid, 0)
            used[pid] = None if count is None or before is None else before + count
    return used
