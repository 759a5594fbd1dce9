"""A job process that serves workload hooks to the agent socket given, for
tests: the vLLM server hooks against an engine URL. It registers itself with
the agent, so tests start it detached (the agent refuses its own children).

    python -m tests.hook_process SOCKET GROUP JOB MODE ENGINE_URL [cuda]

With ``cuda`` it first becomes a CUDA process (through the real cuda-bindings, on
the GPU emulator when its environment is set): an engine's GPU worker."""

from __future__ import annotations

import logging
import sys
import time

from timeshare.hooks import serve_hooks
from timeshare.hooks.protocol import EvictMode
from timeshare.hooks.vllm import VllmServerHooks

MODES: dict[str, EvictMode] = {"offload": "offload", "discard": "discard"}


def start_cuda() -> None:
    from cuda.bindings import driver

    (result,) = driver.cuInit(0)
    assert result == driver.CUresult.CUDA_SUCCESS, result
    _, device = driver.cuDeviceGet(0)
    _, context = driver.cuDevicePrimaryCtxRetain(device)
    driver.cuCtxSetCurrent(context)
    result, _ = driver.cuMemAlloc(1 << 20)
    assert result == driver.CUresult.CUDA_SUCCESS, result


def main() -> None:
    socket_path, group, job, mode, engine = sys.argv[1:6]
    logging.basicConfig(level=logging.INFO)
    if sys.argv[6:7] == ["cuda"]:
        start_cuda()
    serve_hooks(VllmServerHooks(engine), group, job, socket_path, mode=MODES[mode])
    time.sleep(120)


if __name__ == "__main__":
    main()
