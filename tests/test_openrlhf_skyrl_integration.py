"""The OpenRLHF and SkyRL wrappers against a real scheduler and gateway (sim
nodes). Neither framework installs here: OpenRLHF 0.11.2 requires
flash-attn==2.8.3 (built against CUDA at install) and imports vllm at the top
of openrlhf/trainer/ray/vllm_engine.py; SkyRL 0.4.0 requires Python >= 3.12.
So the calls are replayed as their own code makes them, with stand-ins for
the GPU actors:

- OpenRLHF (openrlhf/trainer/ppo_utils/samples_generator.py, ppo_trainer.py):
  ``batch_vllm_engine_call`` calls ``getattr(engine, name).remote(...)`` on
  every engine, then ``ray.get``; ``ppo_train`` runs ``reload_states``,
  ``fit``, ``offload_states`` per model group through
  ``RayActorGroup.async_run_method``; ``broadcast_to_vllm`` wakes the
  weights only.
- SkyRL (skyrl/train/trainer.py, workers/worker_dispatch.py): the trainer
  awaits ``client.sleep()`` after generation; the weight sync awaits
  ``wake_up(tags=["weights"])`` and ``wake_up(tags=["kv_cache"])``.

Each stand-in records who held the group's turn when it was called: every
GPU call must come inside its own job's turn."""

from __future__ import annotations

import asyncio
import itertools
import pickle
from collections.abc import Callable
from typing import Any

import pytest

import timeshare
from tests.conftest import SimNodes
from tests.job_threads import run_jobs_together
from timeshare.integrations import openrlhf, skyrl
from timeshare.integrations.turns import JobTurns, NoTurns

STEPS = 2
Calls = list[tuple[str, str, str]]  # (job, call, holder then)


class Recorder:
    def __init__(self, client: timeshare.Client | None, group: str, job: str, calls: Calls) -> None:
        self.client, self.group, self.job, self.calls = client, group, job, calls

    def __call__(self, call: str) -> str:
        holder = self.client.get_group(self.group).holder if self.client is not None else ""
        self.calls.append((self.job, call, holder))
        return call


class RemoteMethod:
    """A Ray actor method stand-in: ``.remote()`` runs it (its "ref" is the result)."""

    def __init__(self, run: Callable[[], str]) -> None:
        self.run = run

    def remote(self, *args: Any, **kwargs: Any) -> str:
        return self.run()


class Engine:
    """A vLLM engine actor handle of OpenRLHF (trainer/ray/vllm_engine.py)."""

    def __init__(self, record: Recorder, index: int) -> None:
        self.record, self.index = record, index

    def __getattr__(self, name: str) -> RemoteMethod:
        if name.startswith("__") or name in ("record", "index"):
            raise AttributeError(name)
        return RemoteMethod(lambda: self.record(f"engine{self.index}.{name}"))


class ModelGroup:
    """RayActorGroup.async_run_method (trainer/ray/launcher.py): one call per actor."""

    def __init__(self, record: Recorder, name: str) -> None:
        self.record, self.name = record, name

    def async_run_method(self, method_name: str, *args: Any, **kwargs: Any) -> list[str]:
        return [self.record(f"{self.name}.{method_name}")]


def batch_vllm_engine_call(engines: list[Any], method_name: str, *args: Any, **kwargs: Any) -> Any:
    refs = [getattr(engine, method_name).remote(*args, **kwargs) for engine in engines]
    return refs  # ray.get of the stand-ins' results is the results themselves


def openrlhf_step(engines: list[Any], actor: Any, critic: Any) -> None:
    """One step of OpenRLHF's PPO loop with both sleeps enabled."""
    batch_vllm_engine_call(engines, "wake_up")  # generate_samples
    batch_vllm_engine_call(engines, "generate")
    batch_vllm_engine_call(engines, "sleep")
    actor.async_run_method(method_name="make_experience")  # make_experience_batch (GPU)
    for group in (critic, actor):  # ppo_train: _run_sleep, critic first
        group.async_run_method(method_name="reload_states")
        group.async_run_method(method_name="fit")
        group.async_run_method(method_name="offload_states")
    batch_vllm_engine_call(engines, "wake_up", tags=["weights"])  # broadcast_to_vllm
    actor.async_run_method(method_name="broadcast_to_vllm")


async def skyrl_step(client: Any) -> None:
    """One step of SkyRL's colocated loop."""
    await client.wake_up(tags=["weights"])  # weight sync (worker_dispatch)
    await client.update_named_weights({})
    await client.wake_up(tags=["kv_cache"])
    await client.generate({})
    await client.sleep()  # generation done (trainer)
    await client.train_step()  # the policy update, on the trainer's GPUs


