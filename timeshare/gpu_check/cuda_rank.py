"""One CUDA rank of a GPU-check job: it holds known data in device memory
through cuda-bindings (on a GPU, or on the GPU emulator), has a child process
that never touches CUDA (a DataLoader worker), registers with the node agent
(with --group and --job), and answers commands on stdin: "checksum" (a CRC32
of the data read back from the device), "quit". For timeshare.gpu_check.switch and
timeshare.gpu_check.probe.

The data is filled on the device, not copied from Python: each 16 MiB chunk
holds one seeded 32-bit word (cuMemsetD32), so 4 GiB per job is written in
well under a second. The expected CRC32 is computed once from the pattern; a
check reads the device back in 256 MiB copies and compares. A chunk lost,
zeroed or swapped with another changes the CRC.

    python -m timeshare.gpu_check.cuda_rank --bytes N --seed S [--group G --job J]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import zlib
from typing import Any

from timeshare.registration import register_process

# One pattern word per chunk; the read-back copies are larger (fewer calls).
CHUNK = 16 * 2**20
READ_CHUNK = 256 * 2**20
LOADER = "import time\nwhile True:\n    sum(range(10000))\n    time.sleep(0.01)\n"


def check(result: Any, what: str) -> None:
    from cuda.bindings import driver

    if result != driver.CUresult.CUDA_SUCCESS:
        raise SystemExit(f"cuda_rank: {what} failed: {getattr(result, 'name', result)}")


def word(seed: int, index: int) -> int:
    """The 32-bit word chunk ``index`` holds; never 0, which a lost page reads."""
    return zlib.crc32(f"{seed}/{index}".encode()) or 1


def chunk_bytes(seed: int, index: int, size: int) -> bytes:
    whole, tail = divmod(size, 4)
    pattern = word(seed, index).to_bytes(4, "little")
    return pattern * whole + pattern[:tail]


def expected_checksum(count: int, seed: int) -> int:
    """The CRC32 of the data fill() writes, computed from the pattern alone."""
    crc = 0
    for index, offset in enumerate(range(0, count, CHUNK)):
        crc = zlib.crc32(chunk_bytes(seed, index, min(CHUNK, count - offset)), crc)
    return crc


def fill(pointer: int, count: int, seed: int) -> None:
    """Write the pattern on the device: one cuMemsetD32 per chunk (the last
    chunk's odd bytes, at most 3, copied from the host)."""
    from cuda.bindings import driver

    for index, offset in enumerate(range(0, count, CHUNK)):
        size = min(CHUNK, count - offset)
        words, tail = divmod(size, 4)
        if words:
            (result,) = driver.cuMemsetD32(pointer + offset, word(seed, index), words)
            check(result, "cuMemsetD32")
        if tail:
            rest = chunk_bytes(seed, index, size)[words * 4 :]
            (result,) = driver.cuMemcpyHtoD(pointer + offset + words * 4, rest, tail)
            check(result, "cuMemcpyHtoD")
    (result,) = driver.cuCtxSynchronize()
    check(result, "cuCtxSynchronize")


def read_back(pointer: int, count: int, buffer: bytearray) -> int:
    """The CRC32 of the device's data, read in READ_CHUNK copies into ``buffer``."""
    from cuda.bindings import driver

    crc = 0
    for offset in range(0, count, READ_CHUNK):
        size = min(READ_CHUNK, count - offset)
        view = memoryview(buffer)[:size]
        (result,) = driver.cuMemcpyDtoH(view, pointer + offset, size)
        check(result, "cuMemcpyDtoH")
        crc = zlib.crc32(view, crc)
    return crc


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--group", help="register with the node agent in this group")
    parser.add_argument("--job")
    parser.add_argument("--bytes", type=int, required=True)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", type=int, default=0)
    args = parser.parse_args()
    if (args.group is None) != (args.job is None):
        parser.error("--group and --job go together")
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
    started = time.perf_counter()
    fill(int(pointer), args.bytes, args.seed)
    filled = time.perf_counter() - started
    expected = expected_checksum(args.bytes, args.seed)
    buffer = bytearray(min(READ_CHUNK, args.bytes))
    loader = subprocess.Popen(
        [sys.executable, "-c", LOADER],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    if args.group is not None:
        register_process(args.group, args.job)
    hello = {"pid": os.getpid(), "checksum": expected, "loader": loader.pid,
             "fill_seconds": round(filled, 4)}  # fmt: skip
    print(json.dumps(hello), flush=True)
    try:
        for line in sys.stdin:
            if line.strip() != "checksum":
                break
            print(json.dumps({"checksum": read_back(int(pointer), args.bytes, buffer)}), flush=True)
    finally:
        loader.kill()


if __name__ == "__main__":
    main()
