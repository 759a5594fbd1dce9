"""The OpenRLHF and SkyRL plug-ins against a real scheduler and gateway (sim
nodes). Neither framework installs here (tests/rl_standins.py says why), so
the calls are replayed as their code makes them, read from their pinned
source (tests/upstream/openrlhf.json, skyrl.json, written by
tests.upstream.extract), with stand-ins for the GPU actors that record who
held the turn, and for which phase, when each was called."""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import pickle
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

import timeshare
from tests.conftest import REPO, SimNodes
from tests.job_threads import run_jobs_together
from tests.rl_standins import Engine, ModelGroup, Recorder, RemoteInferenceClient
from tests.upstream.extract import load
from timeshare.integrations import openrlhf, skyrl
from timeshare.integrations.release_points import setup_turn, use_turns
from timeshare.integrations.turns import JobTurns, NoTurns

STEPS = 2
OPENRLHF, SKYRL = load("openrlhf"), load("skyrl")


def batch_vllm_engine_call(engines: list[Any], method_name: str, *args: Any, **kwargs: Any) -> Any:
    """openrlhf/trainer/ray/vllm_engine.py: every engine's call sent, then waited for."""
    refs = [getattr(engine, method_name).remote(*args, **kwargs) for engine in engines]
    return refs


def openrlhf_step(engines: list[Any], actor: Any, critic: Any) -> None:
    """One step of OpenRLHF's PPO loop with --vllm.enable_sleep --ds.enable_sleep."""
    wake, sleep = OPENRLHF["samples_generator"][:2]  # generate_samples
    batch_vllm_engine_call(engines, wake)
    batch_vllm_engine_call(engines, "generate")
    batch_vllm_engine_call(engines, sleep)
    actor.async_run_method(method_name="make_experience")
    reload, fit, offload = OPENRLHF["ppo_train"][:3]  # ppo_train's _run_sleep
    for group in (critic, actor):
        for method in (reload, fit, offload):
            group.async_run_method(method_name=method)
    for method, tags in OPENRLHF["broadcast_to_vllm"]:
        batch_vllm_engine_call(engines, method, tags=tags)
    actor.async_run_method(method_name="broadcast_to_vllm")


def openrlhf_job(record: Recorder, turns: Any) -> None:
    setup_turn(turns)  # where train_ppo_ray.py starts the engines and loads the models
    engines = openrlhf.engines([Engine(record, 0), Engine(record, 1)], turns)
    assert engines is not None
    actor = openrlhf.model_group(ModelGroup(record, "actor"), turns)
    critic = openrlhf.model_group(ModelGroup(record, "critic"), turns)
    for _ in range(STEPS):
        openrlhf_step(engines, actor, critic)


async def skyrl_step(client: Any) -> None:
    """One step of SkyRL's colocated loop: generation, the engines' sleep
    (trainer.py), the updates, the weight sync (worker_dispatch.py)."""
    await client.call("generate")
    await client.sleep()
    await client.call("train_critic_and_policy")
    weights, kv_cache = SKYRL["save_weights_for_sampler_wake_ups"][:2]
    await client.wake_up(tags=weights)
    await client.call("broadcast")
    await client.wake_up(tags=kv_cache)


def skyrl_job(record: Recorder, turns: Any) -> None:
    setup_turn(turns)  # where BasePPOExp.get_inference_client starts the engines
    client = skyrl.inference_client(RemoteInferenceClient(record), turns)

    async def steps() -> None:
        await client.call("build_models")
        await client.wake_up(tags=SKYRL["save_weights_for_sampler_wake_ups"][0])
        await client.wake_up(tags=SKYRL["save_weights_for_sampler_wake_ups"][1])
        for _ in range(STEPS):
            await skyrl_step(client)

    asyncio.run(steps())


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


def test_the_hooked_names_are_the_pinned_sources() -> None:
    """What the plug-ins hook, in the frameworks' source at the pinned versions."""
    assert OPENRLHF["samples_generator"][:2] == ["wake_up", "sleep"]
    assert OPENRLHF["ppo_train"][:3] == ["reload_states", "fit", "offload_states"]
    assert OPENRLHF["broadcast_to_vllm"] == [["wake_up", ["weights"]]]
    assert OPENRLHF["batch_vllm_engine_call"][:2] == ["engines", "method_name"]
    assert "async_run_method" in OPENRLHF["RayActorGroup"]
    assert "vllm_enable_sleep" in OPENRLHF["create_vllm_engines"]
    assert OPENRLHF["cli_options"] == ["--ds.enable_sleep", "--vllm.enable_sleep"]
    assert OPENRLHF["train_ppo_ray_calls"] == ["async_init_model_from_pretrained",
                                               "create_vllm_engines"]  # fmt: skip
    assert SKYRL["RemoteInferenceClient"] == {"sleep": ["self", "level", "tags"],
                                              "wake_up": ["self", "tags"]}  # fmt: skip
    assert SKYRL["save_weights_for_sampler_wake_ups"][:2] == [["weights"], ["kv_cache"]]
    assert SKYRL["train_sleeps"] >= 1
    # SkyRL picks LoRA weight sync by isinstance on the policy workers: the wrapped
    # client must stay a RemoteInferenceClient.
    assert SKYRL["isinstance_checks"]
    assert {"get_inference_client", "run"} <= set(SKYRL["BasePPOExp"])
    assert SKYRL["main_base_functions"] == ["main", "skyrl_entrypoint"]
    assert SKYRL["override_entrypoint"]


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
            turns = records[name] = JobTurns(client.join(group, name, [node]))
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


