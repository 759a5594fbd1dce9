"""SkyRL taking turns at its inference engines' own sleep and wake.

SkyRL (NovaSky-AI/SkyRL, skyrl 0.4.0) drives its inference engines through
one client of ``InferenceEngineInterface``
(skyrl/backends/skyrl_train/inference_servers/base.py: async ``sleep`` and
``wake_up``). With the trainer and the engines colocated
(``trainer.placement.colocate_all``) its trainer puts the engines to sleep
once a step's generation is done (skyrl/train/trainer.py), and its worker
dispatch wakes them, weights first and then the KV cache, to sync the new
weights before the next generation
(skyrl/backends/skyrl_train/workers/worker_dispatch.py).

Wrap the client where the entry point builds it, before the trainer gets it:

    from timeshare.integrations import skyrl as timeshare_skyrl

    inference_engine_client = timeshare_skyrl.inference_client(client)

The job hands its turn over when the engines have gone to sleep (a ``train``
turn begins: the policy and critic updates) and before they wake (a
``rollout`` turn begins: the weight sync and the generation). A switch at
either point moves only what SkyRL left on the device. The wrapper forwards
every other call; with ``TIMESHARE_GROUP``/``TIMESHARE_JOB`` unset it only
forwards. The turn calls block, so they run in a thread off the event loop.
"""

from __future__ import annotations

import asyncio
from typing import Any

from timeshare.integrations.release_points import entering
from timeshare.integrations.turns import Turns

ROLLOUT, TRAIN = "rollout", "train"


class TurnTakingInferenceClient:
    """An InferenceEngineInterface whose ``sleep`` and ``wake_up`` take turns."""

    def __init__(self, target: Any, turns: Turns | None = None) -> None:
        self.target = target
        self.turns = turns

    def __getattr__(self, name: str) -> Any:
        if name in ("target", "turns") or name.startswith("__"):
            raise AttributeError(name)
        return getattr(self.target, name)

    async def sleep(self, *args: Any, **kwargs: Any) -> Any:
        result = await self.target.sleep(*args, **kwargs)
        await asyncio.to_thread(entering, TRAIN, self.turns)
        return result

    async def wake_up(self, *args: Any, **kwargs: Any) -> Any:
        await asyncio.to_thread(entering, ROLLOUT, self.turns)
        return await self.target.wake_up(*args, **kwargs)


def inference_client(client: Any, turns: Turns | None = None) -> TurnTakingInferenceClient:
    """SkyRL's inference engine client, taking turns (``turns``: this
    process's, from the environment, by default)."""
    return TurnTakingInferenceClient(client, turns)
