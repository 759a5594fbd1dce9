"""The OpenRLHF and SkyRL plug-ins against a real scheduler and gateway (sim
nodes). Neither framework installs here (tests/rl_standins.py says why), so
the calls are replayed as their code makes them, read from their pinned
source (tests/upstream/openrlhf.json, skyrl.json, written by
tests.upstream.extract), with stand-ins for the GPU actors that record who
held the turn, and for which phase, when each was called.

Here the tests that start processes; the others are in
tests/unit/test_openrlhf_skyrl_integration.py."""

from __future__ import annotations

import asyncio
import itertools
import os
import pickle
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import timeshare
from tests.conftest import REPO, SimNodes
from tests.job_threads import run_jobs_together
from tests.rl_standins import Engine, ModelGroup, Recorder
from tests.unit.test_openrlhf_skyrl_integration import (
    STEPS,
    openrlhf_step,
    skyrl_job,
)
from timeshare.integrations import openrlhf
from timeshare.integrations.release_points import setup_turn, use_turns
from timeshare.integrations.turns import JobTurns


def openrlhf_job(record: Recorder, turns: Any) -> None:
    setup_turn(turns)  # where train_ppo_ray.py starts the engines and loads the models
    engines = openrlhf.engines([Engine(record, 0), Engine(record, 1)], turns)
    assert engines is not None
    actor = openrlhf.model_group(ModelGroup(record, "actor"), turns)
    critic = openrlhf.model_group(ModelGroup(record, "critic"), turns)
    for _ in range(STEPS):
        openrlhf_step(engines, actor, critic)


# Each job's turns, and the phase each call ran in.
EXPECTED = {
    "openrlhf": (
        ["setup", *["rollout", "train"] * STEPS, "rollout"],
        {"engine0.generate": "rollout", "engine0.sleep": "rollout", "actor.make_experience":
         "train", "critic.offload_states": "train", "actor.reload_states": "train",
         "actor.fit": "train", "engine0.wake_up": "rollout", "actor.broadcast_to_vllm":
         "rollout"},
    ),
    "skyrl": (
        ["setup", *["rollout", "train"] * STEPS, "rollout"],
        {"build_models": "setup", "generate": "rollout", "sleep": "rollout",
         "train_critic_and_policy": "train", "wake_up(weights)": "train", "broadcast": "train",
         "wake_up(kv_cache)": "rollout"},
    ),
}  # fmt: skip


FRAMEWORKS = {"openrlhf": openrlhf_job, "skyrl": skyrl_job}


@pytest.mark.parametrize("framework", list(FRAMEWORKS))
async def test_two_jobs_make_every_gpu_call_inside_their_own_turns(
    gateway: str, sim_nodes: SimNodes, unique: str, framework: str
) -> None:
    node, group = f"n-{unique}", f"{framework}-{unique}"
    await sim_nodes.start(node)
    records: dict[str, JobTurns] = {}
    calls: dict[str, Recorder] = {}

    def job(name: str) -> None:
        with timeshare.connect(gateway) as client:
            turns = records[name] = JobTurns(client.join(group, name, nodes=[node]))
            calls[name] = Recorder(gateway, group, name)
            FRAMEWORKS[framework](calls[name], turns)
            turns.close()

    await run_jobs_together(job, ["job-a", "job-b"])
    phases, phase_of_call = EXPECTED[framework]
    for name, turns in records.items():
        assert [record.phase for record in turns.records] == phases, name
        seen = calls[name].calls
        assert all(holder == name for _, _, holder, _ in seen), seen
        ran_in = {call: phase for _, call, _, phase in seen}
        assert {call: ran_in[call] for call in phase_of_call} == phase_of_call, seen
    everyone = sorted((r.granted_at, name) for name, t in records.items() for r in t.records)
    order = [name for _, name in everyone]
    assert sum(1 for a, b in itertools.pairwise(order) if a != b) >= 2, order


async def test_the_openrlhf_trainer_actor_takes_the_turn_on_from_the_driver(
    gateway: str, sim_nodes: SimNodes, unique: str, tmp_path: Path
) -> None:
    """The driver holds the setup turn; the wrappers, pickled to another
    process (Ray's trainer actor), carry it there: its first wake-up hands
    the same job's turn over, without a second Join."""
    node, group = f"n-{unique}", f"openrlhf-{unique}"
    await sim_nodes.start(node)

    def scenario() -> None:
        with timeshare.connect(gateway) as client:
            turns = JobTurns(client.join(group, "job-a", nodes=[node]), client)
            use_turns(turns)
            try:
                setup_turn()
                engines = openrlhf.engines([Engine(Recorder(gateway, group, "job-a"), 0)])
                (tmp_path / "engines.pickle").write_bytes(pickle.dumps(engines))
            finally:
                use_turns(None)
            script = (
                "import pickle, sys\n"
                "engines = pickle.loads(open(sys.argv[1], 'rb').read())\n"
                "engines[0].wake_up.remote()\n"
                "print(engines[0].target.record.calls)\n"
            )
            env = {**os.environ, "PYTHONPATH": str(REPO)}
            for variable in ("TIMESHARE_GROUP", "TIMESHARE_JOB", "TIMESHARE_TURNS_FD"):
                env.pop(variable, None)
            done = subprocess.run(
                [sys.executable, "-c", script, str(tmp_path / "engines.pickle")],
                capture_output=True, text=True, env=env, timeout=60, cwd=REPO,
            )  # fmt: skip
            assert done.returncode == 0, done.stderr
            assert "('job-a', 'engine0.wake_up', 'job-a', 'rollout')" in done.stdout
            status = client.get_group(group)
            # The actor left at its exit (the job's turns went with it); the driver's close
            # after that finds nothing to give back.
            assert status.holder == "" and status.jobs == []
            turns.close()

    await asyncio.to_thread(scenario)