class Phases(NoTurns):
    """Turns that log what they are asked; held once asked."""

    def __init__(self, log: list[str]) -> None:
        super().__init__()
        self.log = log
        self._held = False

    @property
    def holding(self) -> bool:
        return self._held

    def acquire(self, phase: str) -> None:
        self.log.append(f"acquire {phase}")
        self._held, self.phase = True, phase

    def handover(self, phase: str) -> None:
        self.log.append(f"handover {phase}")
        self.phase = phase


def test_openrlhf_engines_sleep_at_once_then_hand_over(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every engine's sleep is sent before any is waited for; the turn is
    handed over once all are done."""
    log: list[str] = []

    class Ref:
        def __init__(self, name: str) -> None:
            log.append(f"sent {name}")
            self.name = name

    def get(refs: Any) -> Any:
        log.append(f"done {refs.name}")

    # What release_points.wait reads of Ray: its ObjectRef type and get().
    monkeypatch.setitem(sys.modules, "ray", SimpleNamespace(ObjectRef=Ref, get=get))

    class RefEngine:
        def __init__(self, index: int) -> None:
            self.sleep = SimpleNamespace(remote=lambda: Ref(f"sleep{index}"))

    turns = Phases(log)
    turns.acquire("rollout")
    engines = openrlhf.engines([RefEngine(0), RefEngine(1)], turns)
    assert engines is not None
    batch_vllm_engine_call(engines, "sleep")
    assert log == ["acquire rollout", "sent sleep0", "sent sleep1", "done sleep0", "done sleep1",
                   "handover train"]  # fmt: skip


def test_openrlhf_without_vllm_sleep_says_so_once(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, "timeshare.integrations.openrlhf"):
        openrlhf.engines([Engine(Recorder("", "", "a"), 0)], NoTurns(), enable_sleep=False)
        openrlhf.engines([Engine(Recorder("", "", "a"), 0)], NoTurns(), enable_sleep=True)
    assert [r.getMessage() for r in caplog.records] == [openrlhf.NO_SLEEP_WARNING]
    assert "--vllm.enable_sleep" in openrlhf.NO_SLEEP_WARNING


def test_the_skyrl_client_stays_a_remote_inference_client() -> None:
    log: list[str] = []
    inner = RemoteInferenceClient(Recorder("", "", "a"), session=object())
    client = skyrl.inference_client(inner, Phases(log))
    assert isinstance(client, RemoteInferenceClient)  # SkyRL's LoRA sync still sees it
    asyncio.run(client.wake_up(tags=["weights"]))
    assert log == []  # the weight sync's wake-up stays in the train turn
    asyncio.run(client.wake_up(tags=["kv_cache"]))
    asyncio.run(client.sleep())
    assert log == ["acquire rollout", "handover train"]
    # Shipped to a policy worker (Ray pickles it): still the class, forwarding only.
    copy = pickle.loads(pickle.dumps(client))
    assert isinstance(copy, RemoteInferenceClient) and copy.session is None
    asyncio.run(copy.sleep())
    asyncio.run(copy.wake_up())
    assert log == ["acquire rollout", "handover train"]


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
            turns = JobTurns(client.join(group, "job-a", [node]), client)
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


def test_without_a_group_the_wrappers_only_forward_and_travel_by_pickle(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for variable in ("TIMESHARE_GROUP", "TIMESHARE_JOB", "TIMESHARE_TURNS_FD"):
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.setenv("TIMESHARE_ADDRESS", "127.0.0.1:1")  # any turn call would fail
    use_turns(None)  # this process's turns come from the (empty) environment
    record = Recorder("", "", "a")
    engines = openrlhf.engines([Engine(record, 0)])
    group = openrlhf.model_group(ModelGroup(record, "actor"))
    # Ray sends them to the trainer's actor: they must survive pickling.
    engines, group = pickle.loads(pickle.dumps((engines, group)))
    assert engines is not None
    calls = group.target.record.calls  # the copy that travelled with them
    openrlhf_step(engines, group, group)
    assert [call for _, call, _, _ in calls][:3] == ["engine0.wake_up", "engine0.generate",
                                                     "engine0.sleep"]  # fmt: skip
    skyrl_job(Recorder("", "", "a"), None)
    use_turns(None)
