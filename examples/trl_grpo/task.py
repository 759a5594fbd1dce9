"""The job's task, made in code so that nothing comes from a hub: a
tokenizer over the characters of "a+b=", a tiny randomly initialised Llama,
every prompt "a+b=" for single digits, and a verifiable reward.

The reward function lives here, at module level: under a coordinator it runs
in the coordinator's process, which imports it by name."""

from __future__ import annotations

import hashlib
from typing import Any

DIGITS = [str(d) for d in range(10)]
VOCABULARY = {"<pad>": 0, "<eos>": 1, "+": 2, "=": 3, **{d: 4 + int(d) for d in DIGITS}}


def tokenizer() -> Any:
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    characters = Tokenizer(models.WordLevel(vocab=VOCABULARY, unk_token="<pad>"))
    characters.pre_tokenizer = pre_tokenizers.Split("", "isolated")
    return PreTrainedTokenizerFast(
        tokenizer_object=characters, pad_token="<pad>", eos_token="<eos>"
    )


def tiny_model(seed: int) -> Any:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=len(VOCABULARY), hidden_size=16, intermediate_size=32, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=16,
        pad_token_id=VOCABULARY["<pad>"], eos_token_id=VOCABULARY["<eos>"], bos_token_id=None,
    )  # fmt: skip
    torch.manual_seed(seed)
    return LlamaForCausalLM(config)


def prompts() -> Any:
    from datasets import Dataset

    return Dataset.from_dict({"prompt": [f"{a}+{b}=" for a in DIGITS for b in DIGITS]})


def sum_digit_reward(prompts: list[str], completions: list[str], **_: Any) -> list[float]:
    """1 for a completion that starts with the last digit of a+b, else 0.1 for
    any digit first (so early batches already differ), else 0."""
    scores = []
    for prompt, completion in zip(prompts, completions, strict=True):
        answer = str((int(prompt[0]) + int(prompt[2])) % 10)
        first = completion[:1]
        scores.append(1.0 if first == answer else 0.1 if first in DIGITS else 0.0)
    return scores


def fingerprint(model: Any) -> str:
    """SHA-256 of every parameter and buffer, in name order."""
    digest = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        digest.update(name.encode())
        digest.update(tensor.detach().cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()
