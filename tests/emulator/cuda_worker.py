"""A CUDA process for the emulator's tests, driven through the real cuda-bindings.

    python -m tests.emulator.cuda_worker BYTES COUNTER_FILE [--device N]

It initialises CUDA, retains the device's primary context, allocates BYTES of device
memory, prints ``ready <pid>`` and then loops: one small CUDA call (a one-byte
cuMemsetD8 and a read-back through cuMemcpyDtoH), then the iteration count written to
COUNTER_FILE. While the process is locked or checkpointed its CUDA calls block, so the
count stops; a failed call writes ``error <CUresult name>`` there and exits 2. A read
back that differs from what was written writes ``corrupt`` and exits 3.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any


def check(result: Any, counter: Path) -> None:
    from cuda.bindings import driver

    if result != driver.CUresult.CUDA_SUCCESS:
        write(counter, f"error {getattr(result, 'name', result)}")
        sys.exit(2)


def write(counter: Path, text: str) -> None:
    partial = counter.with_name(counter.name + ".partial")
    partial.write_text(text)
    os.replace(partial, counter)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="cuda_worker")
    parser.add_argument("bytes", type=int)
    parser.add_argument("counter", type=Path)
    parser.add_argument("--device", type=int, default=0)
    parser.add_argument("--interval", type=float, default=0.005)
    args = parser.parse_args(argv)

    from cuda.bindings import driver

    (result,) = driver.cuInit(0)
    check(result, args.counter)
    result, device = driver.cuDeviceGet(args.device)
    check(result, args.counter)
    result, context = driver.cuDevicePrimaryCtxRetain(device)
    check(result, args.counter)
    (result,) = driver.cuCtxSetCurrent(context)
    check(result, args.counter)
    result, pointer = driver.cuMemAlloc(args.bytes)
    check(result, args.counter)
    write(args.counter, "0")
    print(f"ready {os.getpid()}", flush=True)

    count = 0
    readback = bytearray(1)
    while True:
        count += 1
        value = count % 251
        (result,) = driver.cuMemsetD8(pointer, value, 1)
        check(result, args.counter)
        (result,) = driver.cuMemcpyDtoH(readback, pointer, 1)
        check(result, args.counter)
        if readback[0] != value:
            write(args.counter, "corrupt")
            sys.exit(3)
        write(args.counter, str(count))
        time.sleep(args.interval)


if __name__ == "__main__":
    main()
