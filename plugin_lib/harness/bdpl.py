"""Black-box Discrete Prompt Learning (BDPL, Diao et al. 2022) adapted to text generation.

BDPL learns a discrete prompt of ``L`` positions. Each position holds a categorical
distribution over ``C`` candidate phrases (a probability vector on the simplex). A training step
samples ``I`` prompts from these distributions, scores each one on the black box, and moves the
probabilities along a variance-reduced policy gradient, projected back onto the simplex. Only
black-box outputs are used, and every scoring of a sampled prompt counts as one API call
against a budget (the paper uses 75, following Diao et al.).

Choices made here (the paper gives no details for generation tasks):

- Candidates: word n-grams of the training references (``candidate_ngrams``), lowercased;
  multi-word n-grams ranked by PMI among those seen at least ``min_count`` times, padded
  with the most frequent words. Default ``C = 50``: with 75 calls, a larger set would leave
  most candidates never sampled.
- Prompt: ``L = 5`` positions. The learned text is prepended to the task prompt with one
  space, ``discrete_prefix + " " + task_prompt`` (``prefixed_prompts``); a chat template, if
  any, is applied to the result (``format_prompt``).
- Reward (``reward="loglik"``, the default): mean per-token log-likelihood of the reference
  given prefix + prompt, on a minibatch of training pairs, in one forward call of the black
  box. It needs no decoding, is smooth in the prompt (small changes move it a little) and is
  the negative of the loss the Plugin is trained on. ``reward="rougeL"`` greedily decodes the
  minibatch (one batched generate call) and scores ROUGE-L F1 against the references: closer
  to the test metric but much noisier and slower.
- Estimator: for sampled prompts S_1..S_n with rewards R_1..R_n on the same minibatch,
  g = 1/(n-1) sum_k (R_k - mean(R)) grad log P(S_k), where d log P(S)/d p[i, j] is
  1/p[i, j] if S chooses candidate j at position i and 0 otherwise. With the batch mean as
  baseline and 1/(n-1) this estimator is unbiased, and equals using the mean of the *other*
  samples as each sample's baseline (scaled by (n-1)/n). Ascent, since rewards are maximised.
- Final prompt: the most probable candidate at each position (BDPL's own evaluation
  rule). It costs no extra API call and, unlike "best sampled prompt", does not favour a
  prompt that happened to be scored on an easy minibatch. Every sampled prompt and its
  reward are kept in ``BDPLResult.history``.
"""
from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np
import torch.nn.functional as F
from rouge_score import rouge_scorer

from ..core.blackbox import BlackBoxLM
from ..core.decode import generate
from ..core.loss import shift_labels, target_positions
from ..core.train import collate, encode_pairs
from ..data import Example, training_pairs

DEFAULT_BUDGET = 75
WORD = re.compile(r"[a-z0-9]+(?:'[a-z]+)?")


# ---------------------------------------------------------------------------------------------
# Candidate vocabulary


def words(text: str) -> list[str]:
    """Lowercased word tokens (letters and digits, with an inner apostrophe); no punctuation."""
    return WORD.findall(text.lower())


def candidate_ngrams(texts: Sequence[str], size: int = 50, *, max_n: int = 2, min_count: int = 2) -> list[str]:
    """The ``size`` candidate phrases of a corpus: high-PMI n-grams first, then frequent words.

    n-grams of 2..``max_n`` words (within one text) seen at least ``min_count`` times are
    ranked by PMI = log p(w1..wn) / (p(w1) ... p(wn)), p estimated by relative frequency among
    n-grams of the same length. ``min_count`` keeps one-off rare pairs, whose PMI is
    inflated, out. If fewer than ``size`` qualify, the most frequent single words fill up.
    Ties go to the more frequent, then alphabetically first, phrase; the result is
    deterministic. Default ``max_n=2``: PMI grows with n, so longer n-grams would crowd out
    bigrams.
    """
    tokenised = [words(t) for t in texts]
    counts = {
        n: Counter(tuple(ws[i : i + n]) for ws in tokenised for i in range(len(ws) - n + 1))
        for n in range(1, max_n + 1)
    }
    totals = {n: sum(c.values()) for n, c in counts.items()}

    def pmi(gram: tuple[str, ...]) -> float:
        joint = counts[len(gram)][gram] / totals[len(gram)]
        return math.log(joint) - sum(math.log(counts[1][(w,)] / totals[1]) for w in gram)

    phrases = [g for n in range(2, max_n + 1) for g, c in counts[n].items() if c >= min_count]
    phrases.sort(key=lambda g: (-pmi(g), -counts[len(g)][g], g))
    singles = sorted(counts[1], key=lambda g: (-counts[1][g], g))
    return [" ".join(g) for g in (phrases + singles)[:size]]


