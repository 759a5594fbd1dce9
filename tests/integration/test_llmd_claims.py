"""llm-d groups claim their GPUs as timeshare's own do: a group that would
share a GPU with another is refused at its first call (FAILED_PRECONDITION,
naming the holder and when its claim lapses), never admitted and then aborted
when its state cannot be restored; `--llmd-gpus` places groups on GPUs of
their own; a claim lapses with its jobs' leases, and the holder's state goes
with it. The jobs are processes of their own, with llm-d's own client where it
is installed and timeshare's copy of its wire format everywhere."""

from __future__ import annotations

import asyncio
import itertools
import json
import re
import sys
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

import grpc
import pytest
from temporalio.worker import Worker

from tests.conftest import REPO, SimNodes
from tests.gateways import RunningGateway, start_gateway
from tests.polling import wait_until_async
from timeshare.testing import overlaps
from timeshare.v1 import llmd_compat_pb2 as llmd
from timeshare.v1 import llmd_compat_pb2_grpc as llmd_grpc
from timeshare.workers.gateway.llmd_compat import CompatSettings
from timeshare.workers.gateway.llmd_placement import LlmdPlacement, parse_placement

SECRET = b"shared by the gateway replicas"
CLIENTS = ["wire", pytest.param("llm-d", marks=pytest.mark.llmd_client)]
JOB_SECONDS = 120.0


@dataclass
class JobRun:
    returncode: int
    turns: list[dict[str, Any]]
    error: str
    output: str


async def run_jobs(client: str, address: str, *jobs: list[str]) -> list[JobRun]:
    """llm-d jobs as processes of their own (tests/llmd_jobs.py), started
    together once each has connected."""
    command = [sys.executable, "-m", "tests.llmd_jobs", "--client", client, "--address", address]
    pipe = asyncio.subprocess.PIPE
    processes = [
        await asyncio.create_subprocess_exec(
            *command, *args, cwd=REPO, stdin=pipe, stdout=pipe, stderr=asyncio.subprocess.STDOUT
        )
        for args in jobs
    ]
    early: list[bytes] = []
    for process in processes:
        assert process.stdout is not None
        line = await asyncio.wait_for(process.stdout.readline(), JOB_SECONDS)
        early.append(b"" if line.startswith(b'{"ready"') else line)
    outputs = await asyncio.gather(
        *(asyncio.wait_for(p.communicate(b"go\n"), JOB_SECONDS) for p in processes)
    )
    return [
        job_run(p.returncode, (first + out).decode())
        for p, first, (out, _) in zip(processes, early, outputs, strict=True)
    ]


def job_run(returncode: int | None, output: str) -> JobRun:
    lines = [json.loads(line) for line in output.splitlines() if line.startswith("{")]
    error = next((line["error"] for line in lines if "error" in line), "")
    turns = [line for line in lines if "group" in line]
    assert returncode is not None
    return JobRun(returncode, turns, error, output)


def slime_job(index: int, trainers: str, samplers: str) -> list[str]:
    """A Slime job with llm-d's RoleLocks: trainer and sampler groups."""
    return ["slime", "--job", f"slime-{index}", "--trainer", trainers, "--sampler", samplers]


def assert_one_holder_per_group(runs: list[JobRun]) -> dict[str, int]:
    """No two jobs' turns in one group overlap, as the jobs saw them (from
    the grant's return to the release's call, within the real turn)."""
    by_group: defaultdict[str, list[dict[str, Any]]] = defaultdict(list)
    for run in runs:
        for turn in run.turns:
            by_group[turn["group"]].append(turn)
    for group, turns in by_group.items():
        turns.sort(key=lambda t: t["began"])
        for earlier, later in itertools.pairwise(turns):
            assert earlier["ended"] <= later["began"], f"{group}: {earlier} overlaps {later}"
    return {group: len(turns) for group, turns in by_group.items()}


async def compat_gateway(temporal_address: str, *placements: str, lease: float = 3600.0
                         ) -> RunningGateway:  # fmt: skip
    settings = CompatSettings(
        secret=SECRET, lease_seconds=lease, placements=[parse_placement(p) for p in placements]
    )
    return await start_gateway(temporal_address, settings)


@pytest.mark.parametrize("kind", CLIENTS)
async def test_groups_placed_on_gpus_of_their_own_take_turns_side_by_side(
    kind: str, temporal_address: str, scheduler: Worker, sim_nodes: SimNodes, unique: str
) -> None:
    """One node, three simulated GPUs, a group on each (--llmd-gpus): three
    jobs contend in one group, then two Slime jobs take turns in their trainer
    and sampler groups and hold both at weight sync."""
    node = f"n-{unique}"
    trainers, samplers, pool = f"trainers-{unique}", f"samplers-{unique}", f"pool-{unique}"
    backend = await sim_nodes.start(node, gpus=3)
    gateway = await compat_gateway(
        temporal_address, f"trainers-*={node}:0", f"samplers-*={node}:1", f"pool-*={node}:2"
    )
    try:
        contenders = [["contend", "--group", pool, "--job", f"job-{i}"] for i in range(3)]
        runs = await run_jobs(kind, gateway.address, *contenders)
        assert [r.error for r in runs] == ["", "", ""], [r.output for r in runs]
        assert assert_one_holder_per_group(runs) == {pool: 6}
        assert any(t["waited_ms"] > 0 for r in runs for t in r.turns)  # they did contend
        slime_jobs = [slime_job(i, trainers, samplers) for i in (1, 2)]
        runs = await run_jobs(kind, gateway.address, *slime_jobs)
        assert [r.error for r in runs] == ["", ""], [r.output for r in runs]
        assert not any("FAILED" in r.output for r in runs), [r.output for r in runs]
        # Two steps each: generate, train, weight sync (both).
        assert assert_one_holder_per_group(runs) == {trainers: 8, samplers: 8}
    finally:
        await gateway.close()
    assert backend.placement == {pool: [2], trainers: [0], samplers: [1]}
    assert overlaps(backend.events) == 0


