"""Profiles from a real group history: synthetic jobs (real processes) take
turns through the real gateway and workflow on sim nodes, `timeshare
profile` reads the history back, and `timeshare plan --from-groups` advises
on the live groups without moving anyone."""

from __future__ import annotations

import asyncio
import json
import subprocess
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import timeshare
import timeshare.aio
from tests.conftest import REPO, SimNodes
from tests.polling import wait_until_async
from timeshare.history import GroupHistory
from timeshare.testing import timeshare_command

STATE_BYTES = 2**26
# Sample 0.8 s, reward 1.2 s on the CPU, train 0.1 s: two turns an iteration,
# the sample turn 0.7 s longer than the train turn, however slow the stack
# (a turn's length in the history includes the grant's and the yield's trips).
ITERATION = "gpu:0.8,cpu:1.2,gpu:0.1"
TURNS_WANTED = 6


@asynccontextmanager
async def jobs_running(
    gateway: str, group: str, node: str, names: list[str]
) -> AsyncIterator[list[subprocess.Popen[bytes]]]:
    """Synthetic job processes that run until the block ends (then leave:
    waited for in a thread, the gateway serving their leave from this loop)."""
    processes = [
        subprocess.Popen(
            timeshare_command(
                "synthetic-job", f"--group={group}", f"--job={name}", f"--address={gateway}",
                f"--nodes={node}", "--iterations=1000", f"--iteration={ITERATION}",
                "--co-residency=off", f"--start-delay-seconds={0.1 * index}",
            ),
            cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        )
        for index, name in enumerate(names)
    ]  # fmt: skip
    try:
        yield processes
    finally:
        for process in processes:
            process.terminate()
        for process in processes:
            await asyncio.to_thread(process.wait, 60)


async def history_of(gateway: str, group: str) -> GroupHistory:
    client = timeshare.aio.connect(gateway)
    try:
        return await client.group_history(group)
    finally:
        await client.close()


def still_running(processes: list[subprocess.Popen[bytes]]) -> None:
    """A job that gave up says why here, not as a wait that runs out."""
    for process in processes:
        if process.poll() is not None:
            assert process.stderr is not None
            raise AssertionError(f"a job exited early: {process.stderr.read().decode()[-2000:]}")


async def enough_turns(
    gateway: str, group: str, jobs: list[str], processes: list[subprocess.Popen[bytes]]
) -> GroupHistory | None:
    still_running(processes)
    try:
        history = await history_of(gateway, group)
    except timeshare.NotFound:
        return None
    done = [t for t in history.turns if t.released_at]
    return history if all(sum(t.job == j for t in done) >= TURNS_WANTED for j in jobs) else None


async def cli(*args: str) -> subprocess.CompletedProcess[str]:
    # In a thread: the gateway and the sim agents serve from this test's loop.
    return await asyncio.to_thread(
        subprocess.run, timeshare_command(*args), capture_output=True, text=True, cwd=REPO,
        timeout=120,
    )  # fmt: skip


async def test_profiles_and_advice_from_live_group_histories(
    gateway: str, sim_nodes: SimNodes, unique: str
) -> None:
    shared, alone = f"pa-{unique}", f"pb-{unique}"
    pair, solo = f"pair-{unique}", f"solo-{unique}"
    await sim_nodes.start(shared, state_bytes=STATE_BYTES)
    await sim_nodes.start(alone, state_bytes=STATE_BYTES)
    async with (
        jobs_running(gateway, pair, shared, ["a", "b"]) as pair_jobs,
        jobs_running(gateway, solo, alone, ["c"]) as solo_jobs,
    ):
        await wait_until_async(
            lambda: enough_turns(gateway, pair, ["a", "b"], pair_jobs), "turns of a and b", 240,
            every=0.5,
        )  # fmt: skip
        await wait_until_async(
            lambda: enough_turns(gateway, solo, ["c"], solo_jobs), "turns of c", 240, every=0.5
        )
        profiled = await cli("profile", "--group", pair, "--json", f"--address={gateway}")
        assert profiled.returncode == 0, profiled.stderr
        table = await cli("profile", "--group", pair, f"--address={gateway}")
        advice = await cli(
            "plan", "--from-groups", f"--groups={pair},{solo}", "--max-slowdown=3",
            f"--state-gib=c={STATE_BYTES / 2**30}", f"--address={gateway}",
        )  # fmt: skip
        client = timeshare.aio.connect(gateway)
        try:
            after = [await client.get_group(g) for g in (pair, solo)]
        finally:
            await client.close()
    document = json.loads(profiled.stdout)
    assert sorted(j["name"] for j in document["jobs"]) == ["a", "b"]
    for job in document["jobs"]:
        phases = job["iteration"]
        gpu = [p["gpu"] for p in phases if p["gpu"] is not None]
        # Two turns an iteration, the sample turn eight times the train turn,
        # the reward between them the longest time off the GPU: the pattern,
        # whatever the stack's latencies add to each figure.
        assert len(gpu) == 2 and gpu[0] > 2 * gpu[1], phases
        assert phases[0]["gpu"] == gpu[0] and phases[1]["cpu"] is not None, phases
        assert phases[1]["cpu"] == max(p["cpu"] or 0.0 for p in phases), phases
        measured = job["measured"]
        assert measured["turns"] >= TURNS_WANTED
        assert measured["iterations"] == measured["turns"] // 2
        # Every checkpoint of the job moved its whole simulated state, exactly.
        assert measured["state_bytes_by_node"] == {shared: STATE_BYTES}
        assert measured["nodes"] == [shared]
        assert job["state_gib"] == STATE_BYTES / 2**30
    assert "a" in table.stdout and "b" in table.stdout and "turns" in table.stdout.lower()
    assert advice.returncode == 0, advice.stderr
    last = advice.stdout.strip().splitlines()[-1]
    assert "sets_now=2 sets_suggested=1" in last, advice.stdout
    assert "frees the GPU set of group" in advice.stdout
    assert any(line.startswith("move ") for line in advice.stdout.splitlines())
    # It advised; it moved nothing.
    assert [sorted(j.job for j in g.jobs) for g in after] == [["a", "b"], ["c"]]
