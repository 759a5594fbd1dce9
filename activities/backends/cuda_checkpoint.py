"""The ``cuda-checkpoint`` backend: NVIDIA's `cuda-checkpoint` utility
(`--get-restore-tid`, `--get-state`, `--action lock|checkpoint|restore|unlock
--pid`), for hosts where the driver's checkpoint API cannot be used in process
(no cuda-bindings in the agent's environment).

Only the utility's own "no restore thread" answer, as read on driver 580
(docs/facts.md), means a process holds no CUDA context; any other failure of a
probe or a state read is an error that names it, never "nothing to move".

One utility process per call, and one per rank at once, so ranks move in
parallel. Each run is waited for until it exits: a run past the call timeout
leaves the job's state unknown rather than being killed mid-operation (see
checkpointing.py).

The `--action` and `--get-state` interface is the 570 utility's ([README]
"570 Features"; the r550 one only toggles): the agent refuses to start with a
driver older than 570, or with a utility whose `--help` offers no `--action`
(the check [CRIU] cuda_plugin_init makes, cuda_checkpoint_supports_flag).
"""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path

from timeshare.activities.backends.base import BackendConfig, BackendError
from timeshare.activities.backends.checkpointing import ProcessCheckpointBackend
from timeshare.activities.backends.cuda_states import CudaState, NotCuda, OutOfDeviceMemory
from timeshare.activities.backends.gpus import CHECKPOINT_API_DRIVER, NoGpus, gpu_inventory

HELP_SECONDS = 30.0
NEEDED_FLAGS = ("--action", "--get-state", "--get-restore-tid")
# The one answer that means "this process holds no CUDA context": what the
# 580.159.04 utility printed (stderr, exit 1) for a process without CUDA
# (docs/facts.md), followed by the pid. Anything else that fails (a refusal,
# "Insufficient driver", "Error initializing CUDA", a utility that cannot load
# or run, output never seen) is an error: read as "no CUDA", it would turn a
# switch into a silent no-op that leaves the job's state on the device.
NO_RESTORE_THREAD = "Could not find restore thread for process ID"


class CudaCheckpointBackend(ProcessCheckpointBackend):
    name = "cuda-checkpoint"

    def __init__(self, config: BackendConfig, utility: str) -> None:
        super().__init__(config)
        self.utility = utility

    @classmethod
    def create(cls, config: BackendConfig) -> CudaCheckpointBackend:
        try:
            gpus = gpu_inventory()
        except NoGpus as error:
            raise BackendError(f"backend cuda-checkpoint cannot run here: {error}") from None
        if gpus and not gpus[0].checkpoint_api:
            raise BackendError(
                f"backend cuda-checkpoint needs NVIDIA driver {CHECKPOINT_API_DRIVER} or later "
                f"(the utility's --action interface), found {gpus[0].driver_version}; with an "
                "older driver use --backend freeze"
            )
        utility = config.cuda_checkpoint_path or shutil.which("cuda-checkpoint")
        if not utility or not Path(utility).exists():
            raise BackendError(
                "the cuda-checkpoint utility was not found; put it on PATH or pass "
                "--cuda-checkpoint PATH (github.com/NVIDIA/cuda-checkpoint)"
            )
        check_interface(utility)
        return cls(config, utility)

    def describe(self) -> str:
        return f"cuda-checkpoint ({self.utility})"

    async def restore_thread(self, pid: int) -> int | None:
        args = ("--get-restore-tid", "--pid", str(pid))
        code, out, err = await self._run(*args)
        if code != 0:
            if f"{NO_RESTORE_THREAD} {pid}" in err.splitlines():
                return None
            raise self._failure(args, code, out, err)
        try:
            return int(out.strip())
        except ValueError:
            raise self._failure(args, code, out, err, "not a thread id") from None

    async def read_state(self, pid: int) -> CudaState:
        args = ("--get-state", "--pid", str(pid))
        code, out, err = await self._run(*args)
        if code != 0:
            # What --get-state prints for a process without CUDA has not been
            # read: the restore thread's answer, which has, tells.
            if await self.restore_thread(pid) is None:
                raise NotCuda(pid)
            raise self._failure(args, code, out, err)
        # [CRIU] get_task_state_enum matches the printed state by its prefix.
        for state in CudaState:
            if out.startswith(state.value):
                return state
        raise self._failure(args, code, out, err, "not a state")

    async def act(self, action: str, pid: int) -> None:
        timeout = (
            ["--timeout", str(max(1, int(self.lock_timeout * 1000)))] if action == "lock" else []
        )
        code, out, err = await self._run("--action", action, "--pid", str(pid), *timeout)
        if code != 0:
            # The driver's own words for CUDA_ERROR_OUT_OF_MEMORY, as the
            # utility printed them in NVIDIA/cuda-checkpoint#44.
            failed = OutOfDeviceMemory if action == "restore" and '"out of memory"' in err else None
            raise (failed or BackendError)(
                f"{action} of process {pid} failed (cuda-checkpoint): {err or out}"
            )

    async def _run(self, *args: str) -> tuple[int, str, str]:
        """One run of the utility, waited for until it exits."""
        try:
            process = await asyncio.create_subprocess_exec(
                self.utility, *args,
                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
            )  # fmt: skip
        except OSError as error:
            raise BackendError(
                f"the cuda-checkpoint utility at {self.utility} could not run "
                f"({error.strerror or error}); check that the agent's user may run it"
            ) from None
        out, err = await process.communicate()
        code = process.returncode if process.returncode is not None else -1
        return code, out.decode(errors="replace"), err.decode(errors="replace").strip()

    def _failure(
        self, args: tuple[str, ...], code: int, out: str, err: str, what: str = ""
    ) -> BackendError:
        """A run that answered neither as it should nor "no CUDA here"."""
        ended = f"killed by signal {-code}" if code < 0 else f"exit {code}"
        said = f"printed {out.strip()!r}, {what}" if what else err or out.strip() or "no output"
        return BackendError(
            f"cuda-checkpoint {' '.join(args)} failed ({ended}): {said[:500]}; "
            f"run `{self.utility} {' '.join(args)}` as the agent's user to see why"
        )


def check_interface(utility: str) -> None:
    """Refuse a utility without the --action interface (the r550 `--toggle` one)."""
    import subprocess

    try:
        done = subprocess.run(
            [utility, "--help"], capture_output=True, text=True, timeout=HELP_SECONDS, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as error:
        raise BackendError(f"cuda-checkpoint --help could not run: {error}") from None
    text = done.stdout + done.stderr
    missing = [flag for flag in NEEDED_FLAGS if flag not in text]
    if missing:
        raise BackendError(
            f"the cuda-checkpoint utility at {utility} offers no {', '.join(missing)} "
            "(a --toggle-only r550 utility); install the one for driver "
            f"{CHECKPOINT_API_DRIVER} or later"
        )
