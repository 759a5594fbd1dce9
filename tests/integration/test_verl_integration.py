"""verl's real v1 trainers (verl 0.9.1 from PyPI, its own default config)
with timeshare's turns, against a real scheduler and gateway (sim nodes).

What runs for real: verl's trainer registry and ``PPOTrainer.fit``,
``step`` and ``_step_once`` (its loop, the order of its hooks, its
validation and checkpoint calls), with the timeshare trainers' hooks. What
does not: the data plane on GPU workers. ``_setup`` (Ray worker groups, vLLM
servers) is replaced by a recorder of CheckpointEngineManager's methods that
verl's hooks call (verl/checkpoint_engine/base.py: sleep_replicas,
update_weights, abort_replicas, resume_generation_replicas), and the steps
that run on the workers (sampling the replay buffer, log-probabilities,
advantages, the critic and actor updates, validation, the checkpoint save)
by recorders; TransferQueue's client calls in fit() see an empty store.
Every recorder notes who held the group's turn, and for which phase."""

from __future__ import annotations

import itertools
import sys
import threading
from types import SimpleNamespace
from typing import Any

import pytest

import timeshare
from tests.conftest import SimNodes
from tests.job_threads import run_jobs_together
from timeshare.integrations.turns import JobTurns

verl_v1 = pytest.importorskip("verl.trainer.ppo.v1")
STEPS = 2
Calls = list[tuple[str, str, str, str]]  # (job, call, holder, holder's phase)
# The work verl's fit() and _step_once() give the GPU workers.
WORKER_STEPS = (
    "_balance_batch",
    "_compute_old_log_prob",
    "_compute_ref_log_prob",
    "_compute_values",
    "_compute_advantage",
    "_update_critic",
    "_update_actor",
)


class Recorder:
    def __init__(self, client: timeshare.Client, group: str, job: str, calls: Calls) -> None:
        self.client, self.group, self.job, self.calls = client, group, job, calls

    def __call__(self, call: str) -> None:
        status = self.client.get_group(self.group)
        self.calls.append((self.job, call, status.holder, status.holder_phase))


class RecordingCheckpointManager:
    """What verl's trainer hooks ask of the rollout replicas."""

    def __init__(self, record: Recorder) -> None:
        self.record = record

    def sleep_replicas(self) -> None:
        self.record("sleep_replicas")

    def update_weights(self, global_steps: int | None = None) -> None:
        self.record("update_weights")

    def abort_replicas(self) -> None:
        self.record("abort_replicas")

    def resume_generation_replicas(self) -> None:
        self.record("resume_generation_replicas")


class ReplayBuffer:
    def __init__(self, record: Recorder) -> None:
        self.record = record

    def sample(
        self, global_steps: int, partition_id: str, batch_size: int
    ) -> tuple[Any, dict[str, Any]]:
        from transfer_queue import KVBatchMeta

        self.record("sample")
        return KVBatchMeta(partition_id=partition_id), {}


@pytest.fixture(scope="module")
def verl_config() -> Any:
    from hydra import compose, initialize_config_module

    with initialize_config_module("verl.trainer.config", version_base=None):
        return compose(
            "ppo_trainer",
            overrides=["trainer.use_v1=True", "trainer.logger=[console]", "trainer.test_freq=1",
                       "trainer.save_freq=1", f"trainer.total_training_steps={STEPS}"],
        )  # fmt: skip


@pytest.fixture
def empty_transfer_queue(monkeypatch: pytest.MonkeyPatch) -> None:
    """fit()'s TransferQueue client calls, on a store that holds nothing."""
    from verl.trainer.ppo.v1 import trainer_base

    store = SimpleNamespace(kv_clear=lambda **kwargs: None, kv_list=lambda *args: {})
    monkeypatch.setattr(trainer_base, "tq", store)


