"""A group that names no GPUs claims all of its node's at join; once its
processes register and NVML shows which GPUs they use, the claim narrows to
those, and another group joins on the rest. On the GPU emulator with two
GPUs, through a whole local stack (the agent reads NVML as on a GPU host)."""

from __future__ import annotations

from pathlib import Path

import pytest

import timeshare
from tests.polling import wait_until
from timeshare import errors
from timeshare.credentials import JOB_TOKEN_ENV
from timeshare.gpu_check import emulator
from timeshare.gpu_check.emulator.rig import start_worker
from timeshare.models import GroupPolicy
from timeshare.testing import LocalStack

MiB = 2**20


def joined(client: timeshare.Client, group: str, gpus: list[int]) -> timeshare.Job | None:
    try:
        return client.join(group, "x", policy=GroupPolicy(gpus=gpus))
    except errors.FailedPrecondition:
        return None


@pytest.mark.skipif(emulator.gcc() is None, reason="gcc is not installed: the emulator needs it")
def test_a_claim_narrows_to_the_gpus_its_processes_use(tmp_path: Path) -> None:
    lib_dir = emulator.build(emulator.default_build_dir())
    env = emulator.environment(lib_dir, tmp_path / "emulator", tmp_path / "calls.jsonl",
                               gpus=2, gpu_memory=2 << 30)  # fmt: skip
    stack = LocalStack(tmp_path / "stack", backend="cuda", agent_env=env)
    workers = []
    try:
        stack.start_all()
        with timeshare.connect(stack.address) as client:
            wide = client.join("wide", "a")  # names no GPUs: claims both
            assert joined(client, "other", [0]) is None
            workers.append(start_worker(
                {**env, JOB_TOKEN_ENV: wide.token}, tmp_path, "rank", nbytes=64 * MiB,
                register=(str(stack.socket_path), "wide", "a"), device=1,
            ))  # fmt: skip
            # Its process holds GPU 1 only: GPU 0 is free for another group...
            other = wait_until(lambda: joined(client, "other", [0]), "the claim to narrow", 60)
            assert other is not None
            # ...never the GPU that holds its state.
            assert joined(client, "third", [1]) is None
            other.leave()
            wide.leave()
    finally:
        for worker in workers:
            worker.kill()
        stack.stop_all()
