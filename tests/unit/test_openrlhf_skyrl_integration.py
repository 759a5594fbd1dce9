"""The OpenRLHF and SkyRL plug-ins against a real scheduler and gateway (sim
nodes). Neither framework installs here (tests/rl_standins.py says why), so
the calls are replayed as their code makes them, read from their pinned
source (tests/upstream/openrlhf.json, skyrl.json, written by
tests.upstream.extract), with stand-ins for the GPU actors that record who
held the turn, and for which phase, when each was called.

Here the tests that start no process; the others are in
tests/integration/test_openrlhf_skyrl_integration.py."""

from __future__ import annotations

import asyncio
import logging
import pickle
import sys
from types import SimpleNamespace
from typing import Any

import pytest

from tests.rl_standins import Engine, ModelGroup, Recorder, RemoteInferenceClient
from tests.upstream.extract import load
from timeshare.integrations import openrlhf, skyrl
from timeshare.integrations.release_points import setup_turn, use_turns
from timeshare.integrations.turns import NoTurns

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
