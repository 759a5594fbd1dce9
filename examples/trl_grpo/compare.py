"""Does taking turns change what TRL trains? Two TRL GRPO jobs share one
group on a stack whose agent runs the freeze backend (each job's trainer
process is really stopped while the other holds the turn); a third run of
the first job's seed trains alone. Its final weights must be bit-identical to
the shared run's, and the agent's freeze record must show that no job ran
while the other held its turn.

    python -m examples.trl_grpo.compare --steps 4

starts its own stack (Temporal dev server, scheduler, gateway, agent) in a
temporary folder, and prints, last, ``identical=1 steps=N`` (or 0).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from examples.trl_grpo.train import TrainResult
from timeshare.integrations.turns import ENV_GROUP, ENV_JOB, ENV_TURNS_FD, TurnRecord
from timeshare.testing import LocalStack

GROUP = "trl-grpo"
JOBS = {"job-a": 0, "job-b": 1}  # job -> seed; job-a's seed also trains alone
CHILD_SECONDS = 300


class JobRun(BaseModel):
    result: TrainResult
    turns: list[TurnRecord]


class Comparison(BaseModel):
    alone: TrainResult
    shared: dict[str, JobRun]
    # The agent's freeze/thaw events (activities/backends/freeze.py's record).
    record: list[dict[str, Any]]

    @property
    def identical(self) -> bool:
        shared = self.shared["job-a"].result
        return (
            shared.fingerprint == self.alone.fingerprint
            and shared.reward_curve == self.alone.reward_curve
        )


def train_command(
    steps: int, seed: int, out: Path, offload_hooks: bool, start_with: list[str] | None = None
) -> list[str]:
    return [
        sys.executable, "-m", "examples.trl_grpo.train", f"--steps={steps}", f"--seed={seed}",
        f"--out={out}", *(["--offload-hooks"] if offload_hooks else []),
        *(["--start-with", *start_with] if start_with else []),
    ]  # fmt: skip


def coordinated(command: list[str], job: str, address: str, turns_out: Path) -> list[str]:
    return [
        sys.executable, "-m", "timeshare.integrations.coordinator", f"--group={GROUP}",
        f"--job={job}", f"--address={address}", f"--turns-out={turns_out}", "--", *command,
    ]  # fmt: skip


def start(command: Sequence[str], log: Path, env: dict[str, str]) -> subprocess.Popen[bytes]:
    with log.open("ab") as output:
        return subprocess.Popen(
            list(command),
            stdin=subprocess.DEVNULL,
            stdout=output,
            stderr=subprocess.STDOUT,
            env=env,
        )


def finish(name: str, process: subprocess.Popen[bytes], log: Path) -> None:
    if process.wait(CHILD_SECONDS) != 0:
        tail = log.read_text(errors="replace").strip().splitlines()[-15:]
        raise RuntimeError(f"{name} exited {process.returncode}:\n" + "\n".join(tail))


def compare(steps: int, workdir: Path, backend: str = "freeze") -> Comparison:
    """Train job-a alone and both jobs sharing a group on a fresh stack under ``workdir``."""
    stack = LocalStack(workdir, node="trl-node", backend=backend)
    env = {key: value for key, value in os.environ.items()
           if key not in (ENV_GROUP, ENV_JOB, ENV_TURNS_FD)}  # fmt: skip
    env["HF_HUB_OFFLINE"] = "1"
    offload_hooks = backend.startswith("app+")
    # The alone run needs no stack and its result no timing: it starts first.
    alone_out = workdir / "alone.json"
    workdir.mkdir(parents=True, exist_ok=True)
    processes = {
        "alone": start(train_command(steps, 0, alone_out, False), workdir / "alone.log", env)
    }
    try:
        stack.start_all()
        shared_env = {**env, "TIMESHARE_AGENT_SOCKET": str(stack.socket_path)}
        # The shared jobs begin training together, so that their turns interleave.
        ready = workdir / "ready"
        ready.mkdir(exist_ok=True)
        start_with = [str(ready), str(len(JOBS))]
        for job, seed in JOBS.items():
            out = workdir / f"{job}.json"
            command = train_command(steps, seed, out, offload_hooks, start_with)
            wrapped = coordinated(command, job, stack.address, workdir / f"{job}-turns.json")
            processes[job] = start(wrapped, workdir / f"{job}.log", shared_env)
        for name, process in processes.items():
            finish(name, process, workdir / f"{name}.log")
    finally:
        for process in processes.values():
            if process.poll() is None:
                process.kill()
                process.wait()
        stack.stop_all()
    shared = {
        job: JobRun(
            result=TrainResult.model_validate_json((workdir / f"{job}.json").read_text()),
            turns=[TurnRecord(**t) for t in _turns(workdir / f"{job}-turns.json")],
        )
        for job in JOBS
    }
    return Comparison(
        alone=TrainResult.model_validate_json(alone_out.read_text()),
        shared=shared,
        record=stack.process_record(),
    )


def _turns(path: Path) -> list[dict[str, Any]]:
    import json

    turns: list[dict[str, Any]] = json.loads(path.read_text())["turns"]
    return turns


def main() -> None:
    parser = argparse.ArgumentParser(description="TRL GRPO alone vs taking turns: same weights?")
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument(
        "--backend", default="freeze", help="the agent's backend: freeze, or app+freeze (hooks)"
    )
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="trl-grpo-compare-") as workdir:
        result = compare(args.steps, Path(workdir), args.backend)
    print("step  reward alone  reward shared  (other job)")
    curves = zip(
        result.alone.reward_curve,
        result.shared["job-a"].result.reward_curve,
        result.shared["job-b"].result.reward_curve,
        strict=True,
    )
    for step, (alone, shared, other) in enumerate(curves):
        print(f"{step:4d}  {alone:12.4f}  {shared:13.4f}  ({other:.4f})")
    for job, run in result.shared.items():
        frozen = sum(1 for e in result.record if e["event"] == "freeze" and e["job"] == job)
        print(f"{job}: {len(run.turns)} turns, stopped {frozen} times")
    print(f"final weights alone  {result.alone.fingerprint}")
    print(f"final weights shared {result.shared['job-a'].result.fingerprint}")
    print(f"identical={int(result.identical)} steps={args.steps}")


if __name__ == "__main__":
    main()
