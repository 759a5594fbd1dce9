"""A group that names no GPUs claims all of its node's at join (a timeshare
group with no `gpus`, or an llm-d group that --llmd-gpus does not place); once
its processes register and NVML shows which GPUs they use, the claim narrows
to those, and another group joins on the rest. On the GPU emulator with two
GPUs, through a whole local stack (the agent reads NVML as on a GPU host)."""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest

import timeshare
from tests.polling import wait_until
from timeshare import errors
from timeshare.credentials import JOB_TOKEN_ENV, llmd_job_token
from timeshare.gpu_check import emulator
from timeshare.gpu_check.emulator.rig import start_worker
from timeshare.models import GroupPolicy
from timeshare.testing import LocalStack
from timeshare.v1 import llmd_compat_pb2 as llmd
from timeshare.v1 import llmd_compat_pb2_grpc as llmd_grpc
from timeshare.workers.gateway.llmd_compat import SECRET_ENV

MiB = 2**20
LLMD_SECRET = "shared by the gateway and the operator"


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


def llmd_granted(stub: llmd_grpc.TimeSliceOrchestratorServiceStub, group: str) -> bool:
    """An llm-d job's first Acquire, which joins it; False where its group's
    GPUs are claimed by another group."""
    try:
        stub.Acquire(llmd.AcquireRequest(job_id="x", group_id=group), timeout=60)
    except grpc.RpcError as error:
        assert error.code() == grpc.StatusCode.FAILED_PRECONDITION, error
        return False
    return True


@pytest.mark.skipif(emulator.gcc() is None, reason="gcc is not installed: the emulator needs it")
def test_an_llmd_groups_claim_narrows_to_the_gpus_its_processes_use(tmp_path: Path) -> None:
    """An llm-d group that --llmd-gpus does not place claims both GPUs at its
    first Acquire; once its process registers (with the job token an operator
    derives) and uses GPU 1, a group placed on GPU 0 is granted, and one placed
    on GPU 1 is still refused."""
    lib_dir = emulator.build(emulator.default_build_dir())
    env = emulator.environment(lib_dir, tmp_path / "emulator", tmp_path / "calls.jsonl",
                               gpus=2, gpu_memory=2 << 30)  # fmt: skip
    stack = LocalStack(
        tmp_path / "stack", backend="cuda", agent_env=env,
        gateway_options=["--llmd-compat", "--llmd-gpus", "placed-*=node-a:0", "blocked-*=node-a:1"],
        gateway_env={SECRET_ENV: LLMD_SECRET},
    )  # fmt: skip
    workers = []
    try:
        stack.start_all()
        with grpc.insecure_channel(stack.address) as channel:
            stub = llmd_grpc.TimeSliceOrchestratorServiceStub(channel)
            stub.Acquire(llmd.AcquireRequest(job_id="a", group_id="wide"), timeout=60)
            assert not llmd_granted(stub, "placed-0")  # "wide" claims both GPUs
            token = llmd_job_token(LLMD_SECRET.encode(), "wide", "a")
            workers.append(start_worker(
                {**env, JOB_TOKEN_ENV: token}, tmp_path, "rank", nbytes=64 * MiB,
                register=(str(stack.socket_path), "wide", "a"), device=1,
            ))  # fmt: skip
            # Its process holds GPU 1 only: GPU 0 is free for another group...
            wait_until(lambda: llmd_granted(stub, "placed-0"), "the claim to narrow", 60)
            # ...never the GPU that holds its state.
            assert not llmd_granted(stub, "blocked-1")
            assert stack.group("wide").holder == "a"
    finally:
        for worker in workers:
            worker.kill()
        stack.stop_all()
