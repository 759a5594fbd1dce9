"""SkyRL taking turns at its inference engines' own sleep and wake-up.

SkyRL (NovaSky-AI/SkyRL, skyrl 0.4.0) drives its inference engines through
one client, a ``RemoteInferenceClient``
(skyrl/backends/skyrl_train/inference_servers/remote_inference_client.py:
async ``sleep`` and ``wake_up``). With the trainer and the engines colocated
(``trainer.placement.colocate_all``) its trainer puts the engines to sleep
once a step's generation is done (skyrl/train/trainer.py), and its worker
dispatch's weight sync (``save_weights_for_sampler``,
skyrl/backends/skyrl_train/workers/worker_dispatch.py) wakes their weights,
broadcasts the policy's, offloads the policy, then wakes their KV cache.

Run SkyRL's entry point through this module, which is SkyRL's own
``BasePPOExp`` with the turns added:

    python -m skyrl.train.entrypoints.main_base ... \\
        trainer.override_entrypoint=timeshare.integrations.skyrl

(or subclass ``experiment_class()`` where you subclass BasePPOExp).

Turns: ``setup`` from the inference engines' start through the models'
build, the weight-sync setup and the first weight push; ``rollout`` from the
KV cache's wake-up through generation to the engines' sleep; ``train`` from
that sleep through the policy and critic updates, the checkpoint saves and
the weight sync, to the next KV-cache wake-up. The switch into ``rollout``
sits after the weight sync has offloaded the policy and before the KV cache
comes back: the device holds only the engines' weights. The switch into
``train`` finds the engines asleep and the trainer's models offloaded.

The client stays a RemoteInferenceClient (a subclass made from the client's
own class), so SkyRL's ``isinstance`` checks, which choose LoRA weight sync
on the policy workers, still hold; copies that Ray ships to other processes
only forward. The job leaves its group when ``run()`` ends, and when the
process exits or is sent SIGTERM.
"""

from __future__ import annotations

import asyncio
import functools
import threading
from typing import Any

from timeshare.integrations.release_points import entering, process_turns, setup_turn
from timeshare.integrations.turns import Turns

__all__ = ["experiment_class", "inference_client", "main", "setup_turn", "turn_taking_class"]

ROLLOUT, TRAIN = "rollout", "train"
# The wake-up that begins a rollout turn: anything but the weights alone
# (those are woken for the weight sync, still in the train turn).
WEIGHTS_ONLY = ["weights"]


_classes: dict[type[Any], type[Any]] = {}
_classes_guard = threading.Lock()


def turn_taking_class(base: type[Any]) -> type[Any]:
    """``base`` (SkyRL's client class) with ``sleep`` and ``wake_up`` taking
    turns; one per base, so that isinstance and pickling see one class."""
    with _classes_guard:
        if base not in _classes:
            _classes[base] = _make_turn_taking(base)
        return _classes[base]


def _make_turn_taking(base: type[Any]) -> type[Any]:
    class TurnTaking(base):  # type: ignore[misc]
        _timeshare_turns: Turns | None = None
        _timeshare_forward_only = False

        async def sleep(self, *args: Any, **kwargs: Any) -> Any:
            result = await super().sleep(*args, **kwargs)
            if not self._timeshare_forward_only:
                await asyncio.to_thread(entering, TRAIN, self._timeshare_turns)
            return result

        async def wake_up(self, *args: Any, **kwargs: Any) -> Any:
            tags = kwargs.get("tags", args[0] if args else None)
            if not self._timeshare_forward_only and list(tags or []) != WEIGHTS_ONLY:
                await asyncio.to_thread(entering, ROLLOUT, self._timeshare_turns)
            return await super().wake_up(*args, **kwargs)

        def __reduce__(self) -> tuple[Any, ...]:
            given: Any = self.__getstate__()
            state: dict[str, Any] = dict(given or {})
            state = {k: v for k, v in state.items() if not k.startswith("_timeshare_")}
            return (_forwarding_copy, (base, state))

    TurnTaking.__name__ = TurnTaking.__qualname__ = f"TurnTaking{base.__name__}"
    return TurnTaking


def _forwarding_copy(base: type[Any], state: dict[str, Any]) -> Any:
    """A copy in another process (a policy worker): still the client's class,
    forwarding only; the turns stay with the process that wrapped it."""
    cls = turn_taking_class(base)
    client: Any = object.__new__(cls)
    if callable(getattr(client, "__setstate__", None)):
        client.__setstate__(state)
    else:
        vars(client).update(state)
    client._timeshare_forward_only = True
    return client


def inference_client(client: Any, turns: Turns | None = None) -> Any:
    """SkyRL's inference engine client, taking turns (``turns``: this
    process's, from the environment, by default); an instance of the client's
    own class still."""
    cls = turn_taking_class(type(client))
    wrapped: Any = object.__new__(cls)
    vars(wrapped).update(vars(client))
    wrapped._timeshare_turns = turns
    return wrapped


@functools.cache
def experiment_class() -> type[Any]:
    """SkyRL's BasePPOExp with the turns (imported on first use)."""
    from skyrl.train.entrypoints.main_base import BasePPOExp

    class TimeshareExp(BasePPOExp):  # type: ignore[misc]
        def get_inference_client(self) -> Any:
            # The engines start and load their weights here: the setup turn begins.
            setup_turn()
            return inference_client(super().get_inference_client())

        def run(self) -> None:
            try:
                super().run()
            finally:
                process_turns().close()

    return TimeshareExp


def main() -> None:
    """SkyRL's main (skyrl.train.entrypoints.main_base) with TimeshareExp:
    what ``trainer.override_entrypoint=timeshare.integrations.skyrl`` runs."""
    import sys

    import ray
    from skyrl.train.config import SkyRLTrainConfig
    from skyrl.train.utils import validate_cfg
    from skyrl.train.utils.utils import initialize_ray

    cfg = SkyRLTrainConfig.from_cli_overrides(
        [arg for arg in sys.argv[1:] if not arg.startswith("trainer.override_entrypoint=")]
    )
    validate_cfg(cfg)
    initialize_ray(cfg)
    ray.get(_entrypoint().remote(cfg))


@functools.cache
def _entrypoint() -> Any:
    import ray

    def timeshare_skyrl_entrypoint(cfg: Any) -> None:
        experiment_class()(cfg).run()

    return ray.remote(num_cpus=1)(timeshare_skyrl_entrypoint)
