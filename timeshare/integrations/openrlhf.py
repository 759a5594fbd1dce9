"""OpenRLHF taking turns at its own sleep and wake-up calls.

OpenRLHF (OpenRLHF/OpenRLHF, v0.11.2) has no callback API. With
``--vllm.enable_sleep`` and ``--ds.enable_sleep`` (the colocated hybrid
engine) it releases its own GPU memory at each phase's end:

- ``SamplesGenerator.generate_samples`` calls ``batch_vllm_engine_call(engines,
  "wake_up")`` before generating and ``"sleep"`` after
  (openrlhf/trainer/ppo_utils/samples_generator.py);
- ``PPOTrainer.ppo_train`` runs each model group's ``reload_states``, ``fit``
  and ``offload_states`` (critic, then actor) through
  ``RayActorGroup.async_run_method`` (openrlhf/trainer/ppo_trainer.py);
- ``broadcast_to_vllm`` then wakes the engines' weights only
  (``wake_up(tags=["weights"])``) to sync them.

Wrap the engines and the model groups where the launch script builds them
(openrlhf/cli/train_ppo_ray.py), after taking the setup turn:

    from timeshare.integrations import openrlhf as timeshare_openrlhf

    timeshare_openrlhf.setup_turn()
    vllm_engines = timeshare_openrlhf.engines(create_vllm_engines(...),
                                              enable_sleep=args.vllm.enable_sleep)
    actor_model = timeshare_openrlhf.model_group(RayActorGroup(...))
    critic_model = timeshare_openrlhf.model_group(RayActorGroup(...))

Turns: ``setup`` from there (engines start, models load) to the first
wake-up; ``rollout`` from each wake-up (the weight sync's, after ppo_train
has offloaded every model group, or generation's) through generation to the
engines' sleep; ``train`` from the moment every engine is asleep (all sleeps
run at once, as OpenRLHF issues them) through experience making and
ppo_train to the next wake-up. Nothing is handed over inside ppo_train: a
switch between the critic's offload and the actor's reload would move the
actor's states for nothing. Both switches find OpenRLHF's own memory
released. Without ``--vllm.enable_sleep`` the engines never sleep: the job
holds its setup turn for the whole run, and says so in one warning line.

The wrappers pickle (Ray sends them to the trainer's actor) with a ticket of
the job's turns (timeshare.integrations.turns.TurnTicket): that actor takes
the job's turns on from the driver, without joining again. With
``TIMESHARE_GROUP``/``TIMESHARE_JOB`` unset they only forward. The job
leaves its group when the driver exits, crashes or is sent SIGTERM.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from timeshare.integrations.release_points import adopt, entering, setup_turn, ticket_of, wait
from timeshare.integrations.turns import Turns

__all__ = ["engines", "model_group", "setup_turn"]
log = logging.getLogger("timeshare.integrations.openrlhf")
ROLLOUT, TRAIN = "rollout", "train"
OWN = ("target", "engines", "turns", "index")
NO_SLEEP_WARNING = (
    "timeshare: OpenRLHF without --vllm.enable_sleep: its engines never sleep, so this job "
    "holds its turn for the whole run (add --vllm.enable_sleep --ds.enable_sleep to take turns)"
)


class _Asleep:
    """One set of engines: the turn is handed over once all of them are asleep."""

    def __init__(self, size: int, turns: Turns | None) -> None:
        self.size = size
        self.turns = turns
        self.sleeping: dict[int, Any] = {}  # engine -> its sleep call's result
        self._guard = threading.Lock()

    def __getstate__(self) -> dict[str, Any]:
        # Turns stay in their process: the receiving process takes them on.
        return {"size": self.size, "ticket": ticket_of(self.turns)}

    def __setstate__(self, state: dict[str, Any]) -> None:
        adopt(state["ticket"])
        self.size, self.turns, self.sleeping = state["size"], None, {}
        self._guard = threading.Lock()

    def woke(self, index: int) -> None:
        entering(ROLLOUT, self.turns)
        with self._guard:
            self.sleeping.pop(index, None)

    def slept(self, index: int, result: Any) -> None:
        """Engine ``index``'s sleep was sent: once every engine's is, wait for
        them all (they run at once) and hand the turn over."""
        with self._guard:
            self.sleeping[index] = result
            everyone = len(self.sleeping) == self.size
            results = list(self.sleeping.values()) if everyone else []
        if everyone:
            for result in results:
                wait(result)  # the memory is free only once the calls are done
            entering(TRAIN, self.turns)


class _Call:
    """A Ray actor method (``.remote(...)``) with something done before or after sending it."""

    def __init__(self, method: Any, before: Any = None, sent: Any = None) -> None:
        self.method, self.before, self.sent = method, before, sent

    def remote(self, *args: Any, **kwargs: Any) -> Any:
        if self.before is not None:
            self.before()
        result = self.method.remote(*args, **kwargs)
        if self.sent is not None:
            self.sent(result)
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
            return _Call(method, sent=lambda result: self.engines.slept(self.index, result))
        return method


def engines(
    vllm_engines: list[Any] | None, turns: Turns | None = None, enable_sleep: bool = True
) -> list[Any] | None:
    """OpenRLHF's vLLM engine handles (create_vllm_engines), taking turns
    (``turns``: the calling process's, from the environment, by default).
    ``enable_sleep``: OpenRLHF's ``args.vllm.enable_sleep``."""
    if vllm_engines is None:
        return None
    if not enable_sleep:
        log.warning(NO_SLEEP_WARNING)
    asleep = _Asleep(len(vllm_engines), turns)
    return [TurnTakingEngine(engine, asleep, i) for i, engine in enumerate(vllm_engines)]


class TurnTakingModelGroup:
    """A RayActorGroup whose ``reload_states`` runs inside a ``train`` turn."""

    def __init__(self, target: Any, turns: Turns | None = None) -> None:
        self.target = target
        self.turns = turns

    def __getstate__(self) -> dict[str, Any]:
        return {"target": self.target, "ticket": ticket_of(self.turns)}

    def __setstate__(self, state: dict[str, Any]) -> None:
        adopt(state["ticket"])
        self.target, self.turns = state["target"], None

    def __getattr__(self, name: str) -> Any:
        if name in OWN or name.startswith("__"):
            raise AttributeError(name)
        return getattr(self.target, name)

    def async_run_method(self, method_name: str, *args: Any, **kwargs: Any) -> Any:
        if method_name == "reload_states":
            # Already so after the engines' sleep; a run without vLLM begins its turn here.
            entering(TRAIN, self.turns)
        return self.target.async_run_method(method_name, *args, **kwargs)


def model_group(group: Any, turns: Turns | None = None) -> Any:
    """An OpenRLHF RayActorGroup (actor, critic, reference, reward), taking turns."""
    return None if group is None else TurnTakingModelGroup(group, turns)
