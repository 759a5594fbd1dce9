"""verl's real v1 trainers (verl 0.9.1 from PyPI, its own default config)
with timeshare's turns, against a real scheduler and gateway (sim nodes).

What runs for real: verl's trainer registry, PPOTrainerSync's and
PPOTrainerColocateAsync's constructors and their hooks (on_init_end,
on_step_begin, on_sample_end, on_step_end), called in the order verl's
PPOTrainer.fit and _step_once call them. What does not: ``_setup`` (it starts
Ray worker groups and vLLM servers on GPUs) is skipped, and the trainer's
``checkpoint_manager`` is a recorder of CheckpointEngineManager's methods
that verl's hooks call (verl/checkpoint_engine/base.py: sleep_replicas,
update_weights, abort_replicas, resume_generation_replicas)."""

from __future__ import annotations

import itertools
import sys
import threading
from typing import Any

import pytest

import timeshare
from tests.conftest import SimNodes
from tests.job_threads import run_jobs_together
from timeshare.integrations.turns import JobTurns

verl_v1 = pytest.importorskip("verl.trainer.ppo.v1")
STEPS = 2


class RecordingCheckpointManager:
    """What verl's trainer hooks ask of the rollout replicas, and who held the turn then."""

    def __init__(self, client: timeshare.Client, group: str, job: str, calls: list[Any]) -> None:
        self.client, self.group, self.job, self.calls = client, group, job, calls

    def _record(self, call: str) -> None:
        self.calls.append((self.job, call, self.client.get_group(self.group).holder))

    def sleep_replicas(self) -> None:
        self._record("sleep_replicas")

    def update_weights(self, global_steps: int | None = None) -> None:
        self._record("update_weights")

    def abort_replicas(self) -> None:
        self._record("abort_replicas")

    def resume_generation_replicas(self) -> None:
        self._record("resume_generation_replicas")


@pytest.fixture(scope="module")
def verl_config() -> Any:
    from hydra import compose, initialize_config_module

    with initialize_config_module("verl.trainer.config", version_base=None):
        return compose("ppo_trainer", overrides=["trainer.use_v1=True"])


def run_like_fit(trainer: Any) -> None:
    """The hooks, in the order PPOTrainer.init, fit and _step_once call them
    (on_train_begin, which only fills the replay buffer, is left out)."""
    trainer.init()
    trainer.curr_step_profile = False  # as fit() sets it before its loop
    for _ in range(STEPS):
        trainer.timing_raw = {}  # as fit() sets it at each step
        trainer.on_step_begin()
        trainer.on_sample_begin()
        trainer.on_sample_end()
        trainer.on_step_end()
        trainer.global_steps += 1


def make_trainer(name: str, config: Any, turns: JobTurns, manager: Any) -> Any:
    from timeshare.integrations.verl import register_trainers

    register_trainers()
    trainer = verl_v1.get_trainer_cls(name)(config.copy(), turns=turns)
    trainer._setup = lambda: setattr(trainer, "checkpoint_manager", manager)
    trainer.global_steps = 1
    return trainer


@pytest.mark.parametrize("mode", ["sync", "colocate_async"])
async def test_verl_trainers_take_turns_at_their_own_hooks(
    gateway: str, sim_nodes: SimNodes, unique: str, verl_config: Any, mode: str
) -> None:
    node, group = f"n-{unique}", f"verl-{unique}"
    await sim_nodes.start(node)
    calls: list[Any] = []
    records: dict[str, JobTurns] = {}

    def job(name: str) -> None:
        with timeshare.connect(gateway) as client:
            turns = JobTurns(client.join(group, name, [node]))
            records[name] = turns
            manager = RecordingCheckpointManager(client, group, name, calls)
            trainer = make_trainer(f"timeshare_{mode}", verl_config, turns, manager)
            assert isinstance(trainer, verl_v1.get_trainer_cls(mode))
            assert trainer.trainer_mode == mode  # verl's own branches see its own mode
            run_like_fit(trainer)
            trainer.leave_group()

    await run_jobs_together(job, ["job-a", "job-b"])
    for name, turns in records.items():
        phases = [record.phase for record in turns.records]
        assert phases == ["setup", *["rollout", "train"] * STEPS], (name, phases)
    # verl's own sleep and wake of the replicas ran inside the job's own turns.
    assert calls and all(holder == job for job, _, holder in calls), calls
    expected = {"sync": {"sleep_replicas", "update_weights"},
                "colocate_async": {"sleep_replicas", "update_weights", "abort_replicas",
                                   "resume_generation_replicas"}}[mode]  # fmt: skip
    assert {call for _, call, _ in calls} == expected
    # The two jobs took turns: each one's turns are not one block.
    everyone = sorted((r.granted_at, name) for name, t in records.items() for r in t.records)
    order = [name for _, name in everyone]
    switches = sum(1 for a, b in itertools.pairwise(order) if a != b)
    assert switches >= 2, order


