"""The inference engine: vLLM's offline `LLM`, started with sleep mode so
that the node's agent can put it to sleep when a regular job takes the GPU,
or a stand-in with the same calls for a machine without vLLM (a dry run of
the loop, the hooks and the turns: it generates nothing real)."""

from __future__ import annotations

import time
from typing import Any, Protocol


class Engine(Protocol):
    """What the example calls of vllm.LLM (and what VllmHooks calls)."""

    def generate(self, prompts: list[str], sampling_params: Any = None) -> list[Any]: ...

    def sleep(self, level: int = 1, mode: str = "abort") -> None: ...

    def wake_up(self, tags: list[str] | None = None) -> None: ...

    def collective_rpc(self, method: str) -> list[Any]: ...


def completion_texts(outputs: list[Any]) -> list[str]:
    """The first completion of each of vLLM's RequestOutputs."""
    return [output.outputs[0].text for output in outputs]


class StandInOutput:
    """Shaped as vLLM's RequestOutput, as far as completion_texts reads it."""

    def __init__(self, text: str) -> None:
        self.outputs = [self]
        self.text = text


class StandInEngine:
    """vllm.LLM's sleep-mode calls (0.17.0 and later: ``sleep(level, mode)``)
    and a `generate` that takes ``seconds_per_prompt`` per prompt and answers
    each prompt reversed. It refuses to generate while asleep, as the real
    engine's memory would be gone."""

    def __init__(self, seconds_per_prompt: float = 0.0) -> None:
        self.seconds_per_prompt = seconds_per_prompt
        self.sleeps = 0
        self.wake_ups = 0
        self.asleep = False

    def generate(self, prompts: list[str], sampling_params: Any = None) -> list[Any]:
        if self.asleep:
            raise RuntimeError("generate() while the engine sleeps: the GPU is another job's")
        time.sleep(self.seconds_per_prompt * len(prompts))
        return [StandInOutput(prompt[::-1]) for prompt in prompts]

    def sleep(self, level: int = 1, mode: str = "abort") -> None:
        self.sleeps += 1
        self.asleep = True

    def wake_up(self, tags: list[str] | None = None) -> None:
        if tags is None or "kv_cache" in tags:
            self.wake_ups += 1
            self.asleep = False

    def collective_rpc(self, method: str) -> list[Any]:
        return []


def vllm_engine(model: str, gpu_memory_utilization: float) -> Engine:
    """vLLM imported only here, so that the stand-in needs none of it."""
    from vllm import LLM

    engine: Engine = LLM(
        model=model, enable_sleep_mode=True, gpu_memory_utilization=gpu_memory_utilization
    )
    return engine


def sampling(max_tokens: int) -> Any:
    from vllm import SamplingParams

    return SamplingParams(max_tokens=max_tokens, temperature=0.0)
