"""Run the toy GRPO job, alone or time-sliced through timeshare.

The coordinator (this process) takes turns and computes rewards on the CPU;
its worker process holds the policy and does the "GPU" phases. Alone:

    python -m examples.grpo_toy.run --steps 20

Sharing a group (a stack with `--backend freeze` must be running):

    python -m examples.grpo_toy.run --steps 20 --group toy --job job-a --address HOST:PORT

`python -m examples.grpo_toy.compare` runs it alone and then shared against a
second job, and prints both reward curves.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from pydantic import BaseModel

import timeshare
from examples.grpo_toy.policy import rewards
from timeshare.credentials import JOB_TOKEN_ENV


class ToyResult(BaseModel):
    job: str
    steps: int
    reward_curve: list[float]
    fingerprint: str
    worker_pid: int


class Worker:
    def __init__(self, seed: int, group: str, job: str, token: str = "") -> None:
        # The job's token, which the worker presents when it registers.
        env = {**os.environ, JOB_TOKEN_ENV: token} if token else None
        self.process = subprocess.Popen(
            [sys.executable, "-m", "examples.grpo_toy.worker", str(seed), group, job],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )
        # Read on the first command, inside a turn: a worker that registers
        # while another job holds the GPUs is frozen at once, and answers only
        # when its own job's turn comes.
        self.pid = 0

    def read(self) -> dict[str, Any]:
        assert self.process.stdout is not None
        line = self.process.stdout.readline()
        if not line:
            raise RuntimeError("the toy worker exited")
        reply: dict[str, Any] = json.loads(line)
        return reply

    def ask(self, **command: Any) -> dict[str, Any]:
        if not self.pid:
            self.pid = int(self.read()["registered"]) or self.process.pid
        assert self.process.stdin is not None
        self.process.stdin.write(json.dumps(command) + "\n")
        self.process.stdin.flush()
        return self.read()

    def close(self) -> None:
        if self.process.stdin is not None:
            self.process.stdin.close()
        self.process.wait(30)

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(30)


def run_toy(
    steps: int, seed: int, job_name: str, group: str = "", address: str | None = None
) -> ToyResult:
    client = timeshare.connect(address) if group else None
    # Joined before the worker starts: it registers with the job's token.
    job = client.join(group, job_name) if client is not None else None
    worker = Worker(seed, group, job_name, job.token if job is not None else "")

    @contextlib.contextmanager
    def gpu_phase() -> Iterator[None]:
        if job is None:
            yield
        else:
            with job.turn():
                yield

    curve = []
    try:
        for step in range(steps):
            with gpu_phase():
                rollout = worker.ask(op="sample", step=step)
            scores = rewards(rollout["prompts"], rollout["answers"])
            curve.append(sum(map(sum, scores)) / sum(map(len, scores)))
            with gpu_phase():
                worker.ask(op="train", step=step, rewards=scores, **rollout)
        with gpu_phase():
            fingerprint = worker.ask(op="fingerprint")["fingerprint"]
            # Stop the GPU worker while the job still holds the turn: once
            # another job holds it, the worker is frozen and cannot exit.
            worker.close()
    finally:
        worker.kill()  # only if it is still there (an error above); works frozen too
        if job is not None:
            job.leave()
        if client is not None:
            client.close()
    return ToyResult(
        job=job_name,
        steps=steps,
        reward_curve=curve,
        fingerprint=fingerprint,
        worker_pid=worker.pid,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description="A toy GRPO job.")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--job", default="toy")
    parser.add_argument("--group", default="", help="take turns in this group (else alone)")
    parser.add_argument("--address", help="timeshare gateway (env TIMESHARE_ADDRESS)")
    parser.add_argument("--out", type=Path, help="write the result here (JSON)")
    args = parser.parse_args()
    result = run_toy(args.steps, args.seed, args.job, args.group, args.address)
    if args.out is not None:
        args.out.write_text(result.model_dump_json())
    print(" ".join(f"{r:.2f}" for r in result.reward_curve))
    print(f"fingerprint={result.fingerprint}")


if __name__ == "__main__":
    main()