def test_the_replica_hooks_sleep_and_wake_only_what_verl_left_awake() -> None:
    from timeshare.integrations.verl import ReplicaHooks

    calls: list[str] = []

    class Manager:
        def sleep_replicas(self) -> None:
            calls.append("sleep")

        def update_weights(self, global_steps: int | None = None) -> None:
            calls.append(f"update_weights({global_steps})")

        def abort_replicas(self) -> None:
            calls.append("abort")

        def resume_generation_replicas(self) -> None:
            calls.append("resume")

    class Trainer:
        checkpoint_manager = Manager()
        replicas_awake = False
        global_steps = 7

    trainer = Trainer()
    hooks = ReplicaHooks(trainer, partial_rollout=True)
    hooks.evict("offload")  # asleep already (after on_sample_end): nothing to do
    hooks.admit()
    assert calls == []
    trainer.replicas_awake = True  # after on_step_end's weight sync
    hooks.evict("offload")
    assert calls == ["abort", "sleep"] and not trainer.replicas_awake
    hooks.admit()
    assert calls == ["abort", "sleep", "update_weights(7)", "resume"] and trainer.replicas_awake


def test_without_a_group_the_trainers_do_what_verls_do(
    verl_config: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    for variable in ("TIMESHARE_GROUP", "TIMESHARE_JOB", "TIMESHARE_TURNS_FD"):
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.setenv("TIMESHARE_ADDRESS", "127.0.0.1:1")  # any call would fail
    from timeshare.integrations.verl import register_trainers

    trainer_class = register_trainers()["timeshare_sync"]
    trainer = trainer_class(verl_config.copy())
    assert not trainer.timeshare_turns.enabled
    calls: list[str] = []

    class Manager:
        def sleep_replicas(self) -> None:
            calls.append("sleep")

        def update_weights(self, global_steps: int | None = None) -> None:
            calls.append("update")

    manager = Manager()
    trainer._setup = lambda: setattr(trainer, "checkpoint_manager", manager)
    trainer.global_steps = 1
    run_like_fit(trainer)
    assert calls == ["update", *["sleep", "update"] * STEPS]  # verl's own calls, as verl makes them


def test_jobs_of_one_process_register_the_trainers_at_once() -> None:
    """Two jobs' threads register the trainers together: one set of classes
    is made and registered, and neither thread is refused."""
    from verl.trainer.ppo.v1.trainer_base import TRAINER_REGISTRY

    from timeshare.integrations import verl as integration

    integration._registered_trainers.cache_clear()
    for name in integration.MODES:
        TRAINER_REGISTRY.pop(name, None)
    start = threading.Barrier(8)
    got: list[type[Any]] = []
    errors: list[BaseException] = []

    def register() -> None:
        start.wait()
        try:
            got.append(integration.register_trainers()["timeshare_sync"])
        except BaseException as error:
            errors.append(error)

    threads = [threading.Thread(target=register) for _ in range(8)]
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # threads switch inside the registration, as under load
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
    finally:
        sys.setswitchinterval(interval)
    assert not errors, errors
    assert len(got) == 8 and all(cls is TRAINER_REGISTRY["timeshare_sync"] for cls in got)
