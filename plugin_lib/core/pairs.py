"""(prompt, target) pairs as token ids, and their left-padded batches.

``encode_pairs`` keeps a prompt's last ``max_prompt_tokens`` and a target's first
``max_target_tokens`` tokens, then EOS; ``collate`` pads on the left and labels the target
positions only (-100 on prompt and padding), transformers' convention.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from .loss import IGNORE_INDEX


@dataclass(frozen=True)
class EncodedPair:
    input_ids: tuple[int, ...]  # prompt tokens, then target tokens and EOS
    prompt_length: int

    @property
    def target_length(self) -> int:
        return len(self.input_ids) - self.prompt_length


def encode_pairs(
    tokenizer,
    prompts: Sequence[str],
    targets: Sequence[str],
    *,
    max_prompt_tokens: int = 128,
    max_target_tokens: int = 127,
) -> list[EncodedPair]:
    """Token ids of each prompt (its last ``max_prompt_tokens``) + target (first 127) + EOS.

    The prompt keeps its end because that is what the target continues from.
    """
    if len(prompts) != len(targets):
        raise ValueError(f"{len(prompts)} prompts but {len(targets)} targets")
    prompt_ids = tokenizer(list(prompts))["input_ids"]
    target_ids = tokenizer(list(targets), add_special_tokens=False)["input_ids"]
    pairs = []
    for p, t in zip(prompt_ids, target_ids):
        p = p[-max_prompt_tokens:]
        t = t[:max_target_tokens] + [tokenizer.eos_token_id]
        pairs.append(EncodedPair(tuple(p + t), len(p)))
    return pairs


def collate(pairs: Sequence[EncodedPair], pad_token_id: int) -> dict[str, torch.Tensor]:
    """Left-padded ``input_ids``, ``attention_mask`` and ``labels`` (-100 off target)."""
    width = max(len(p.input_ids) for p in pairs)
    input_ids = torch.full((len(pairs), width), pad_token_id, dtype=torch.long)
    attention_mask = torch.zeros((len(pairs), width), dtype=torch.long)
    labels = torch.full((len(pairs), width), IGNORE_INDEX, dtype=torch.long)
    for row, pair in enumerate(pairs):
        start = width - len(pair.input_ids)
        input_ids[row, start:] = torch.tensor(pair.input_ids)
        attention_mask[row, start:] = 1
        labels[row, start + pair.prompt_length :] = torch.tensor(pair.input_ids[pair.prompt_length :])
    return {"input_ids": input_ids, "attention_mask": attention_mask, "labels": labels}
