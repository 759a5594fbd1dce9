"""The TRL integration's parts that need no trainer: which steps generate,
how reward functions are wrapped, what may travel to a coordinator, and the
trainer's offload hooks on a real module and optimizer."""

from __future__ import annotations

import functools
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from timeshare.integrations.trl import (
    OffTurnReward,
    TrainerOffloadHooks,
    generates_at,
    off_turn_rewards,
    portable_kwargs,
)
from timeshare.integrations.turns import NoTurns, Result


class RecordingTurns(NoTurns):
    def __init__(self, remote: bool = False) -> None:
        super().__init__()
        self.log: list[str] = []
        self._remote = remote

    @property
    def remote(self) -> bool:
        return self._remote

    def outside(self, call: Callable[..., Result], kwargs: dict[str, Any], then: str) -> Result:
        self.log.append(f"outside then {then}")
        return call(**kwargs)


@pytest.mark.parametrize("accumulation", [1, 2, 3])
@pytest.mark.parametrize("per_generation", [1, 2, 4])
@pytest.mark.parametrize("iterations", [1, 2])
def test_generating_steps_are_those_whose_micro_steps_hit_the_generation_rule(
    accumulation: int, per_generation: int, iterations: int
) -> None:
    args = SimpleNamespace(
        gradient_accumulation_steps=accumulation,
        steps_per_generation=per_generation,
        num_iterations=iterations,
    )
    every = per_generation * iterations
    for step in range(12):
        # GRPOTrainer._prepare_inputs: it generates on micro-step m when m % every == 0.
        micro = range(step * accumulation, (step + 1) * accumulation)
        assert generates_at(step, args) == any(m % every == 0 for m in micro), (step, args)


def digits(prompts: list[str], completions: list[str], **_: Any) -> list[float]:
    return [1.0 if c[:1].isdigit() else 0.0 for c in completions]


async def scored_elsewhere(prompts: list[str], completions: list[str], **_: Any) -> list[float]:
    return [0.0 for _ in completions]


def test_plain_reward_functions_run_off_the_turn_and_keep_their_names() -> None:
    turns = RecordingTurns()
    model = torch.nn.Linear(1, 1)
    wrapped = off_turn_rewards(
        [digits, functools.partial(digits), model, "some/reward-model", scored_elsewhere], turns
    )
    assert [type(w) for w in wrapped[:2]] == [OffTurnReward, OffTurnReward]
    # Reward models and async functions stay as they are, inside the turn.
    assert wrapped[2:] == [model, "some/reward-model", scored_elsewhere]
    assert wrapped[0].__name__ == "digits"
    scores = wrapped[0](prompts=["1+2="], completions=["3"], trainer_state=object())
    assert scores == [1.0] and turns.log == ["outside then train"]
    assert off_turn_rewards(None, turns) is None
    assert len(off_turn_rewards(digits, turns)) == 1


def test_what_goes_to_a_coordinator_leaves_the_trainers_objects_behind() -> None:
    turns = RecordingTurns(remote=True)
    received: dict[str, Any] = {}

    def reward(**kwargs: Any) -> list[float]:
        received.update(kwargs)
        return [0.0]

    OffTurnReward(reward, turns)(prompts=["p"], completions=["c"], completion_ids=[[4]],
                                 answer=["7"], trainer_state=object(), log_extra=print,
                                 log_metric=print)  # fmt: skip
    assert sorted(received) == ["answer", "completion_ids", "completions", "prompts"]
    with pytest.raises(TypeError, match=r"'image'.*cannot be sent to the coordinator"):
        portable_kwargs("reward", {"prompts": ["p"], "image": object()})


def test_the_offload_hooks_move_the_trainers_state_and_bring_it_back_intact() -> None:
    model = torch.nn.Linear(4, 2)
    optimizer = torch.optim.Adam(model.parameters())
    model(torch.ones(1, 4)).sum().backward()
    optimizer.step()
    trainer = SimpleNamespace(model=model, ref_model=None, optimizer=optimizer)
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    moment = optimizer.state[model.weight]["exp_avg"]
    moment_before = moment.clone()
    storage = model.weight.data.data_ptr()
    hooks = TrainerOffloadHooks(trainer)
    hooks.evict("offload")
    assert model.weight.data.data_ptr() != storage  # moved out (to host memory)
    hooks.evict("offload")  # a repeated eviction moves nothing twice
    hooks.admit()
    for name, parameter in model.named_parameters():
        assert torch.equal(parameter, before[name])
    # The optimizer still holds the same tensors, with the same values.
    assert optimizer.state[model.weight]["exp_avg"] is moment
    assert torch.equal(moment, moment_before)
