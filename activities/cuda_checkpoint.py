"""The ``cuda-checkpoint`` backend: NVIDIA's `cuda-checkpoint` utility
(`--action lock|checkpoint|restore|unlock --pid`, `--get-state`), for hosts
where the driver's checkpoint API cannot be used in process. One utility run
per call: slower than the ``cuda`` backend."""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path

from timeshare.activities.backend import BackendConfig, BackendError
from timeshare.activities.checkpointing import ProcessCheckpointBackend
from timeshare.activities.gpus import NoGpus, gpu_inventory


class CudaCheckpointBackend(ProcessCheckpointBackend):
    name = "cuda-checkpoint"

    def __init__(self, config: BackendConfig, utility: str) -> None:
        super().__init__(config)
        self.utility = utility

    @classmethod
    def create(cls, config: BackendConfig) -> CudaCheckpointBackend:
        try:
            gpu_inventory()
        except NoGpus as error:
            raise BackendError(f"backend cuda-checkpoint cannot run here: {error}") from None
        utility = config.cuda_checkpoint_path or shutil.which("cuda-checkpoint")
        if not utility or not Path(utility).exists():
            raise BackendError(
                "the cuda-checkpoint utility was not found; put it on PATH or pass "
                "--cuda-checkpoint PATH (it ships with NVIDIA driver 550 and later)"
            )
        return cls(config, utility)

    def describe(self) -> str:
        return f"cuda-checkpoint ({self.utility})"

    async def state(self, pid: int) -> str:
        return (await self._run("--get-state", "--pid", str(pid))).strip()

    async def act(self, action: str, pid: int) -> None:
        timeout = ["--timeout", str(int(self.lock_timeout * 1000))] if action == "lock" else []
        await self._run("--action", action, "--pid", str(pid), *timeout)

    async def _run(self, *args: str) -> str:
        process = await asyncio.create_subprocess_exec(
            self.utility, *args,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        what = f"cuda-checkpoint {' '.join(args)}"
        try:
            out, err = await self.within_call_timeout(process.communicate(), what)
        except BackendError:
            process.kill()
            await process.wait()
            raise
        if process.returncode != 0:
            raise BackendError(f"{what} failed: {err.decode().strip() or out.decode()}")
        return out.decode()
