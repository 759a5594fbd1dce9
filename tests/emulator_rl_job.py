"""An RL job shaped like a real one, for the end-to-end test on the GPU emulator:
a coordinator (this process, which takes turns and never touches CUDA) and two
CUDA ranks it starts, the first with a child that never touches CUDA (a
DataLoader worker). Each rank registers with the node agent itself.

    python -m tests.emulator_rl_job ADDRESS GROUP JOB NODE SOCKET WORKDIR TURNS

The ranks run on whatever driver their environment names (the emulator's, in
tests). During each turn the coordinator waits until every rank has made CUDA
progress. It writes WORKDIR/JOB.json: the ranks' and children's pids and each
turn's epoch and CLOCK_MONOTONIC interval (the emulator's call log uses the same
clock)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import time
from pathlib import Path

import timeshare
from timeshare.credentials import JOB_TOKEN_ENV
from timeshare.gpu_check.emulator.rig import CudaWorker, start_worker

WORK_SECONDS = 30.0


def progressed(rank: CudaWorker, since: int) -> bool:
    try:
        return rank.count() >= since + 2
    except (OSError, AssertionError):
        return False


def main() -> None:
    address, group, job, node, socket_path, workdir, turns = sys.argv[1:8]
    directory = Path(workdir)
    env = {k: v for k, v in os.environ.items() if k.startswith(("TIMESHARE_EMULATOR", "LD_"))}
    client = timeshare.connect(address)
    # Joined first: the ranks register with the token the Join returned.
    handle = client.join(group, job, nodes=[node])
    env[JOB_TOKEN_ENV] = handle.token
    ranks = [
        start_worker(env, directory, f"{job}-rank{index}", children=1 if index == 0 else 0,
                     register=(socket_path, group, job))
        for index in range(2)
    ]  # fmt: skip
    report: dict[str, object] = {
        "ranks": [rank.pid for rank in ranks],
        "children": [child for rank in ranks for child in rank.children],
        "turns": [],
    }
    done: list[dict[str, float | int]] = []
    try:
        with client:
            (directory / f"{job}.joined").write_text("")
            for _ in range(int(turns)):
                turn = handle.acquire()
                granted = time.monotonic()
                start = [rank.count() for rank in ranks]
                deadline = granted + WORK_SECONDS
                while not all(progressed(r, s) for r, s in zip(ranks, start, strict=True)):
                    if time.monotonic() > deadline:
                        raise SystemExit(f"{job}: its ranks made no CUDA progress in its turn")
                    time.sleep(0.01)
                yielded = time.monotonic()
                handle.yield_()
                done.append({"epoch": turn.epoch, "granted": granted, "yielded": yielded})
                time.sleep(0.05)  # the reward phase, on the CPU
            handle.leave()
    finally:
        report["turns"] = done
        (directory / f"{job}.json").write_text(json.dumps(report))
        for rank in ranks:
            for pid in [*rank.children, rank.pid]:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)


if __name__ == "__main__":
    main()