@pytest.mark.parametrize("kind", CLIENTS)
async def test_a_second_group_on_one_gpu_is_refused_at_its_first_call(
    kind: str, temporal_address: str, scheduler: Worker, sim_nodes: SimNodes, unique: str
) -> None:
    """The issue's setup: two Slime jobs, a trainer and a sampler group, one
    node with one GPU. Slime generates first, so the sampler group takes the
    GPU. Without claims, each job's first trainer call was admitted and then
    aborted: "ABORTED: its state could not be restored: ... cannot admit
    trainers-.../slime-1 while [samplers-.../slime-1] still resident". Now
    it is refused, naming the group that holds the GPU."""
    node = f"n-{unique}"
    trainers, samplers = f"trainers-{unique}", f"samplers-{unique}"
    backend = await sim_nodes.start(node)
    gateway = await compat_gateway(temporal_address, f"*-{unique}={node}:0")
    try:
        slime_jobs = [slime_job(i, trainers, samplers) for i in (1, 2)]
        runs = await run_jobs(kind, gateway.address, *slime_jobs)
    finally:
        await gateway.close()
    for run in runs:
        assert run.returncode != 0, run.output
        assert "ABORTED" not in run.output, run.output
        assert "FAILED_PRECONDITION" in run.error, run.output
        assert f"claimed by group {samplers!r}" in run.error, run.error
        assert "--llmd-gpus" in run.error and "lapses" in run.error, run.error
        assert [t["group"] for t in run.turns] == [samplers]  # its first generate step
    assert not any(e["event"] == "overlap" for e in backend.events)
    assert not any(e.get("group") == trainers for e in backend.events)


async def test_a_lapsed_claim_frees_the_gpu_and_its_state(
    temporal_address: str, scheduler: Worker, sim_nodes: SimNodes, unique: str
) -> None:
    """llm-d's jobs never leave: an idle group's claim lapses with its jobs'
    leases, its resident state is released, and the next group's first call
    goes through, never blocked for ever."""
    node = f"n-{unique}"
    first, second = f"first-{unique}", f"second-{unique}"
    backend = await sim_nodes.start(node)
    lease = 2.0
    gateway = await compat_gateway(temporal_address, f"*-{unique}={node}:0", lease=lease)
    try:
        async with grpc.aio.insecure_channel(gateway.address) as channel:
            stub = llmd_grpc.TimeSliceOrchestratorServiceStub(channel)
            await stub.Acquire(llmd.AcquireRequest(job_id="a", group_id=first))
            await stub.Yield(llmd.YieldRequest(job_id="a", group_id=first))
            assert backend.resident(first) == ["a"]  # nobody waited: it stays on the GPU
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await stub.Acquire(llmd.AcquireRequest(job_id="x", group_id=second))
            assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
            message = refused.value.details() or ""
            assert f"claimed by group {first!r} (jobs a)" in message, message
            lapse = re.search(r"\(in (\d+) s\) unless they call again", message)
            assert lapse is not None and int(lapse.group(1)) <= lease, message
            assert backend.resident(second) == []

            async def granted() -> bool:
                try:
                    await stub.Acquire(llmd.AcquireRequest(job_id="x", group_id=second))
                except grpc.aio.AioRpcError as error:
                    assert error.code() == grpc.StatusCode.FAILED_PRECONDITION, error
                    return False
                return True

            await wait_until_async(granted, "the first group's claim to lapse", every=0.5)
            assert backend.resident(second) == ["x"] and backend.resident(first) == []
            assert (first, "a") not in backend.jobs  # released, not parked
    finally:
        await gateway.close()
    assert overlaps(backend.events) == 0


def test_placements_match_group_ids_in_order() -> None:
    placements = [parse_placement(p) for p in ("trainers-*=n:0,2", "*=n:1")]
    assert placements[0] == LlmdPlacement(pattern="trainers-*", node="n", gpus=[0, 2])
    assert [p.node for p in placements if p.matches("trainers-a")] == ["n", "n"]
    assert not placements[0].matches("samplers-a") and placements[1].matches("samplers-a")
    for bad, says in [
        ("trainers-*=node-0", "expected PATTERN=NODE:GPU[,GPU...]"),
        ("trainers-*", "expected PATTERN=NODE:GPU[,GPU...]"),
        ("trainers-*=node-0:zero", "'zero' is not a GPU index"),
        ("trainers-*=node-0:1,1", "names a GPU twice"),
        ("trainers-*=node-0:256", "GPU indices run from 0 to 255"),
        ("trainers-*=Node 0:1", "node name 'Node 0' is invalid"),
    ]:
        with pytest.raises(ValueError, match=re.escape(says)):
            parse_placement(bad)
