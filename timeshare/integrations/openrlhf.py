"""OpenRLHF taking turns at its own sleep, wake and offload calls.

OpenRLHF (OpenRLHF/OpenRLHF, v0.11.2) has no callback API. With
``--vllm.enable_sleep`` and ``--ds.enable_sleep`` (the colocated hybrid
engine) it releases its own GPU memory at each phase's end:

- ``SamplesGenerator.generate_samples`` calls ``batch_vllm_engine_call(engines,
  "wake_up")`` before generating and ``"sleep"`` after
  (openrlhf/trainer/ppo_utils/samples_generator.py); ``broadcast_to_vllm``
  wakes the weights only (``tags=["weights"]``) to sync them;
- ``PPOTrainer.ppo_train`` runs each model group's ``reload_states``, ``fit``
  and ``offload_states`` through ``RayActorGroup.async_run_method``
  (openrlhf/trainer/ppo_trainer.py), which offload the DeepSpeed model and
  optimizer states (``offload_deepspeed_states``).

Wrap the engine handles and the model groups where the launch script builds
them (openrlhf/cli/train_ppo_ray.py), and the turns follow those calls:

    from timeshare.integrations import openrlhf as timeshare_openrlhf

    vllm_engines = timeshare_openrlhf.engines(create_vllm_engines(...))
    actor_model = timeshare_openrlhf.model_group(RayActorGroup(...))
    critic_model = timeshare_openrlhf.model_group(RayActorGroup(...))

The job hands its turn over when every engine has gone to sleep (a ``train``
turn begins: experience making, the models' updates) and when a model group
has offloaded its states (a ``rollout`` turn begins: the weight sync and the
next generation). A switch there moves only what OpenRLHF left on the device;
its own release is the hook. The wrappers pickle (Ray sends them to the
trainer's actor) and take their turns in the process that calls them; with
``TIMESHARE_GROUP``/``TIMESHARE_JOB`` unset there they only forward.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from timeshare.integrations.release_points import entering, wait
from timeshare.integrations.turns import Turns

ROLLOUT, TRAIN = "rollout", "train"
OWN = ("target", "engines", "turns")


class _Asleep:
    """Which engines of one set are asleep: the set's turn is handed over when all are."""

    def __init__(self, size: int, turns: Turns | None) -> None:
        self.size = size
        self.turns = turns
        self.asleep: set[int] = set()
        self._guard = threading.Lock()

    def __getstate__(self) -> dict[str, Any]:
        # Turns stay in their process: the receiving process takes its own.
        return {"size": self.size, "asleep": set(self.asleep)}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.size, self.asleep, self.turns = state["size"], state["asleep"], None
        self._guard = threading.Lock()

    def woke(self, index: int) -> None:
        entering(ROLLOUT, self.turns)
        with self._guard:
            self.asleep.discard(index)

    def slept(self, index: int) -> None:
        with self._guard:
            self.asleep.add(index)
            everyone = len(self.asleep) == self.size
        if everyone:
            entering(TRAIN, self.turns)


class _Call:
    """A Ray actor method (``.remote(...)``) with something done before or after it."""

    def __init__(self, method: Any, before: Callable[[], None] | None = None,
                 after: Callable[[], None] | None = None) -> None:  # fmt: skip
        self.method, self.before, self.after = method, before, after

    def remote(self, *args: Any, **kwargs: Any) -> Any:
        if self.before is not None:
            self.before()
        result = self.method.remote(*args, **kwargs)
        if self.after is not None:
            wait(result)  # the memory is free only once the call is done
            self.after()
        return result


class TurnTakingEngine:
    """A vLLM engine actor handle whose ``wake_up`` and ``sleep`` take turns."""

    def __init__(self, target: Any, engines: _Asleep, index: int) -> None:
        self.target, self.engines, self.index = target, engines, index

    def __getattr__(self, name: str) -> Any:
        if name in OWN or name.startswith("__"):
            raise AttributeError(name)
        method = getattr(self.target, name)
        if name == "wake_up":
            return _Call(method, before=lambda: self.engines.woke(self.index))
        if name == "sleep":
            return _Call(method, after=lambda: self.engines.slept(self.index))
        return method


def engines(vllm_engines: list[Any] | None, turns: Turns | None = None) -> list[Any] | None:
    """OpenRLHF's vLLM engine handles (create_vllm_engines), taking turns
    (``turns``: the calling process's, from the environment, by default)."""
    if vllm_engines is None:
        return None
    asleep = _Asleep(len(vllm_engines), turns)
    return [TurnTakingEngine(engine, asleep, i) for i, engine in enumerate(vllm_engines)]


class TurnTakingModelGroup:
    """A RayActorGroup whose ``reload_states``/``offload_states`` runs take turns."""

    def __init__(self, target: Any, turns: Turns | None = None) -> None:
        self.target = target
        self.turns = turns

    def __getstate__(self) -> dict[str, Any]:
        return {"target": self.target}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.target, self.turns = state["target"], None

    def __getattr__(self, name: str) -> Any:
        if name in OWN or name.startswith("__"):
            raise AttributeError(name)
        return getattr(self.target, name)

    def async_run_method(self, method_name: str, *args: Any, **kwargs: Any) -> Any:
        if method_name == "reload_states":
            entering(TRAIN, self.turns)
        result = self.target.async_run_method(method_name, *args, **kwargs)
        if method_name == "offload_states":
            wait(result)
            entering(ROLLOUT, self.turns)
        return result


def model_group(group: Any, turns: Turns | None = None) -> Any:
    """An OpenRLHF RayActorGroup (actor, critic, reference, reward), taking turns."""
    return None if group is None else TurnTakingModelGroup(group, turns)
