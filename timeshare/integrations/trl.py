"""TRL's GRPO trainer taking turns: change one import.

    from timeshare.integrations.trl import GRPOTrainer   # instead of: from trl import GRPOTrainer

    trainer = GRPOTrainer(model=..., reward_funcs=[...], args=GRPOConfig(...), ...)
    trainer.train()

With ``TIMESHARE_GROUP``/``TIMESHARE_JOB`` unset (and no coordinator) it
does exactly what TRL's class does: it adds no callback and wraps nothing.
Otherwise each optimisation step takes two turns (huggingface/trl,
trl/trainer/grpo_trainer.py, v1.16.0):

- ``rollout``: from the step's start (``TrainerCallback.on_step_begin``, a
  public hook of transformers' Trainer) through generation, vLLM colocate's
  own wake-up, weight sync and sleep (all inside ``_generate_single_turn``),
  and the old/reference log-probabilities, up to the first reward function;
- ``train``: from the last reward function's return through the advantages,
  the backward passes, the optimizer step, and the logging, saving and
  evaluation that follow ``on_step_end``, up to the next step's start.

Reward functions run with the turn given away: each one is wrapped (the
``reward_funcs`` argument is the public way to hand them in), so TRL's own
reward bookkeeping, which allocates on the device (``_calculate_rewards``),
stays inside the turns. A reward *model* (an ``nn.Module``) runs on the GPU
and stays inside the turn. Nothing of TRL is patched: a callback and wrapped
reward functions are all it takes.

The first turn (``setup``) starts before TRL's constructor, which places the
model on the device; the last is held until the job leaves (``leave_group()``,
else when the process exits, crashes or is sent SIGTERM), so a save after
``train()`` runs inside it.

With ``offload_hooks=True`` the process serves workload hooks that move the
policy, the reference model and the optimizer state to host memory when the
turn moves to another job (``--backend app+cuda``): the agent then moves only
what is left (the CUDA context, vLLM's sleeping pool). vLLM colocate with
``vllm_enable_sleep_mode=True`` releases its own weights and KV cache after
every generation (level 2), so the hooks leave it alone.
"""

from __future__ import annotations

import functools
import inspect
import json
from collections.abc import Callable
from typing import Any

from timeshare.hooks import WorkloadHooks
from timeshare.hooks.protocol import EvictMode
from timeshare.integrations.environment import turns_from_env
from timeshare.integrations.exits import leave_at_exit
from timeshare.integrations.turns import Turns

SETUP, ROLLOUT, TRAIN = "setup", "rollout", "train"
# What GRPOTrainer._calculate_rewards passes besides the data: the trainer's
# own objects, which cannot travel to a coordinator's process.
TRAINER_KWARGS = ("trainer_state", "log_extra", "log_metric", "environments")


class OffTurnReward:
    """A reward function that runs with the job's turn given away."""

    def __init__(self, func: Callable[..., Any], turns: Turns) -> None:
        self.func = func
        self.turns = turns
        # TRL names a reward function's metrics after it (get_callable_name).
        self.__name__ = getattr(func, "__name__", type(func).__name__)

    def __call__(self, **kwargs: Any) -> Any:
        if self.turns.remote:
            kwargs = portable_kwargs(self.__name__, kwargs)
        return self.turns.outside(self.func, kwargs, then=TRAIN)


def portable_kwargs(name: str, kwargs: dict[str, Any]) -> dict[str, Any]:
    data = {key: value for key, value in kwargs.items() if key not in TRAINER_KWARGS}
    for key, value in data.items():
        try:
            json.dumps(value)
        except (TypeError, ValueError):
            raise TypeError(
                f"reward function {name}: its argument {key!r} ({type(value).__name__}) cannot "
                "be sent to the coordinator, which runs the rewards; keep the dataset's extra "
                "columns to JSON values"
            ) from None
    return data


