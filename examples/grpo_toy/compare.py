"""Does time-slicing change training results? Run the toy GRPO job alone,
then time-sliced against a second job in one group (a running stack with the
freeze backend actually stopping each job's worker between its turns), and
compare the reward curves and the final parameters bit for bit.

    timeshare up --backend freeze &
    python -m examples.grpo_toy.compare --steps 30
"""

from __future__ import annotations

import argparse
import concurrent.futures

from examples.grpo_toy.run import ToyResult, run_toy

GROUP = "grpo-toy"


def compare(steps: int, address: str | None = None) -> tuple[ToyResult, ToyResult, ToyResult]:
    """(alone, the same job shared, the job it shared with)."""
    alone = run_toy(steps, seed=0, job_name="job-a")
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        shared = pool.submit(run_toy, steps, 0, "job-a", GROUP, address)
        other = pool.submit(run_toy, steps, 1, "job-b", GROUP, address)
        return alone, shared.result(), other.result()


def main() -> None:
    parser = argparse.ArgumentParser(description="Alone vs time-sliced: same results?")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--address", help="timeshare gateway (env TIMESHARE_ADDRESS)")
    args = parser.parse_args()
    alone, shared, other = compare(args.steps, args.address)
    print("step  reward alone  reward shared  (other job)")
    for step, (a, s, o) in enumerate(
        zip(alone.reward_curve, shared.reward_curve, other.reward_curve, strict=True)
    ):
        print(f"{step:4d}  {a:12.4f}  {s:13.4f}  ({o:.4f})")
    same = alone.fingerprint == shared.fingerprint and alone.reward_curve == shared.reward_curve
    print(f"final parameters alone  {alone.fingerprint}")
    print(f"final parameters shared {shared.fingerprint}")
    print("identical" if same else "DIFFERENT")


if __name__ == "__main__":
    main()
