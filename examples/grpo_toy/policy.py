"""A tiny policy learning single-digit addition mod 10 with GRPO-style
group-normalised advantages. Everything is seeded per step, in float64, so
the same steps give the same bits however the process is scheduled."""

from __future__ import annotations

import hashlib

import numpy as np
import numpy.typing as npt

Array = npt.NDArray[np.float64]
PROMPTS_PER_STEP = 64
GROUP_SIZE = 8
LEARNING_RATE = 60.0


def initial_weights(seed: int) -> Array:
    # One row of logits per prompt (a, b), one column per answer digit.
    return np.random.default_rng([seed, 0]).normal(0.0, 0.01, size=(100, 10))


def softmax(logits: Array) -> Array:
    shifted = np.exp(logits - logits.max(axis=-1, keepdims=True))
    probabilities: Array = shifted / shifted.sum(axis=-1, keepdims=True)
    return probabilities


def sample(weights: Array, seed: int, step: int) -> tuple[list[int], list[list[int]]]:
    """The sampler: prompts for this step and GROUP_SIZE answers to each."""
    rng = np.random.default_rng([seed, step, 1])
    prompts = rng.integers(0, 100, size=PROMPTS_PER_STEP)
    cumulative = np.cumsum(softmax(weights[prompts]), axis=-1)
    draws = rng.random((PROMPTS_PER_STEP, GROUP_SIZE, 1))
    answers = (draws > cumulative[:, None, :]).sum(axis=-1).clip(0, 9)
    return prompts.tolist(), answers.tolist()


def rewards(prompts: list[int], answers: list[list[int]]) -> list[list[float]]:
    """The verifiable reward (CPU): 1 for (a + b) mod 10, else 0."""
    return [
        [1.0 if answer == (p // 10 + p % 10) % 10 else 0.0 for answer in group]
        for p, group in zip(prompts, answers, strict=True)
    ]


def train(
    weights: Array, prompts: list[int], answers: list[list[int]], scores: list[list[float]]
) -> Array:
    """The trainer: one policy-gradient step with group-normalised advantages."""
    r = np.asarray(scores)
    advantages = (r - r.mean(axis=1, keepdims=True)) / (r.std(axis=1, keepdims=True) + 1e-6)
    gradient = np.zeros_like(weights)
    probs = softmax(weights[prompts])
    for i, prompt in enumerate(prompts):
        for answer, advantage in zip(answers[i], advantages[i], strict=True):
            grad_logp = -probs[i].copy()
            grad_logp[answer] += 1.0
            gradient[prompt] += advantage * grad_logp
    result: Array = weights + LEARNING_RATE * gradient / (len(prompts) * GROUP_SIZE)
    return result


def fingerprint(weights: Array) -> str:
    return hashlib.sha256(weights.tobytes()).hexdigest()
