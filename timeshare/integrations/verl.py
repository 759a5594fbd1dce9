"""verl's v1 PPO trainers taking turns, selected by name in the config:

    python -m verl.trainer.main_ppo ... trainer.use_v1=True \\
        trainer.v1.trainer_mode=timeshare_sync \\
        +ray_kwargs.ray_init.runtime_env.worker_process_setup_hook=timeshare.integrations.verl.setup_ray_worker

The setup hook (Ray runs it in every worker process of the job, before any
task) adds ``timeshare_sync`` and ``timeshare_colocate_async`` to verl's
trainer registry (``register_trainer``, verl/trainer/ppo/v1/trainer_base.py,
v0.9.1), so that ``TaskRunnerV1`` finds them by ``trainer.v1.trainer_mode``.
Each is verl's own trainer (``PPOTrainerSync``, ``PPOTrainerColocateAsync``)
with its hooks bracketed; nothing of verl is patched. ``TIMESHARE_GROUP`` and
``TIMESHARE_JOB`` (in ``runtime_env.env_vars``) name the job; without them
the trainers do exactly what verl's do.

Turns, at the v1 trainer's own hook points (``PPOTrainer.fit`` and
``_step_once`` call them):

- ``setup``: ``init()``, where the worker groups start and load the models
  and ``on_init_end`` pushes the weights to the rollout replicas, through the
  validation before training, up to the first step;
- ``rollout``: from ``on_step_end`` (the previous step's), before verl's
  ``update_weights`` wakes the replicas and syncs the new weights, through
  the validation, metrics and logging after it and sampling the next batch
  from the replay buffer (the agent loop's generation, and the reward loop
  that scores as samples finish), to ``on_sample_end``, after verl has put
  the colocated replicas to sleep (``CheckpointEngineManager.sleep_replicas``:
  weights and KV cache freed);
- ``train``: from there through old/reference log-probabilities, advantages,
  the critic and actor updates and the checkpoint save, to ``on_step_end``.

Both hand-overs find the replicas asleep: a switch moves only the training
engines' state. The job leaves its group when ``fit()`` returns or raises,
and when the process exits or is sent SIGTERM.

The hybrid engine's own sleep/wake moves the rollout weights: with
``rollout_hooks=True`` (env ``TIMESHARE_HOOKS=1``) the trainer serves workload
hooks that, when the turn moves to another job while the replicas are awake,
put them to sleep with verl's own call and, when it comes back, wake them
with ``update_weights`` (plus ``abort``/``resume_generation`` for the
colocated-async trainer, as its own hooks do), so the agent (``app+cuda``)
moves only what is left. The hooks are served from the process running the
trainer (``TaskRunnerV1``), to the agent of its node.
"""

from __future__ import annotations

import functools
import logging
import os
import threading
from typing import Any

from timeshare.hooks import WorkloadHooks
from timeshare.hooks.protocol import EvictMode
from timeshare.integrations.environment import turns_from_env
from timeshare.integrations.release_points import entering
from timeshare.integrations.turns import Turns

log = logging.getLogger("timeshare.integrations.verl")
SETUP, ROLLOUT, TRAIN = "setup", "rollout", "train"
# Our trainer's name -> verl's trainer it brackets. verl branches on the mode's
# name ("sync" or not) in its replay buffer and checkpoints, so the trainers
# run under the base name.
MODES = {"timeshare_sync": "sync", "timeshare_colocate_async": "colocate_async"}
TESTED_VERSIONS = ("0.9.1",)
# The v1 trainer hooks bracketed here; their absence means a verl these
# trainers were not written for.
HOOKS = ("init", "fit", "on_init_end", "on_step_begin", "on_sample_end", "on_step_end")


class ReplicaHooks(WorkloadHooks):
    """verl's own sleep and wake of the rollout replicas, when the turn moves."""

    def __init__(self, trainer: Any, partial_rollout: bool) -> None:
        self.trainer = trainer
        self.partial_rollout = partial_rollout
        self._slept = False

    def evict(self, mode: EvictMode) -> None:
        if not self.trainer.replicas_awake:
            return  # verl put them to sleep itself (on_sample_end)
        manager = self.trainer.checkpoint_manager
        if self.partial_rollout:
            manager.abort_replicas()
        manager.sleep_replicas()
        self.trainer.replicas_awake = False
        self._slept = True

    def admit(self) -> None:
        if not self._slept:
            return
        manager = self.trainer.checkpoint_manager
        # Sleeping discards the replicas' weights: waking is a weight sync.
        manager.update_weights(self.trainer.global_steps)
        if self.partial_rollout:
            manager.resume_generation_replicas()
        self.trainer.replicas_awake = True
        self._slept = False