class InferenceClient:
    """SkyRL's InferenceEngineInterface, and the trainer's update, as stand-ins."""

    def __init__(self, record: Recorder) -> None:
        self.record = record

    def __getattr__(self, name: str) -> Callable[..., Any]:
        if name.startswith("__") or name == "record":
            raise AttributeError(name)

        async def call(*args: Any, **kwargs: Any) -> str:
            return self.record(name)

        return call


def openrlhf_job(record: Recorder, turns: Any) -> None:
    engines = openrlhf.engines([Engine(record, 0), Engine(record, 1)], turns)
    assert engines is not None
    actor = openrlhf.model_group(ModelGroup(record, "actor"), turns)
    critic = openrlhf.model_group(ModelGroup(record, "critic"), turns)
    for _ in range(STEPS):
        openrlhf_step(engines, actor, critic)


def skyrl_job(record: Recorder, turns: Any) -> None:
    client = skyrl.inference_client(InferenceClient(record), turns)

    async def steps() -> None:
        for _ in range(STEPS):
            await skyrl_step(client)

    asyncio.run(steps())


FRAMEWORKS = {"openrlhf": openrlhf_job, "skyrl": skyrl_job}


@pytest.mark.parametrize("framework", list(FRAMEWORKS))
async def test_two_jobs_make_every_gpu_call_inside_their_own_turns(
    gateway: str, sim_nodes: SimNodes, unique: str, framework: str
) -> None:
    node, group = f"n-{unique}", f"{framework}-{unique}"
    await sim_nodes.start(node)
    calls: Calls = []
    records: dict[str, JobTurns] = {}

    def job(name: str) -> None:
        with timeshare.connect(gateway) as client:
            turns = records[name] = JobTurns(client.join(group, name, [node]))
            FRAMEWORKS[framework](Recorder(client, group, name, calls), turns)
            turns.close()

    await run_jobs_together(job, ["job-a", "job-b"])
    assert calls and all(holder == job for job, _, holder in calls), calls
    for name, turns in records.items():
        phases = [record.phase for record in turns.records]
        # One turn per phase, handed over at each of the framework's own releases.
        assert phases[0] == "rollout", (name, phases)
        assert all(a != b for a, b in itertools.pairwise(phases)), (name, phases)
    everyone = sorted((r.granted_at, name) for name, t in records.items() for r in t.records)
    order = [name for _, name in everyone]
    assert sum(1 for a, b in itertools.pairwise(order) if a != b) >= 2, order


def test_the_turns_change_at_the_frameworks_own_release_points() -> None:
    """Where a phase ends, by the calls the wrappers saw (no stack needed)."""

    class Phases(NoTurns):
        """Turns that record what they were asked, and are always 'held' once asked."""

        def __init__(self) -> None:
            super().__init__()
            self.log: list[str] = []
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

    calls: Calls = []
    turns = Phases()
    engines = openrlhf.engines([Engine(Recorder(None, "", "a", calls), i) for i in range(2)], turns)
    assert engines is not None
    batch_vllm_engine_call(engines, "wake_up")
    batch_vllm_engine_call(engines[:1], "sleep")
    assert turns.log == ["acquire rollout"]  # one engine still awake: no handover yet
    batch_vllm_engine_call(engines[1:], "sleep")
    assert turns.log == ["acquire rollout", "handover train"]
    group = openrlhf.model_group(ModelGroup(Recorder(None, "", "a", calls), "actor"), turns)
    group.async_run_method(method_name="reload_states")
    group.async_run_method(method_name="fit")
    assert turns.log == ["acquire rollout", "handover train"]
    group.async_run_method(method_name="offload_states")
    assert turns.log[-1] == "handover rollout"


def test_without_a_group_the_wrappers_only_forward_and_travel_by_pickle(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for variable in ("TIMESHARE_GROUP", "TIMESHARE_JOB", "TIMESHARE_TURNS_FD"):
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.setenv("TIMESHARE_ADDRESS", "127.0.0.1:1")  # any turn call would fail
    from timeshare.integrations.release_points import use_turns

    use_turns(None)  # this process's turns come from the (empty) environment
    calls: Calls = []
    engines = openrlhf.engines([Engine(Recorder(None, "", "a", calls), 0)])
    group = openrlhf.model_group(ModelGroup(Recorder(None, "", "a", calls), "actor"))
    # Ray sends them to the trainer's actor: they must survive pickling.
    engines, group = pickle.loads(pickle.dumps((engines, group)))
    assert engines is not None
    calls = group.target.record.calls  # the copy that travelled with them
    openrlhf_step(engines, group, group)
    assert [call for _, call, _ in calls][:3] == ["engine0.wake_up", "engine0.generate",
                                                  "engine0.sleep"]  # fmt: skip
    skyrl_job(Recorder(None, "", "a", calls), None)
    assert calls[-1][1] == "train_step"
    use_turns(None)