def prefixed_prompts(prefix: str, prompts: Sequence[str]) -> list[str]:
    """``prefix + " " + prompt`` for each prompt (the prompt alone when the prefix is empty)."""
    return [f"{prefix} {p}" if prefix else p for p in prompts]


# ---------------------------------------------------------------------------------------------
# API budget


class BudgetExhausted(RuntimeError):
    """A black-box call was attempted after the API budget was spent."""


class ApiBudget:
    """Counts black-box calls and refuses any beyond ``total``."""

    def __init__(self, total: int = DEFAULT_BUDGET):
        if total < 1:
            raise ValueError(f"The API budget must allow at least one call, got {total}.")
        self.total = total
        self.used = 0

    @property
    def remaining(self) -> int:
        return self.total - self.used

    def spend(self) -> None:
        """Record one call; raise BudgetExhausted (recording nothing) if none is left."""
        if self.used >= self.total:
            raise BudgetExhausted(f"API budget of {self.total} calls exhausted; no call was made.")
        self.used += 1


# ---------------------------------------------------------------------------------------------
# Optimisation on the simplex


def project_to_simplex(values: np.ndarray) -> np.ndarray:
    """Euclidean projection of ``values`` (a vector, or each row of a matrix) onto the simplex.

    Sort-based algorithm: with u the row sorted in decreasing order, rho is the largest j
    such that u_j - (u_1 + ... + u_j - 1) / j > 0; the projection is max(v - theta, 0) with
    theta = (u_1 + ... + u_rho - 1) / rho.
    """
    shape = np.shape(values)
    rows = np.atleast_2d(np.asarray(values, dtype=np.float64))
    u = -np.sort(-rows, axis=1)
    cumsum = np.cumsum(u, axis=1) - 1.0
    j = np.arange(1, rows.shape[1] + 1)
    rho = np.count_nonzero(u - cumsum / j > 0, axis=1)  # the condition holds exactly for j <= rho
    theta = cumsum[np.arange(len(rows)), rho - 1] / rho
    return np.maximum(rows - theta[:, None], 0.0).reshape(shape)


def sample_prompt(probs: np.ndarray, rng: np.random.Generator) -> tuple[int, ...]:
    """One candidate index per position, drawn from that position's distribution."""
    return tuple(int(rng.choice(probs.shape[1], p=row)) for row in probs)


def policy_gradient(probs: np.ndarray, samples: Sequence[Sequence[int]], rewards: Sequence[float]) -> np.ndarray:
    """The variance-reduced estimate of d E[reward] / d probs (see the module docstring)."""
    if len(samples) < 2:
        raise ValueError("The variance-reduced estimator needs at least two samples.")
    advantages = np.asarray(rewards, dtype=np.float64) - np.mean(rewards)
    grad = np.zeros_like(probs)
    positions = np.arange(probs.shape[0])
    for sample, advantage in zip(samples, advantages):
        grad[positions, sample] += advantage / probs[positions, sample]
    return grad / (len(samples) - 1)


def step_sizes(budget: int, samples_per_step: int) -> list[int]:
    """Samples per step that spend ``budget`` calls exactly, never leaving a lone sample.

    A single sample has no baseline, so a remainder of one joins the last full step.
    """
    steps, rest = divmod(budget, samples_per_step)
    sizes = [samples_per_step] * steps
    if rest == 1 and sizes:
        sizes[-1] += 1
    elif rest:
        sizes.append(rest)
    return sizes


# ---------------------------------------------------------------------------------------------
# Rewards from the black box


class Reward(Protocol):
    """Scores a prefix on a minibatch of the reward's items (larger is better)."""

    def __len__(self) -> int: ...

    def __call__(self, prefix: str, indices: Sequence[int]) -> float: ...


def _identity(prompt: str) -> str:
    return prompt


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
        format_prompt: Callable[[str], str] = _identity,
        max_prompt_tokens: int = 256,
    ):
        if len(prompts) != len(references):
            raise ValueError(f"{len(prompts)} prompts but {len(references)} references")
        self.base, self.prompts, self.references = base, list(prompts), list(references)
        self.format_prompt, self.max_prompt_tokens = format_prompt, max_prompt_tokens

    def __len__(self) -> int:
        return len(self.prompts)

    def __call__(self, prefix: str, indices: Sequence[int]) -> float:
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
        return log_probs.gather(1, targets[:, None]).mean().item()


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
        format_prompt: Callable[[str], str] = _identity,
        max_new_tokens: int = 64,
    ):
        if len(prompts) != len(references):
            raise ValueError(f"{len(prompts)} prompts but {len(references)} reference lists")
        self.base, self.prompts, self.references = base, list(prompts), list(references)
        self.format_prompt, self.max_new_tokens = format_prompt, max_new_tokens
        self.scorer = rouge_scorer.RougeScorer(["rougeL"])

    def __len__(self) -> int:
        return len(self.prompts)

    def __call__(self, prefix: str, indices: Sequence[int]) -> float:
        prompts = prefixed_prompts(prefix, [self.prompts[i] for i in indices])
        texts = generate(
            self.base,
            [self.format_prompt(p) for p in prompts],
            batch_size=len(prompts),
            max_new_tokens=self.max_new_tokens,
            progress=False,
        )
        scores = [
            max(self.scorer.score(ref, text)["rougeL"].fmeasure for ref in self.references[i])
            for i, text in zip(indices, texts)
        ]
        return float(np.mean(scores))