def trainer_with_turns(base: type[Any], mode: str) -> type[Any]:
    """``base`` (a verl v1 PPOTrainer) with its phases bracketed by turns."""
    missing = [hook for hook in HOOKS if not callable(getattr(base, hook, None))]
    if missing:
        raise TypeError(
            f"{base.__name__} has no {', '.join(missing)}: this verl is not one the timeshare "
            f"trainers were written for (tested: {', '.join(TESTED_VERSIONS)})"
        )

    class TimeshareTrainer(base):  # type: ignore[misc]
        def __init__(
            self, config: Any, turns: Turns | None = None, rollout_hooks: bool | None = None
        ) -> None:
            config.trainer.v1.trainer_mode = mode
            self.timeshare_turns = turns if turns is not None else turns_from_env()
            if rollout_hooks is None:
                rollout_hooks = os.environ.get("TIMESHARE_HOOKS") == "1"
            self.rollout_hooks = rollout_hooks
            # Whether the rollout replicas hold their weights on the device now.
            self.replicas_awake = False
            super().__init__(config)

        def init(self) -> None:
            self.timeshare_turns.acquire(SETUP)
            if self.rollout_hooks and self.timeshare_turns.enabled:
                self._serve_replica_hooks()
            super().init()

        def _serve_replica_hooks(self) -> None:
            from timeshare.hooks import serve_hooks

            turns: Any = self.timeshare_turns
            hooks = ReplicaHooks(self, partial_rollout=mode != "sync")
            # This process drives the replicas; it is not itself a GPU process.
            self.timeshare_hook_server = serve_hooks(
                hooks, turns.job.group, turns.job.name, register=False, token=turns.job.token
            )

        def on_init_end(self) -> None:
            super().on_init_end()
            self.replicas_awake = True

        def fit(self, *args: Any, **kwargs: Any) -> Any:
            try:
                return super().fit(*args, **kwargs)
            finally:
                self.leave_group()

        def on_step_begin(self) -> None:
            super().on_step_begin()
            # The first step's; later ones began at the previous on_step_end.
            entering(ROLLOUT, self.timeshare_turns)

        def on_sample_end(self) -> None:
            super().on_sample_end()
            self.replicas_awake = False
            self.timeshare_turns.handover(TRAIN)

        def on_step_end(self) -> None:
            # Before update_weights wakes the replicas: a switch here finds
            # them asleep.
            self.timeshare_turns.handover(ROLLOUT)
            super().on_step_end()
            self.replicas_awake = True

        def leave_group(self) -> None:
            """Give the last turn back and leave the group."""
            self.timeshare_turns.close()

    TimeshareTrainer.__name__ = TimeshareTrainer.__qualname__ = f"Timeshare{base.__name__}"
    return TimeshareTrainer


# verl refuses a second class under a name taken: two threads registering at
# once (two jobs of one process) must not both make the classes.
_REGISTERING = threading.Lock()


def register_trainers() -> dict[str, type[Any]]:
    """Add the timeshare trainers to verl's v1 trainer registry; returns them by name."""
    with _REGISTERING:
        return _registered_trainers()


@functools.cache
def _registered_trainers() -> dict[str, type[Any]]:
    import verl
    from verl.trainer.ppo.v1 import PPOTrainerColocateAsync, PPOTrainerSync, register_trainer

    version = getattr(verl, "__version__", "unknown")
    if version not in TESTED_VERSIONS:
        log.warning("timeshare: verl %s; the trainers were tested with %s", version,
                    ", ".join(TESTED_VERSIONS))  # fmt: skip
    bases = {"sync": PPOTrainerSync, "colocate_async": PPOTrainerColocateAsync}
    trainers = {name: trainer_with_turns(bases[mode], mode) for name, mode in MODES.items()}
    for name, trainer in trainers.items():
        register_trainer(name)(trainer)
    return trainers


def setup_ray_worker() -> None:
    """A Ray ``worker_process_setup_hook``: the timeshare trainers are found
    by name in whichever worker runs verl's TaskRunner."""
    register_trainers()
