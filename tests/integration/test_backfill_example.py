"""The batch-inference example as a backfill job beside two regular (RL)
jobs, through a real stack (`timeshare up`, backend app+sim, its vLLM hooks
served to the agent; the stand-in engine in place of vLLM): it processes
every batch in the gaps the regular jobs leave, the agent puts its engine to
sleep through its hooks before a regular job's turn, and it always gives the
GPU back by itself at a batch boundary, so no regular job waits behind it
for longer than the group's grace."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from examples.backfill_batch_inference.run import InferenceResult
from tests.conftest import REPO, start_until_ready
from tests.polling import wait_until
from timeshare import connect, timeline
from timeshare.models import GroupPolicy
from timeshare.testing import free_port, timeshare_command

GROUP = "rl-pair"
BACKFILL = "batch-infer"
GRACE = 2.0
PROMPTS, BATCH = 160, 4
ITERATIONS = 8


def train(address: str, job: str, joined: threading.Barrier) -> None:
    """A regular RL job: GPU phases with CPU work between them."""
    with connect(address) as client:
        policy = GroupPolicy(backfill_grace_seconds=GRACE, co_residency="off")
        member = client.join(GROUP, job, policy=policy)
        joined.wait()
        joined.wait()  # the backfill job has started inferring
        for _ in range(ITERATIONS):
            with member.turn(phase="train"):
                time.sleep(0.3)
            time.sleep(0.4)  # rewards on the CPU: the GPU's gap
        joined.wait()  # stay in the group until the status is read
        member.leave()


def test_the_batch_inference_example_fills_the_gaps_and_yields_in_time(tmp_path: Path) -> None:
    ports: list[int] = []

    def up_command() -> list[str]:
        ports[:] = [free_port(), free_port(), free_port()]
        return timeshare_command(
            "up", f"--port={ports[0]}", f"--ui-port={ports[1]}", f"--listen=127.0.0.1:{ports[2]}",
            f"--data-dir={tmp_path / 'data'}", "--node=infer-node", "--backend=app+sim",
            f"--socket={tmp_path / 'agent.sock'}",
        )  # fmt: skip

    up = start_until_ready(up_command, "timeshare up: ready")
    address = f"127.0.0.1:{ports[2]}"
    out = tmp_path / "completions.jsonl"
    joined = threading.Barrier(3)
    example: subprocess.Popen[str] | None = None
    trainers = [
        threading.Thread(target=train, args=(address, job, joined)) for job in ("rl-a", "rl-b")
    ]
    try:
        for trainer in trainers:
            trainer.start()
        joined.wait(60)  # the regular jobs made the group, with its policy
        example = subprocess.Popen(
            [sys.executable, "-m", "examples.backfill_batch_inference.run", "--engine=stand-in",
             f"--group={GROUP}", f"--job={BACKFILL}", f"--address={address}",
             f"--count={PROMPTS}", f"--batch-size={BATCH}", "--seconds-per-prompt=0.02",
             f"--out={out}"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO,
            env={**os.environ, "TIMESHARE_AGENT_SOCKET": str(tmp_path / "agent.sock")},
        )  # fmt: skip
        with connect(address) as client:
            wait_until(lambda: client.get_group(GROUP).holder == BACKFILL, "the backfill turn")
            joined.wait(60)
            stdout, stderr = example.communicate(timeout=120)
            assert example.returncode == 0, stderr
            status = client.get_group(GROUP)
            history = client.group_history(GROUP)
        joined.wait(120)
        for trainer in trainers:
            trainer.join(60)
    finally:
        if example is not None and example.poll() is None:
            example.kill()
        up.send_signal(signal.SIGINT)
        assert up.wait(60) == 0
    result = InferenceResult.model_validate_json(stdout.splitlines()[-1])
    assert result.batches == PROMPTS // BATCH
    done = [json.loads(line) for line in out.read_text().splitlines()]
    assert sum(len(batch) for batch in done) == PROMPTS
    # It ran beside the regular jobs, not after them: asked to yield, it
    # did, and the agent put its engine to sleep for their turns.
    assert result.yielded_early >= 1 and result.sleeps >= 1
    assert status.preemptions == 0
    regular = [t for t in history.turns if t.job != BACKFILL]
    assert {t.job for t in regular} == {"rl-a", "rl-b"}
    # Each regular request made while the backfill job held the GPU waited
    # no longer than the grace, besides the switch that followed.
    waits = timeline.waits_behind(history, {BACKFILL})
    assert waits and max(wait - switch for wait, switch in waits) <= GRACE