# ---------------------------------------------------------------------------------------------
# Training


@dataclass
class BDPLResult:
    """The learned prompt and how it was found.

    ``probs`` (L x C) are the final distributions; ``indices`` their per-position argmax and
    ``prefix`` its text. ``history`` has one entry per step: the sampled prompts, their
    rewards and the calls used so far.
    """

    prefix: str
    indices: tuple[int, ...]
    candidates: tuple[str, ...]
    probs: np.ndarray
    calls_used: int
    history: list[dict] = field(default_factory=list)

    @property
    def mean_rewards(self) -> list[float]:
        """Mean reward of the sampled prompts, per step."""
        return [float(np.mean(h["rewards"])) for h in self.history]


def prefix_text(candidates: Sequence[str], indices: Sequence[int]) -> str:
    return " ".join(candidates[i] for i in indices)


def optimize_prompt(
    reward: Reward,
    candidates: Sequence[str],
    *,
    prompt_length: int = 5,
    samples_per_step: int = 5,
    budget: ApiBudget | int = DEFAULT_BUDGET,
    lr: float = 0.1,
    batch_size: int = 8,
    seed: int = 0,
) -> BDPLResult:
    """BDPL's loop: sample prompts, score them (one API call each), take a projected ascent step.

    All samples of a step are scored on the same minibatch of ``batch_size`` reward items, so
    their rewards differ only through the prompt. The loop spends the budget exactly
    (``step_sizes``); ``budget`` may be shared (an ``ApiBudget``) or a number of calls.
    The default ``lr`` suits the log-likelihood reward with 50 candidates: advantages are a few
    hundredths of a nat (SmolLM2 on E2E), and one of 0.03 on a sampled candidate of
    probability 1/50 raises it by about 0.04 (with 5 samples per step).
    """
    if samples_per_step < 2:
        raise ValueError("samples_per_step must be at least 2 (the estimator needs a baseline).")
    budget = budget if isinstance(budget, ApiBudget) else ApiBudget(budget)
    rng = np.random.default_rng(seed)
    probs = np.full((prompt_length, len(candidates)), 1.0 / len(candidates))
    history = []
    for step, size in enumerate(step_sizes(budget.remaining, samples_per_step)):
        batch = rng.choice(len(reward), size=min(batch_size, len(reward)), replace=False).tolist()
        samples = [sample_prompt(probs, rng) for _ in range(size)]
        rewards = []
        for sample in samples:
            budget.spend()
            rewards.append(reward(prefix_text(candidates, sample), batch))
        if size > 1:  # a lone sample (a budget of one call) has no baseline to learn from
            probs = project_to_simplex(probs + lr * policy_gradient(probs, samples, rewards))
        history.append({"step": step, "prompts": samples, "rewards": rewards, "calls_used": budget.used})
    indices = tuple(int(i) for i in probs.argmax(axis=1))
    return BDPLResult(
        prefix_text(candidates, indices), indices, tuple(candidates), probs, budget.used, history
    )


def train_bdpl(
    base: BlackBoxLM,
    examples: Sequence[Example],
    task_prompt: Callable[[Example], str],
    *,
    reward: str = "loglik",
    candidates: Sequence[str] | None = None,
    num_candidates: int = 50,
    format_prompt: Callable[[str], str] = _identity,
    **optimize_kwargs,
) -> BDPLResult:
    """BDPL on a training pool: candidates from its references, reward from the black box.

    ``task_prompt(example)`` is the task prompt (e.g. ``prompts.build_prompt``); the learned
    prefix goes in front of it. ``reward`` is "loglik" (items: one per reference) or "rougeL"
    (items: one per input). Other keyword arguments go to ``optimize_prompt``.
    """
    if candidates is None:
        candidates = candidate_ngrams([r for e in examples for r in e.references], num_candidates)
    if reward == "loglik":
        pairs = training_pairs(examples)
        scorer = LoglikReward(
            base, [task_prompt(e) for e, _ in pairs], [r for _, r in pairs], format_prompt=format_prompt
        )
    elif reward == "rougeL":
        scorer = RougeLReward(
            base, [task_prompt(e) for e in examples], [e.references for e in examples], format_prompt=format_prompt
        )
    else:
        raise ValueError(f"Unknown reward {reward!r}; choose 'loglik' or 'rougeL'.")
    return optimize_prompt(scorer, candidates, **optimize_kwargs)
