"""Offline batch inference as a backfill job: it uses the GPUs while the
group's regular jobs (RL training) leave them idle, and gives them back at
the next batch boundary as soon as one of them asks.

With vLLM, on a node whose agent runs a backend that calls workload hooks
(`--backend app+cuda`, or `app`):

    python -m examples.backfill_batch_inference.run --group grpo-pair \\
        --job batch-infer --prompts prompts.txt --out completions.jsonl \\
        --model Qwen/Qwen2.5-0.5B-Instruct

Without vLLM, `--engine stand-in` runs the same loop, turns and hooks with
an engine that only pretends to generate (sim or freeze stacks, CI).

Each batch is written as soon as it is done, so a job that is stopped goes
on where it left off (`--out` is read back at start).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from pydantic import BaseModel

import timeshare
from examples.backfill_batch_inference.engine import (
    Engine,
    StandInEngine,
    completion_texts,
    sampling,
    vllm_engine,
)
from timeshare.hooks import serve_hooks
from timeshare.hooks.vllm import VllmHooks
from timeshare.models import GroupPolicy


class InferenceResult(BaseModel):
    """What the job did: batches done, turns taken, and how often the agent
    put its engine to sleep (stand-in engine only; -1 with vLLM)."""

    batches: int
    turns: int
    yielded_early: int
    sleeps: int


def batches_of(prompts: list[str], size: int, done: int) -> Iterator[list[str]]:
    for start in range(done * size, len(prompts), size):
        yield prompts[start : start + size]


def batches_done(out: Path) -> int:
    return len(out.read_text().splitlines()) if out.exists() else 0


def run(
    job: timeshare.Job,
    engine: Engine,
    prompts: list[str],
    out: Path,
    batch_size: int,
    params: Any = None,
) -> InferenceResult:
    """Take a turn, generate batch after batch until the prompts run out or
    a regular job asks for the GPUs (``should_yield``), give the turn back,
    and ask again."""
    pending = batches_of(prompts, batch_size, batches_done(out))
    batch = next(pending, None)
    batches = turns = yielded_early = 0
    while batch is not None:
        with job.turn(phase="infer") as turn:
            turns += 1
            while batch is not None:
                texts = completion_texts(engine.generate(batch, params))
                with out.open("a") as written:
                    written.write(json.dumps(dict(zip(batch, texts, strict=True))) + "\n")
                batches += 1
                batch = next(pending, None)
                if batch is not None and turn.should_yield:
                    yielded_early += 1
                    break  # a regular job asked: the GPUs are its at this boundary
    sleeps = engine.sleeps if isinstance(engine, StandInEngine) else -1
    return InferenceResult(batches=batches, turns=turns, yielded_early=yielded_early, sleeps=sleeps)


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--group", required=True)
    parser.add_argument("--job", default="batch-infer")
    parser.add_argument("--address", help="the gateway (default: TIMESHARE_ADDRESS)")
    parser.add_argument("--nodes", help="comma-separated node names (default: the only node)")
    parser.add_argument("--prompts", type=Path, help="one prompt a line")
    parser.add_argument("--count", type=int, default=64, help="made-up prompts, without --prompts")
    parser.add_argument("--out", type=Path, required=True, help="completions, one batch a line")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--engine", choices=["vllm", "stand-in"], default="vllm")
    parser.add_argument("--model", default="Qwen/Qwen2.5-0.5B-Instruct")
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--gpu-memory-utilization", type=float, default=0.4)
    parser.add_argument(
        "--seconds-per-prompt", type=float, default=0.01, help="the stand-in's generation time"
    )
    parser.add_argument(
        "--grace-seconds", type=float, default=10.0,
        help="the group's backfill_grace_seconds, if this job creates the group",
    )  # fmt: skip
    parser.add_argument("--co-residency", choices=["auto", "off"], default="auto")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse(argv)
    if args.prompts:
        prompts = [line for line in args.prompts.read_text().splitlines() if line.strip()]
    else:
        prompts = [f"prompt {n}: what is {n} squared?" for n in range(args.count)]
    if args.engine == "vllm":
        engine = vllm_engine(args.model, args.gpu_memory_utilization)
        params = sampling(args.max_tokens)
    else:
        engine, params = StandInEngine(args.seconds_per_prompt), None
    policy = GroupPolicy(backfill_grace_seconds=args.grace_seconds, co_residency=args.co_residency)
    nodes = args.nodes.split(",") if args.nodes else None
    with timeshare.connect(args.address) as client:
        job = client.join(args.group, args.job, nodes=nodes, policy=policy, backfill=True)
        # The agent puts the engine to sleep (weights to host memory) before a
        # regular job's turn, and wakes it when the GPUs are free again.
        hooks = serve_hooks(VllmHooks(engine), args.group, args.job, mode="offload")
        try:
            result = run(job, engine, prompts, args.out, args.batch_size, params)
        finally:
            hooks.close()
            job.leave()
    print(result.model_dump_json(), file=sys.stdout)


if __name__ == "__main__":
    main()
