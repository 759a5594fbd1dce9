"""One CUDA rank of a GPU-check job: it holds known data in device memory
through cuda-bindings (on a GPU, or on the GPU emulator), has a child process
that never touches CUDA (a DataLoader worker), registers with the node agent,
and answers commands on stdin: "checksum" (a CRC32 of the data read back from
the device), "quit". For bench.gpu_switch.

    python -m bench.cuda_rank --group G --job J --bytes N --seed S
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import zlib
from typing import Any

from timeshare.registration import register_process

CHUNK = 64 * 2**20
LOADER = "import time\nwhile True:\n    sum(range(10000))\n    time.sleep(0.01)\n"


def check(result: Any, what: str) -> None:
    from cuda.bindings import driver

    if result != driver.CUresult.CUDA_SUCCESS:
        raise SystemExit(f"cuda_rank: {what} failed: {getattr(result, 'name', result)}")


def fill(pointer: int, count: int, seed: int) -> int:
    """Write seeded random bytes to the device; their CRC32."""
    from cuda.bindings import driver

    generator, crc = random.Random(seed), 0
    for offset in range(0, count, CHUNK):
        size = min(CHUNK, count - offset)
        chunk = generator.randbytes(size)
        (result,) = driver.cuMemcpyHtoD(pointer + offset, chunk, size)
        check(result, "cuMemcpyHtoD")
        crc = zlib.crc32(chunk, crc)
    return crc


def read_back(pointer: int, count: int) -> int:
    from cuda.bindings import driver

    buffer, crc = bytearray(min(CHUNK, count)), 0
    for offset in range(0, count, CHUNK):
        size = min(CHUNK, count - offset)
        view = memoryview(buffer)[:size]
        (result,) = driver.cuMemcpyDtoH(view, pointer + offset, size)
        check(result, "cuMemcpyDtoH")
        crc = zlib.crc32(view, crc)
    return crc


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--group", required=True)
    parser.add_argument("--job", required=True)
    parser.add_argument("--bytes", type=int, required=True)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", type=int, default=0)
    args = parser.parse_args()
    from cuda.bindings import driver

    (result,) = driver.cuInit(0)
    check(result, "cuInit")
    result, device = driver.cuDeviceGet(args.device)
    check(result, "cuDeviceGet")
    result, context = driver.cuDevicePrimaryCtxRetain(device)
    check(result, "cuDevicePrimaryCtxRetain")
    (result,) = driver.cuCtxSetCurrent(context)
    check(result, "cuCtxSetCurrent")
    result, pointer = driver.cuMemAlloc(args.bytes)
    check(result, "cuMemAlloc")
    expected = fill(int(pointer), args.bytes, args.seed)
    loader = subprocess.Popen(
        [sys.executable, "-c", LOADER],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    register_process(args.group, args.job)
    print(json.dumps({"pid": os.getpid(), "checksum": expected, "loader": loader.pid}), flush=True)
    try:
        for line in sys.stdin:
            if line.strip() != "checksum":
                break
            print(json.dumps({"checksum": read_back(int(pointer), args.bytes)}), flush=True)
    finally:
        loader.kill()


if __name__ == "__main__":
    main()
