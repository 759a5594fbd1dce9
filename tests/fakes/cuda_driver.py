"""A fake `cuda.bindings.driver` for tests: the driver's per-process
checkpoint state machine, with a call log, locks that time out for chosen
pids (CUDA_ERROR_NOT_READY), and a switch that makes every call hang."""

from __future__ import annotations

import enum
import threading
import time
from types import ModuleType, SimpleNamespace
from typing import Any

MOVES = {
    "Lock": (0, 1),
    "Checkpoint": (1, 2),
    "Restore": (2, 1),
    "Unlock": (1, 0),
}


class CUresult(enum.IntEnum):
    CUDA_SUCCESS = 0
    CUDA_ERROR_ILLEGAL_STATE = 401
    CUDA_ERROR_NOT_READY = 600


class FakeDriver:
    def __init__(self) -> None:
        self.states: dict[int, int] = {}
        self.calls: list[str] = []
        # When each call was made (time.time()), for ordering against other records.
        self.stamps: list[float] = []
        self.lock_timeout_pids: set[int] = set()
        self.hanging = threading.Event()
        self.release = threading.Event()
        self.module = ModuleType("cuda.bindings.driver")
        self.module.CUresult = CUresult  # type: ignore[attr-defined]
        self.module.cuInit = lambda flags: (CUresult.CUDA_SUCCESS,)  # type: ignore[attr-defined]
        self.module.cuCheckpointProcessGetState = self.get_state  # type: ignore[attr-defined]
        for action in MOVES:
            setattr(self.module, f"cuCheckpointProcess{action}", self._mover(action))
            setattr(self.module, f"CUcheckpoint{action}Args", SimpleNamespace)

    def _wait_if_hanging(self) -> None:
        if self.hanging.is_set():
            self.release.wait(30)

    def get_state(self, pid: int) -> tuple[CUresult, int]:
        self._wait_if_hanging()
        return CUresult.CUDA_SUCCESS, self.states.get(pid, 0)

    def _mover(self, action: str) -> Any:
        def move(pid: int, arguments: Any) -> tuple[CUresult]:
            self._wait_if_hanging()
            self.calls.append(f"{action.lower()} {pid}")
            self.stamps.append(time.time())
            if action == "Lock":
                assert arguments.timeoutMs > 0
                if pid in self.lock_timeout_pids:
                    return (CUresult.CUDA_ERROR_NOT_READY,)
            before, after = MOVES[action]
            if self.states.get(pid, 0) != before:
                return (CUresult.CUDA_ERROR_ILLEGAL_STATE,)
            self.states[pid] = after
            return (CUresult.CUDA_SUCCESS,)

        return move