def make_trainer(name: str, config: Any, turns: Any, record: Recorder) -> Any:
    """The registered timeshare trainer, its GPU workers replaced by recorders."""
    from timeshare.integrations.verl import register_trainers

    register_trainers()

    class OnRecorders(verl_v1.get_trainer_cls(name)):  # type: ignore[misc]
        def _setup(self) -> None:
            record("setup")
            self._init_dump_executor()
            self.checkpoint_manager = RecordingCheckpointManager(record)
            self.replay_buffer = ReplayBuffer(record)
            self.reward_loop_manager = SimpleNamespace(reward_loop_worker_handles=[])
            self.total_training_steps, self.steps_per_epoch, self.global_steps = STEPS, STEPS, 0

        def prepare_step(self) -> dict[str, Any]:
            return {}

        def _add_prompts_to_generate(self, num_prompts: int) -> int:
            return num_prompts

        def _validate(self) -> dict[str, float]:
            record("validate")
            return {"val/score": 0.0}

        def _save_checkpoint(self) -> None:
            record("save_checkpoint")

        def _compute_metrics(self, *args: Any, **kwargs: Any) -> None:
            return None

    def worker_step(name: str) -> Any:
        def run(self: Any, batch: Any, *args: Any, **kwargs: Any) -> Any:
            record(name)
            return batch

        return run

    for step in WORKER_STEPS:
        setattr(OnRecorders, step, worker_step(step))
    return OnRecorders(config.copy(), turns=turns)


@pytest.mark.parametrize("mode", ["sync", "colocate_async"])
async def test_verl_fit_takes_turns_at_its_own_hooks(
    gateway: str, sim_nodes: SimNodes, unique: str, verl_config: Any, mode: str,
    empty_transfer_queue: None,
) -> None:  # fmt: skip
    node, group = f"n-{unique}", f"verl-{unique}"
    await sim_nodes.start(node)
    calls: Calls = []
    records: dict[str, JobTurns] = {}

    def job(name: str) -> None:
        with timeshare.connect(gateway) as client:
            turns = records[name] = JobTurns(client.join(group, name, nodes=[node]))
            trainer = make_trainer(f"timeshare_{mode}", verl_config, turns, Recorder(
                client, group, name, calls))  # fmt: skip
            assert isinstance(trainer, verl_v1.get_trainer_cls(mode))
            assert trainer.trainer_mode == mode  # verl's own branches see its own mode
            trainer.init()
            trainer.fit(agent_loop_manager=None)
            # fit() left the group, giving back its last turn.
            assert name not in [j.job for j in client.get_group(group).jobs]

    await run_jobs_together(job, ["job-a", "job-b"])
    for name, turns in records.items():
        phases = [record.phase for record in turns.records]
        assert phases == ["setup", *["rollout", "train"] * STEPS, "rollout"], (name, phases)
    # Everything verl asked of the replicas and workers ran inside the job's own turn ...
    assert calls and all(holder == job for job, _, holder, _ in calls), calls
    phase_of = {(name, call): phase for name, call, _, phase in calls if call != "update_weights"}
    for name in records:
        # ... the weights pushed at init in the setup turn, later ones (which wake the
        # replicas) at the start of a rollout turn: the switch before them found the
        # replicas asleep; the replicas put to sleep at the end of the rollout turn.
        weights = [phase for j, call, _, phase in calls if j == name and call == "update_weights"]
        assert weights == ["setup", *["rollout"] * STEPS], (name, weights)
        assert phase_of[name, "sample"] == phase_of[name, "sleep_replicas"] == "rollout"
        ran = [step for step in WORKER_STEPS if (name, step) in phase_of]
        assert "_update_actor" in ran and all(phase_of[name, s] == "train" for s in ran), phase_of
        assert phase_of[name, "save_checkpoint"] == "train"
    expected = {"sync": {"sleep_replicas", "update_weights"},
                "colocate_async": {"sleep_replicas", "update_weights", "abort_replicas",
                                   "resume_generation_replicas"}}[mode]  # fmt: skip
    assert {call for _, call, _, _ in calls} & set(expected) == expected
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
    verl_config: Any, monkeypatch: pytest.MonkeyPatch, empty_transfer_queue: None
) -> None:
    for variable in ("TIMESHARE_GROUP", "TIMESHARE_JOB", "TIMESHARE_TURNS_FD"):
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.setenv("TIMESHARE_ADDRESS", "127.0.0.1:1")  # any call would fail
    from timeshare.integrations.environment import turns_from_env

    calls: list[str] = []

    class Recording(Recorder):
        def __init__(self) -> None:
            pass

        def __call__(self, call: str) -> None:
            calls.append(call)

    trainer = make_trainer("timeshare_sync", verl_config, turns_from_env(), Recording())
    assert not trainer.timeshare_turns.enabled
    trainer.init()
    trainer.fit(agent_loop_manager=None)
    # verl's own calls, as verl makes them
    assert [c for c in calls if c in ("sleep_replicas", "update_weights")] == [
        "update_weights", *["sleep_replicas", "update_weights"] * STEPS]  # fmt: skip


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
