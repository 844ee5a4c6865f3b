"""BDPL's rewards for text generation: how the black box scores a discrete prefix.

Their classification code (``run_glue_discrete_LM.py``) scores a prompt by its cross-entropy
over a verbaliser; generation has no verbaliser, so (see ``bdpl`` for the rest of the method):

- Reward (``reward="loglik"``, the default): the mean per-token log-likelihood of the
  references given prefix + prompt, on a minibatch of ``batch_size`` training pairs, in one
  forward call of the black box; -reward is the cross-entropy their ``ce_loss`` minimises,
  over the reference's tokens instead of a verbaliser. ``reward="rougeL"`` greedily decodes
  the minibatch (one batched generate call) and scores ROUGE-L F1 against the references:
  closer to the test metric but much noisier and slower.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

import numpy as np
import torch.nn.functional as F
from rouge_score import rouge_scorer

from ...core.blackbox import BlackBoxLM
from ...core.decode import generate
from ...core.loss import shift_labels, target_positions
from ...core.pairs import collate, encode_pairs
from ...data import Example, training_pairs


def prefixed_prompts(prefix: str, prompts: Sequence[str]) -> list[str]:
    """``prefix + " " + prompt`` for each prompt (the prompt alone when the prefix is empty)."""
    return [f"{prefix} {p}" if prefix else p for p in prompts]



class Reward(Protocol):
    """Scores a prefix on the reward's items (larger is better): on a minibatch, one
    black-box call; or on all items, in minibatches (``score_all``: value and calls made)."""

    def __len__(self) -> int: ...

    def __call__(self, prefix: str, indices: Sequence[int]) -> float: ...

    def score_all(self, prefix: str, batch_size: int) -> tuple[float, int]: ...


def identity(prompt: str) -> str:
    return prompt


def _minibatches(items: int, batch_size: int) -> list[list[int]]:
    return [list(range(start, min(start + batch_size, items))) for start in range(0, items, batch_size)]


class LoglikReward:
    """Mean per-token log-likelihood of the references given prefix + prompt.

    Items are (prompt, reference) pairs. One call = one forward pass of the black box over
    the minibatch. Prompts keep their last ``max_prompt_tokens`` tokens (as in training), so
    the limit must leave room for the prefix: the default, 256, is twice the training limit.
    """

    def __init__(
        self,
        base: BlackBoxLM,
        prompts: Sequence[str],
        references: Sequence[str],
        *,
        format_prompt: Callable[[str], str] = identity,
        max_prompt_tokens: int = 256,
    ):
        if len(prompts) != len(references):
            raise ValueError(f"{len(prompts)} prompts but {len(references)} references")
        self.base, self.prompts, self.references = base, list(prompts), list(references)
        self.format_prompt, self.max_prompt_tokens = format_prompt, max_prompt_tokens

    def __len__(self) -> int:
        return len(self.prompts)

    def _total(self, prefix: str, indices: Sequence[int]) -> tuple[float, int]:
        """Summed log-likelihood of the minibatch's reference tokens, and their number."""
        prompts = prefixed_prompts(prefix, [self.prompts[i] for i in indices])
        pairs = encode_pairs(
            self.base.tokenizer,
            [self.format_prompt(p) for p in prompts],
            [self.references[i] for i in indices],
            max_prompt_tokens=self.max_prompt_tokens,
        )
        batch = collate(pairs, self.base.tokenizer.pad_token_id)
        logits = self.base.logits(batch["input_ids"], batch["attention_mask"])
        positions = target_positions(batch["labels"]).to(logits.device)
        log_probs = F.log_softmax(logits[positions].float(), dim=-1)
        targets = shift_labels(batch["labels"]).to(logits.device)[positions]
        picked = log_probs.gather(1, targets[:, None])
        return picked.sum().item(), picked.numel()

    def __call__(self, prefix: str, indices: Sequence[int]) -> float:
        total, tokens = self._total(prefix, indices)
        return total / tokens

    def score_all(self, prefix: str, batch_size: int) -> tuple[float, int]:
        """The mean over every reference token of all items, and the calls it took."""
        batches = _minibatches(len(self), batch_size)
        totals = [self._total(prefix, batch) for batch in batches]
        return sum(t for t, _ in totals) / sum(n for _, n in totals), len(batches)


class RougeLReward:
    """ROUGE-L F1 of the greedy continuation of prefix + prompt, best reference, mean over items.

    Items are (prompt, all references of its input). One call = one batched ``generate``.
    ROUGE-L here is ``rouge_score``'s (F1, no Java), not the coco-caption metric reported.
    """

    def __init__(
        self,
        base: BlackBoxLM,
        prompts: Sequence[str],
        references: Sequence[Sequence[str]],
        *,
        format_prompt: Callable[[str], str] = identity,
        max_new_tokens: int = 64,
    ):
        if len(prompts) != len(references):
            raise ValueError(f"{len(prompts)} prompts but {len(references)} reference lists")
        self.base, self.prompts, self.references = base, list(prompts), list(references)
        self.format_prompt, self.max_new_tokens = format_prompt, max_new_tokens
        self.scorer = rouge_scorer.RougeScorer(["rougeL"])

    def __len__(self) -> int:
        return len(self.prompts)

    def _scores(self, prefix: str, indices: Sequence[int]) -> list[float]:
        prompts = prefixed_prompts(prefix, [self.prompts[i] for i in indices])
        texts = generate(
            self.base,
            [self.format_prompt(p) for p in prompts],
            batch_size=len(prompts),
            max_new_tokens=self.max_new_tokens,
            progress=False,
        )
        return [
            max(self.scorer.score(ref, text)["rougeL"].fmeasure for ref in self.references[i])
            for i, text in zip(indices, texts)
        ]

    def __call__(self, prefix: str, indices: Sequence[int]) -> float:
        return float(np.mean(self._scores(prefix, indices)))

    def score_all(self, prefix: str, batch_size: int) -> tuple[float, int]:
        """The mean over all items, and the calls (batched generate calls) it took."""
        batches = _minibatches(len(self), batch_size)
        return float(np.mean([s for batch in batches for s in self._scores(prefix, batch)])), len(batches)


def make_reward(kind: str, base: BlackBoxLM, examples: Sequence[Example], task_prompt: Callable[[Example], str],
                format_prompt: Callable[[str], str]) -> Reward:
    """The reward ``train_bdpl`` optimises and chooses by, over ``examples``: ``loglik`` or ``rougeL``."""
    if kind == "loglik":
        pairs = training_pairs(examples)
        return LoglikReward(base, [task_prompt(e) for e, _ in pairs], [r for _, r in pairs],
                            format_prompt=format_prompt)
    if kind == "rougeL":
        return RougeLReward(base, [task_prompt(e) for e in examples], [e.references for e in examples],
                            format_prompt=format_prompt)
    raise ValueError(f"Unknown reward {kind!r}; choose 'loglik' or 'rougeL'.")
