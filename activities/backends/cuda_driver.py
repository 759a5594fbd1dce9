"""The ``cuda`` backend: the CUDA driver's checkpoint API called in process
through cuda-bindings (`cuCheckpointProcessGetRestoreThreadId/GetState/Lock/
Checkpoint/Restore/Unlock`, driver 570 or later). No process is spawned per
action.

Each call runs to its end in a thread of the backend's own pool, one per
rank at once, so ranks move in parallel. The driver states no rule against
concurrent calls on different pids ([API], CUDA Driver API "CUDA
Checkpointing"); timeshare/gpu_check/emulator/libcuda.c's header holds the research and its
exceptions (NCCL communicators, `--launch-job` peers, which the nccl hook
tears down first). A lock is bounded by the driver's own timeoutMs; no call is
abandoned while it runs (see checkpointing.py).

At start every function above must exist twice over: in cuda-bindings
(13.0.0 and 13.0.1 lack cuCheckpointProcessRestore, so a checkpoint would
succeed and its restore raise AttributeError, stranding the job in host
memory) and in the driver (cuGetProcAddress; the API arrived with CUDA 12.8,
driver 570). Otherwise the agent refuses to start, in one line.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from importlib.metadata import PackageNotFoundError, version
from types import ModuleType
from typing import Any

from timeshare.activities.backends.base import BackendConfig, BackendError
from timeshare.activities.backends.checkpointing import ProcessCheckpointBackend
from timeshare.activities.backends.cuda_states import CudaState, NotCuda, OutOfDeviceMemory
from timeshare.activities.backends.gpus import CHECKPOINT_API_DRIVER, NoGpus, gpu_inventory

# CUprocessState ([API]; 4 and 5 from CUDA 13, cuda-bindings 13.x).
STATES = {
    0: CudaState.RUNNING,
    1: CudaState.LOCKED,
    2: CudaState.CHECKPOINTED,
    3: CudaState.FAILED,
    4: CudaState.CHECKPOINTING,
    5: CudaState.RESTORING,
}
ARGUMENTS = {
    "lock": "CUcheckpointLockArgs",
    "checkpoint": "CUcheckpointCheckpointArgs",
    "restore": "CUcheckpointRestoreArgs",
    "unlock": "CUcheckpointUnlockArgs",
}
NEEDED = (
    "cuCheckpointProcessGetRestoreThreadId",
    "cuCheckpointProcessGetState",
    "cuCheckpointProcessLock",
    "cuCheckpointProcessCheckpoint",
    "cuCheckpointProcessRestore",
    "cuCheckpointProcessUnlock",
)
# The CUDA version that introduced the checkpoint API (cuda.h 12.8).
CHECKPOINT_API_CUDA = 12080
# Threads for driver calls: one per rank of the largest job, and then some.
MAX_CONCURRENT_CALLS = 64
FIX_BINDINGS = "pip install 'cuda-bindings>=12.8,!=13.0.0,!=13.0.1'"


def load_driver() -> ModuleType:
    try:
        from cuda.bindings import driver
    except ImportError:
        raise BackendError(
            "backend cuda needs cuda-bindings (pip install 'timeshare[cuda]'); "
            "or use --backend cuda-checkpoint"
        ) from None
    module: ModuleType = driver
    return module


def bindings_version() -> str:
    try:
        return version("cuda-bindings")
    except PackageNotFoundError:
        return "unknown"


def check_bindings(driver: ModuleType) -> None:
    """Every function the backend calls exists in the installed cuda-bindings."""
    missing = [name for name in NEEDED if not hasattr(driver, name)]
    if missing:
        raise BackendError(
            f"backend cuda: cuda-bindings {bindings_version()} has no {', '.join(missing)} "
            f"(13.0.0 and 13.0.1 lack the restore); {FIX_BINDINGS}"
        )


def check_driver(driver: ModuleType, driver_version: str) -> None:
    """Every function the backend calls exists in the loaded driver."""
    flags = driver.CUdriverProcAddress_flags.CU_GET_PROC_ADDRESS_DEFAULT
    missing = []
    for name in NEEDED:
        result, function, status = driver.cuGetProcAddress(
            name.encode(), CHECKPOINT_API_CUDA, flags
        )
        found = status is None or int(status) == 0  # CU_GET_PROC_ADDRESS_SUCCESS
        if result != driver.CUresult.CUDA_SUCCESS or not function or not found:
            missing.append(name)
    if missing:
        raise BackendError(
            f"backend cuda: NVIDIA driver {driver_version} has no {', '.join(missing)}; "
            f"the checkpoint API needs driver {CHECKPOINT_API_DRIVER} or later"
        )


class CudaDriverBackend(ProcessCheckpointBackend):
    name = "cuda"

    def __init__(
        self, config: BackendConfig, driver: ModuleType, threads: int = MAX_CONCURRENT_CALLS
    ) -> None:
        # Calls that hang keep their thread: at most half the pool.
        super().__init__(config, stuck_limit=max(1, threads // 2))
        self.driver = driver
        self._executor = ThreadPoolExecutor(threads, thread_name_prefix="cuda-call")

    @classmethod
    def create(cls, config: BackendConfig) -> CudaDriverBackend:
        return cls.create_with(config, load_driver)

    @classmethod
    def create_with(
        cls, config: BackendConfig, loader: Callable[[], ModuleType]
    ) -> CudaDriverBackend:
        """Checks everything the backend needs, in one line each, before it runs."""
        try:
            gpus = gpu_inventory()
        except NoGpus as error:
            raise BackendError(f"backend cuda cannot run here: {error}") from None
        if gpus and not gpus[0].checkpoint_api:
            raise BackendError(
                f"backend cuda needs NVIDIA driver {CHECKPOINT_API_DRIVER} or later, found "
                f"{gpus[0].driver_version}; with an older driver use --backend freeze"
            )
        driver = loader()
        check_bindings(driver)
        try:
            (result,) = driver.cuInit(0)
        except Exception as error:  # cuda-bindings raises its own loader errors
            raise BackendError(f"backend cuda cannot load the CUDA driver: {error}") from None
        if result != driver.CUresult.CUDA_SUCCESS:
            raise BackendError(f"backend cuda: cuInit failed: {getattr(result, 'name', result)}")
        check_driver(driver, gpus[0].driver_version if gpus else "unknown")
        return cls(config, driver)

    def describe(self) -> str:
        return f"cuda (driver checkpoint API, cuda-bindings {bindings_version()})"

    def _not_cuda(self, result: Any) -> bool:
        """The driver's answer for a pid that holds no CUDA context. Driver
        580.159.04 answered CUDA_ERROR_NOT_INITIALIZED for a process that
        never touched CUDA, to a caller that had called cuInit (docs/facts.md);
        [CRIU] and ai-dynamo's cuda-checkpoint-helper expect
        CUDA_ERROR_INVALID_VALUE, which older drivers may give. This agent's
        own cuInit succeeded before it started (create_with), so here neither
        answer is about the caller."""
        codes = self.driver.CUresult
        return bool(result in (codes.CUDA_ERROR_NOT_INITIALIZED, codes.CUDA_ERROR_INVALID_VALUE))

    async def restore_thread(self, pid: int) -> int | None:
        result, tid = await self._call(self.driver.cuCheckpointProcessGetRestoreThreadId, pid)
        if self._not_cuda(result):
            return None
        self._check(result, f"asking process {pid} for its CUDA restore thread")
        return int(tid)

    async def read_state(self, pid: int) -> CudaState:
        try:
            result, state = await self._call(self.driver.cuCheckpointProcessGetState, pid)
        except ValueError:
            # cuda-bindings 12.x turns CUDA 13's in-progress values into ValueError.
            return CudaState.BUSY
        if self._not_cuda(result):
            raise NotCuda(pid)
        self._check(result, f"reading the CUDA state of process {pid}")
        found = STATES.get(int(state))
        if found is None:
            raise BackendError(f"process {pid} reports CUDA state {int(state)}, unknown here")
        return found

    async def act(self, action: str, pid: int) -> None:
        arguments = getattr(self.driver, ARGUMENTS[action])()
        if action == "lock":
            # [API] CUcheckpointLockArgs.timeoutMs: past it the process is left RUNNING.
            arguments.timeoutMs = max(1, int(self.lock_timeout * 1000))
        function = getattr(self.driver, f"cuCheckpointProcess{action.capitalize()}")
        (result,) = await self._call(function, pid, arguments)
        if action == "restore" and result == self.driver.CUresult.CUDA_ERROR_OUT_OF_MEMORY:
            raise OutOfDeviceMemory(f"restore of process {pid} failed: {self._name(result)}")
        self._check(result, f"{action} of process {pid}")

    async def _call(self, function: Callable[..., Any], *args: Any) -> Any:
        """Runs in the pool until the driver returns: the caller bounds the
        wait (checkpointing.py), never the call."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, function, *args)

    def _check(self, result: Any, what: str) -> None:
        if result != self.driver.CUresult.CUDA_SUCCESS:
            raise BackendError(f"{what} failed: {self._name(result)}")

    def _name(self, result: Any) -> str:
        name = getattr(result, "name", str(result))
        with contextlib.suppress(Exception):
            error, text = self.driver.cuGetErrorString(result)
            if error == self.driver.CUresult.CUDA_SUCCESS and text:
                return f"{name} ({text.decode() if isinstance(text, bytes) else text})"
        return str(name)