def off_turn_rewards(reward_funcs: Any, turns: Turns) -> Any:
    """``reward_funcs`` as GRPOTrainer takes them, each plain function wrapped
    to run off the turn; reward models (a string id or an ``nn.Module``) and
    async functions stay as they are, inside the turn."""
    if reward_funcs is None:
        return None
    funcs = reward_funcs if isinstance(reward_funcs, list) else [reward_funcs]
    return [_off_turn(func, turns) for func in funcs]


def _off_turn(func: Any, turns: Turns) -> Any:
    if isinstance(func, str) or _is_module(func) or _is_async(func):
        return func
    return OffTurnReward(func, turns)


def _is_module(func: Any) -> bool:
    import torch

    return isinstance(func, torch.nn.Module)


def _is_async(func: Any) -> bool:
    while isinstance(func, functools.partial):
        func = func.func
    return inspect.iscoroutinefunction(func) or inspect.iscoroutinefunction(
        getattr(func, "__call__", None)  # noqa: B004  # a callable object's own method
    )


def generates_at(step: int, args: Any) -> bool:
    """Whether optimisation step ``step`` (0-based) generates new completions:
    GRPOTrainer._prepare_inputs generates on every micro-step that is a
    multiple of steps_per_generation * num_iterations."""
    every: int = args.steps_per_generation * args.num_iterations
    micro_steps: int = args.gradient_accumulation_steps
    return (-(step * micro_steps)) % every < micro_steps


def turn_callback(turns: Turns) -> Any:
    """A transformers TrainerCallback that hands the turn over at each step's start."""
    from transformers import TrainerCallback

    class TurnCallback(TrainerCallback):  # type: ignore[misc]
        def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            turns.handover(ROLLOUT if generates_at(state.global_step, args) else TRAIN)

    return TurnCallback()


class TrainerOffloadHooks(WorkloadHooks):
    """The trainer's own device state (policy, reference model, optimizer
    state) to host memory and back, looked up at each eviction: the optimizer
    exists only once ``train()`` has started."""

    def __init__(self, trainer: Any) -> None:
        self.trainer = trainer
        self._moved: WorkloadHooks | None = None

    def evict(self, mode: EvictMode) -> None:
        from timeshare.hooks.torch_offload import TorchOffloadHooks

        if self._moved is not None:
            return
        models = [getattr(self.trainer, name, None) for name in ("model", "ref_model")]
        optimizer = getattr(self.trainer, "optimizer", None)
        hooks = TorchOffloadHooks(
            [m for m in models if m is not None], [optimizer] if optimizer is not None else []
        )
        hooks.evict(mode)
        self._moved = hooks

    def admit(self) -> None:
        if self._moved is not None:
            self._moved.admit()
            self._moved = None


@functools.cache
def grpo_trainer_class() -> type[Any]:
    """TRL's GRPOTrainer with turns (imported on first use)."""
    from trl import GRPOTrainer as TrlGRPOTrainer

    signature = inspect.signature(TrlGRPOTrainer.__init__)

    class GRPOTrainer(TrlGRPOTrainer):  # type: ignore[misc]
        def __init__(
            self, *args: Any, turns: Turns | None = None, offload_hooks: bool = False, **kwargs: Any
        ) -> None:
            self.timeshare_turns = turns = turns if turns is not None else turns_from_env()
            if turns.enabled:
                bound = signature.bind(self, *args, **kwargs)
                bound.arguments["reward_funcs"] = off_turn_rewards(
                    bound.arguments.get("reward_funcs"), turns
                )
                callbacks = bound.arguments.get("callbacks") or []
                bound.arguments["callbacks"] = [*callbacks, turn_callback(turns)]
                args, kwargs = bound.args[1:], bound.kwargs
                turns.enroll_this_process(TrainerOffloadHooks(self) if offload_hooks else None)
                turns.acquire(SETUP)
                leave_at_exit(turns.close)
            super().__init__(*args, **kwargs)

        def leave_group(self) -> None:
            """Give the last turn back and leave the group (also done at exit)."""
            self.timeshare_turns.close()

    GRPOTrainer.__doc__ = __doc__
    return GRPOTrainer


def __getattr__(name: str) -> Any:
    if name == "GRPOTrainer":
        return grpo_trainer_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
