"""One TRL GRPO job on the CPU, through timeshare's TRL integration.

Alone (no TIMESHARE_* variables: the integration does nothing):

    python -m examples.trl_grpo.train --steps 8 --seed 0 --out alone.json

Taking turns in a group (a stack with `--backend freeze` running):

    python -m timeshare.integrations.coordinator --group trl --job job-a -- \\
        python -m examples.trl_grpo.train --steps 8 --seed 0 --out job-a.json
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

from pydantic import BaseModel

# Nothing comes from a hub: the model and tokenizer are made in code.
os.environ.setdefault("HF_HUB_OFFLINE", "1")


class TrainResult(BaseModel):
    seed: int
    steps: int
    reward_curve: list[float]
    fingerprint: str
    pid: int


# How long a job waits at the start for the others (--start-with).
START_SECONDS = 600.0


def start_together(ready_dir: Path | None, jobs: int) -> None:
    """Wait until ``jobs`` processes are ready in ``ready_dir``: the shared
    run's jobs then begin training together and really take turns, however
    long each one's imports took (one might otherwise finish alone)."""
    if ready_dir is None:
        return
    (ready_dir / f"{os.getpid()}.ready").touch()
    deadline = time.monotonic() + START_SECONDS
    while len(list(ready_dir.glob("*.ready"))) < jobs:
        if time.monotonic() > deadline:
            raise SystemExit(f"the other jobs were not ready within {START_SECONDS:g} s")
        time.sleep(0.1)


def train(
    steps: int,
    seed: int,
    output_dir: str,
    offload_hooks: bool = False,
    ready_dir: Path | None = None,
    jobs: int = 1,
) -> TrainResult:
    import torch
    from trl import GRPOConfig

    from examples.trl_grpo import task
    from timeshare.integrations.trl import GRPOTrainer

    start_together(ready_dir, jobs)

    # One thread: the same float sums in the same order, whatever else runs.
    torch.set_num_threads(1)
    config = GRPOConfig(
        output_dir=output_dir, max_steps=steps, per_device_train_batch_size=8, num_generations=4,
        max_completion_length=2, learning_rate=1e-2, logging_steps=1, report_to="none",
        save_strategy="no", use_cpu=True, seed=seed, bf16=False, dataloader_num_workers=0,
        disable_tqdm=True,
    )  # fmt: skip
    trainer = GRPOTrainer(
        model=task.tiny_model(seed),
        reward_funcs=task.sum_digit_reward,
        args=config,
        train_dataset=task.prompts(),
        processing_class=task.tokenizer(),
        offload_hooks=offload_hooks,
    )
    trainer.train()
    curve = [float(entry["reward"]) for entry in trainer.state.log_history if "reward" in entry]
    return TrainResult(
        seed=seed,
        steps=steps,
        reward_curve=curve,
        fingerprint=task.fingerprint(trainer.model),
        pid=os.getpid(),
    )


def main() -> None:
    parser = argparse.ArgumentParser(description="A TRL GRPO job on the CPU.")
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, help="write the result here (JSON)")
    parser.add_argument(
        "--offload-hooks", action="store_true", help="serve the trainer's offload hooks"
    )
    parser.add_argument(
        "--start-with", nargs=2, metavar=("DIR", "JOBS"),
        help="begin training once JOBS processes have said they are ready in DIR",
    )  # fmt: skip
    args = parser.parse_args()
    ready_dir, jobs = (
        (Path(args.start_with[0]), int(args.start_with[1])) if args.start_with else (None, 1)
    )
    with tempfile.TemporaryDirectory(prefix="trl-grpo-") as output_dir:
        result = train(args.steps, args.seed, output_dir, args.offload_hooks, ready_dir, jobs)
    if args.out is not None:
        args.out.write_text(result.model_dump_json())
    print(f"fingerprint={result.fingerprint}")


if __name__ == "__main__":
    main()
