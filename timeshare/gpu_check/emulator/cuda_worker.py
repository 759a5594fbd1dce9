"""A CUDA process for the emulator's tests, driven through the real cuda-bindings.

    python -m timeshare.gpu_check.emulator.cuda_worker BYTES COUNTER_FILE
        [--device N] [--children N] [--ready FILE] [--register SOCKET GROUP JOB]

It initialises CUDA, retains the device's primary context, allocates BYTES of device
memory, prints ``ready <pid>`` and then loops: one small CUDA call (a one-byte
cuMemsetD8 and a read-back through cuMemcpyDtoH), then the iteration count written to
COUNTER_FILE. While the process is locked or checkpointed its CUDA calls block, so the
count stops; a failed call writes ``error <CUresult name>`` there and exits 2. A read
back that differs from what was written writes ``corrupt`` and exits 3.

``--children N`` starts N child processes that never touch CUDA, as a DataLoader's
workers: each counts into COUNTER_FILE.child<i>. ``--ready FILE`` writes
``{"pid": ..., "children": [...]}`` there once all is up (for a worker started
detached, whose output nobody reads). ``--register`` registers the worker with a node
agent after CUDA is up, as a GPU worker of job JOB of group GROUP.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
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


CHILD = """
import os, sys, time
path, count = sys.argv[1], 0
while True:
    count += 1
    with open(path + ".partial", "w") as f:
        f.write(str(count))
    os.replace(path + ".partial", path)
    time.sleep(0.01)
"""


def start_children(count: int, counter: Path) -> list[int]:
    """Processes without CUDA, as a DataLoader's workers (spawned, not forked:
    a fork of a CUDA process would share its pages but not its CUDA state)."""
    children = []
    for index in range(count):
        child = subprocess.Popen(
            [sys.executable, "-c", CHILD, f"{counter}.child{index}"], stdin=subprocess.DEVNULL
        )
        children.append(child.pid)
    return children


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="cuda_worker")
    parser.add_argument("bytes", type=int)
    parser.add_argument("counter", type=Path)
    parser.add_argument("--device", type=int, default=0)
    parser.add_argument("--interval", type=float, default=0.005)
    parser.add_argument("--children", type=int, default=0)
    parser.add_argument("--ready", type=Path)
    parser.add_argument("--register", nargs=3, metavar=("SOCKET", "GROUP", "JOB"))
    parser.add_argument("--wait-for", type=Path, help="start CUDA only once this file exists")
    args = parser.parse_args(argv)

    if args.wait_for:
        if args.ready:
            write(args.ready, json.dumps({"pid": os.getpid(), "children": [], "cuda": False}))
        while not args.wait_for.exists():
            time.sleep(0.01)

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
    children = start_children(args.children, args.counter)
    if args.register:
        from timeshare.registration import register_process

        socket_path, group, job = args.register
        register_process(group, job, socket_path)
    if args.ready:
        write(args.ready, json.dumps({"pid": os.getpid(), "children": children}))
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
