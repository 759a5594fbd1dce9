"""The ``cuda`` backend: the CUDA driver's checkpoint API called in process
through cuda-bindings (`cuCheckpointProcessLock/Checkpoint/Restore/Unlock/
GetState`, driver 570 or later). No process is spawned per action. Each call
runs in a worker thread under the call timeout, so a hung driver call fails
the switch instead of blocking the node."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from types import ModuleType
from typing import Any

from timeshare.activities.backend import BackendConfig, BackendError
from timeshare.activities.checkpointing import ProcessCheckpointBackend
from timeshare.activities.gpus import CHECKPOINT_API_DRIVER, NoGpus, gpu_inventory

STATES = {0: "running", 1: "locked", 2: "checkpointed", 3: "failed"}
ARGUMENTS = {
    "lock": "CUcheckpointLockArgs",
    "checkpoint": "CUcheckpointCheckpointArgs",
    "restore": "CUcheckpointRestoreArgs",
    "unlock": "CUcheckpointUnlockArgs",
}


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


class CudaDriverBackend(ProcessCheckpointBackend):
    name = "cuda"

    def __init__(self, config: BackendConfig, driver: ModuleType) -> None:
        super().__init__(config)
        self.driver = driver

    @classmethod
    def create(cls, config: BackendConfig) -> CudaDriverBackend:
        try:
            gpus = gpu_inventory()
        except NoGpus as error:
            raise BackendError(f"backend cuda cannot run here: {error}") from None
        if gpus and not gpus[0].checkpoint_api:
            raise BackendError(
                f"backend cuda needs NVIDIA driver {CHECKPOINT_API_DRIVER} or later, found "
                f"{gpus[0].driver_version}; use --backend cuda-checkpoint"
            )
        driver = load_driver()
        try:
            (result,) = driver.cuInit(0)
        except Exception as error:  # cuda-bindings raises its own loader errors
            raise BackendError(f"backend cuda cannot load the CUDA driver: {error}") from None
        if result != driver.CUresult.CUDA_SUCCESS:
            raise BackendError(f"cuInit failed: {result}")
        return cls(config, driver)

    def describe(self) -> str:
        return "cuda (driver checkpoint API)"

    async def state(self, pid: int) -> str:
        result, state = await self._call(self.driver.cuCheckpointProcessGetState, pid)
        self._check(result, f"reading the CUDA state of process {pid}")
        return STATES.get(int(state), "failed")

    async def act(self, action: str, pid: int) -> None:
        arguments = getattr(self.driver, ARGUMENTS[action])()
        if action == "lock":
            arguments.timeoutMs = int(self.lock_timeout * 1000)
        function = getattr(self.driver, f"cuCheckpointProcess{action.capitalize()}")
        (result,) = await self._call(function, pid, arguments)
        self._check(result, f"{action} of process {pid}")

    async def _call(self, function: Callable[..., Any], *args: Any) -> Any:
        name = getattr(function, "__name__", "driver call")
        return await self.within_call_timeout(asyncio.to_thread(function, *args), name)

    def _check(self, result: Any, what: str) -> None:
        if result != self.driver.CUresult.CUDA_SUCCESS:
            raise BackendError(f"{what} failed: {getattr(result, 'name', result)}")
