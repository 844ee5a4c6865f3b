"""Black-box Discrete Prompt Learning (BDPL, Diao et al., TMLR 2023) adapted to text generation.

Followed: ``run_glue_discrete_LM.py`` of ``shizhediao/Black-Box-Prompt-Learning`` (commit
3fd736a): the "Black-box Training" loop of ``main()``, ``constrainScoreByWholeExact`` /
``solve_v_total_exact`` and ``evaluate()``, with the settings of its ``run.sh`` line; from
``run_glue_discrete_GPT.py``, that a candidate is a whole phrase and the prompt is the chosen
phrases joined by spaces. As there:

- ``prompt_length`` positions, each a probability vector over ``C`` candidates, initialised
  uniform (1/C): one tensor, the only parameter optimised.
- A step draws S prompts (``samples_per_step``, their 20) independently from the rows
  (renormalised, as their ``torch.distributions.Categorical`` does) and scores each on the same
  minibatch: one black-box call each, counted against the budget (``ApiBudget``). The loss of a
  prompt is L_k = -reward.
- Gradient, written into ``.grad`` by hand: g = 1/(S-1) sum_k (L_k - mean L) d_k, where
  d_k[i, j] = +1/p[i, j] at the index that sample k took at position i and -1/p[i, j] at every
  other index (``policy_gradient``). Then ``clip_grad_norm_`` (3), a ``torch.optim.AdamW``
  step (lr 1e-4, their run.sh; weight decay 0.1): descent on the loss.
- After every step each row is put back by their projection: subtract the v >= 0 with
  sum(clamp(p - v, 0, 1)) = 1 and clamp (``constrain_to_simplex``). They find v by bisection
  on [0, max p]; here v is exact (tests/test_bdpl.py checks that both give the same rows).
  Their v is never negative, so a row whose clamped sum is below 1 is only clamped; sampling
  renormalises it.
- The prompts the final choice considers are the argmax prompts after each update: their
  ``evaluate()`` runs after each epoch, and in their RoBERTa runs (run.sh: ``k_shot 16``,
  batch 128, so the whole few-shot training set is one batch) an epoch is one step.

A note on the estimator: with the sample mean as baseline, sum_k (L_k - mean L) = 0, so the
-1/p terms of an entry add up to (1/p) times the advantages of the samples that took it: the
estimate is exactly twice the plain one (1/p at the sampled index only). AdamW hardly sees the
factor 2; what makes 75 calls move the distribution so little is AdamW's step of about ``lr``
per entry and per update, with 4 updates (75 calls at 20 per step).

What differs from their code, and why:

- The final prompt: they keep the argmax prompt with the best dev score (the intent: their
  ``best_prompts_probs = prompts_probs`` stores a reference, not a copy, so in fact they test
  the final argmax). Here the argmax prompt after each update *and the empty prompt* are
  scored by the same reward on the task's hyper-validation split (never test), and the best is
  kept, the empty prompt on ties (``choose_prefix``). So the chosen prefix is never worse than
  no prefix (Zeroshot) on hyper-validation, by that reward. As in their code these evaluations
  do not count against the budget: their ``api_limit`` counts ``train_api_request`` only, and
  ``evaluate()`` calls the model directly. They are counted apart (``selection_calls``).
- A zero probability. The projection can set an entry to exactly 0, and their -1/p is then
  -inf, which turns the clipped gradient into NaN. A zero-probability candidate is never
  sampled, so its term is -(1/p) sum_k (L_k - mean L) with a sum that is exactly 0: it gets
  derivative 0 here (the limit as p -> 0).
- Precision: float64, not their float32. The gradient of a candidate no sample took is exactly
  0 in theory (the same sum); in float32 it is rounding residue (7e-8 in one step of their loop
  at 50 uniform candidates), which AdamW's eps of 1e-8 does not damp: the candidate moved by
  0.9 ``lr``, almost as far as a sampled one. In float64 the residue stays far below eps.
- The budget's last step. Their loop raises ``ApiCallLimitError`` at the limit and drops the
  samples of the interrupted step without an update. Here the calls left form a last, smaller
  step (``step_sizes``: 75 calls at 20 per step are steps of 20, 20, 20 and 15), so no paid
  call is thrown away; a single call left over (no baseline) joins the step before.

For generation, which their classification code does not cover: the rewards, the candidates and
the placement of the prompt. The rewards are in ``bdpl_rewards``.

- Candidates: word n-grams of the training references (``candidate_ngrams``), lowercased;
  multi-word n-grams ranked by PMI among those seen at least ``min_count`` times, padded with
  the most frequent words (their ``pmi_ngram.py`` ranks PMI-segmented n-grams by frequency).
- Placement: the learned text is prepended to the task prompt with one space,
  ``discrete_prefix + " " + task_prompt`` (``bdpl_rewards.prefixed_prompts``); a chat template, if any, is
  applied to the result (``format_prompt``).
"""
from __future__ import annotations

import dataclasses
import math
import re
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from tqdm.auto import tqdm

from ...core.blackbox import BlackBoxLM
from ...data import Example
from .bdpl_rewards import Reward, identity, make_reward
from ..profile import Bdpl, Profile

DEFAULT_BUDGET = 75
WORD = re.compile(r"[^\W_]+(?:'[^\W_]+)?")  # letters (any script, "café" whole) and digits
NO_PREFIX = "no prefix"  # the origin of the empty prompt among the final candidates


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


def constrain_to_simplex(probs: torch.Tensor) -> torch.Tensor:
    """Diao et al.'s projection of each row, in place: p <- clamp(p - v, 0, 1), v >= 0 the
    shift with sum(clamp(p - v, 0, 1)) = 1, or v = 0 when the clamped row sums to less than 1.

    They find v by bisection on [0, max p] (``solve_v_total_exact``); here v is exact. For
    sorted u_1 >= u_2 >= ..., the rows' Euclidean projection onto the simplex shifts by
    theta = (u_1 + ... + u_rho - 1) / rho, rho the largest j with u_j > (u_1 + ... + u_j - 1) / j;
    their v is max(theta, 0). (With theta >= 0 no entry exceeds 1, so the upper clamp is idle.)
    """
    with torch.no_grad():
        u = torch.sort(probs, dim=1, descending=True).values
        excess = torch.cumsum(u, dim=1) - 1.0
        j = torch.arange(1, probs.shape[1] + 1, dtype=probs.dtype, device=probs.device)
        rho = (u - excess / j > 0).sum(dim=1, keepdim=True)  # holds exactly for j <= rho
        theta = excess.gather(1, rho - 1) / rho
        probs.sub_(theta.clamp(min=0.0)).clamp_(0.0, 1.0)
    return probs


def sampling_probs(probs: np.ndarray) -> np.ndarray:
    """The distributions prompts are drawn from: each row renormalised (``constrain_to_simplex``
    can leave a row's sum below 1; their ``Categorical(prompts_probs)`` renormalises too)."""
    totals = probs.sum(axis=1, keepdims=True)
    if not (totals > 0).all():
        raise ValueError("A prompt position has no probability mass left to sample from.")
    return probs / totals


def sample_prompt(probs: np.ndarray, rng: np.random.Generator) -> tuple[int, ...]:
    """One candidate index per position, drawn from that position's row, renormalised."""
    return tuple(int(rng.choice(probs.shape[1], p=row)) for row in sampling_probs(probs))


def policy_gradient(probs: torch.Tensor, samples: Sequence[Sequence[int]], losses: Sequence[float]) -> torch.Tensor:
    """Diao et al.'s estimate of d E[loss] / d probs: 1/(S-1) sum_k (L_k - mean L) d_k, with
    d_k = +1/p at the indices sample k took and -1/p at every other index.

    An entry with p = 0 gets derivative 0 instead of their -inf (see the module docstring).
    """
    if len(samples) != len(losses):
        raise ValueError(f"{len(samples)} sampled prompts but {len(losses)} losses")
    if len(samples) < 2:
        raise ValueError("The estimator needs at least two samples (the mean loss is its baseline).")
    inverse = torch.where(probs > 0, probs.reciprocal(), torch.zeros_like(probs))
    mean_loss = sum(losses) / len(losses)
    positions = torch.arange(probs.shape[0])
    grad = torch.zeros_like(probs)
    for sample, loss in zip(samples, losses):
        derivative = -inverse
        derivative[positions, list(sample)] = inverse[positions, list(sample)]
        grad += (loss - mean_loss) / (len(samples) - 1) * derivative
    return grad


def step_sizes(budget: int, samples_per_step: int) -> list[int]:
    """Samples per step that spend ``budget`` calls exactly: full steps, then what is left
    as a smaller last step; a single call left over (it has no baseline) joins the step
    before, and a budget of one call is one step that cannot update."""
    steps, rest = divmod(budget, samples_per_step)
    sizes = [samples_per_step] * steps
    if rest == 1 and sizes:
        sizes[-1] += 1
    elif rest:
        sizes.append(rest)
    return sizes


def check_settings(settings: Bdpl) -> None:
    """ValueError for settings BDPL cannot run with."""
    if settings.samples_per_step < 2:
        raise ValueError("samples_per_step must be at least 2 (the estimator's baseline), "
                         f"got {settings.samples_per_step}.")
    for name in ("prompt_length", "num_candidates", "batch_size"):
        if getattr(settings, name) < 1:
            raise ValueError(f"BDPL's {name} must be positive, got {getattr(settings, name)}.")
    for name in ("lr", "clip_norm"):
        if not getattr(settings, name) > 0:
            raise ValueError(f"BDPL's {name} must be positive, got {getattr(settings, name)}.")
    if settings.weight_decay < 0:
        raise ValueError(f"BDPL's weight_decay must not be negative, got {settings.weight_decay}.")


# ---------------------------------------------------------------------------------------------
# Training and the final choice


@dataclass
class Trajectory:
    """What BDPL's optimisation did. ``probs`` (L x C) are the final rows; ``history`` has one
    entry per step: the sampled prompts (candidate indices), their rewards, the calls used so
    far, and after the update (None for a step that could not update) the argmax prompt and
    each position's largest probability (of the renormalised row, ``sampling_probs``)."""

    candidates: tuple[str, ...]
    probs: np.ndarray
    calls_used: int
    history: list[dict]

    @property
    def rewards_per_call(self) -> list[float]:
        """The reward of every black-box call, in the order they were made."""
        return [r for h in self.history for r in h["rewards"]]

    @property
    def mean_rewards(self) -> list[float]:
        """Mean reward of the sampled prompts, per step."""
        return [float(np.mean(h["rewards"])) for h in self.history]

    def step_prefixes(self) -> list[tuple[str, str]]:
        """(origin, prefix) of the argmax prompt after each update: the final candidates."""
        return [(f"step {h['step']}", prefix_text(self.candidates, h["argmax"]))
                for h in self.history if h["argmax"] is not None]


@dataclass
class BDPLResult:
    """The chosen prefix ("" when no prefix won), where it came from, the optimisation, and
    the hyper-validation score of every final candidate (``selection``)."""

    prefix: str
    origin: str
    trajectory: Trajectory
    selection: list[dict]
    selection_calls: int


def prefix_text(candidates: Sequence[str], indices: Sequence[int]) -> str:
    return " ".join(candidates[i] for i in indices)


def optimize_prompt(
    reward: Reward,
    candidates: Sequence[str],
    settings: Bdpl,
    *,
    budget: ApiBudget | int = DEFAULT_BUDGET,
    seed: int = 0,
    resume: dict | None = None,
    on_step: Callable[[dict], None] | None = None,
    progress: bool = False,
) -> Trajectory:
    """BDPL's training loop (the module docstring): per step, sample prompts, score each on
    one minibatch (one API call each), step AdamW along the estimator, project.

    The loop spends the budget exactly (``step_sizes``); ``budget`` may be shared (an
    ``ApiBudget``) or a number of calls.

    Resumable: after every step ``on_step`` gets the loop's whole state (a JSON-able dict:
    the rows, AdamW's moments, the generator's state, the history, the calls spent); given
    back as ``resume``, the loop goes on from there and ends exactly as an uninterrupted one.
    """
    check_settings(settings)
    if len(candidates) < 1:
        raise ValueError("BDPL needs at least one candidate phrase.")
    budget = budget if isinstance(budget, ApiBudget) else ApiBudget(budget)
    rng = np.random.default_rng(seed)
    probs = torch.full((settings.prompt_length, len(candidates)), 1.0 / len(candidates), dtype=torch.float64,
                       requires_grad=True)
    optimizer = torch.optim.AdamW([probs], lr=settings.lr, weight_decay=settings.weight_decay)
    sizes, history = step_sizes(budget.remaining, settings.samples_per_step), []
    if resume is not None:
        sizes, history = _restore(resume, candidates, settings, seed, budget, rng, probs, optimizer)
    bar = tqdm(total=len(sizes), initial=len(history), desc=f"BDPL, {budget.total} calls (seed {seed})",
               disable=not progress)
    for step, size in enumerate(sizes[len(history):], start=len(history) + 1):
        batch = rng.choice(len(reward), size=min(settings.batch_size, len(reward)), replace=False).tolist()
        samples = [sample_prompt(probs.detach().numpy(), rng) for _ in range(size)]
        rewards = []
        for sample in samples:
            budget.spend()
            rewards.append(reward(prefix_text(candidates, sample), batch))
        argmax = top = None
        if size > 1:  # a lone sample (a budget of one call) has no baseline to learn from
            optimizer.zero_grad()
            probs.grad = policy_gradient(probs.detach(), samples, [-r for r in rewards])
            torch.nn.utils.clip_grad_norm_(probs, settings.clip_norm)
            optimizer.step()
            constrain_to_simplex(probs)
            argmax = probs.detach().argmax(dim=1).tolist()
            top = sampling_probs(probs.detach().numpy()).max(axis=1).tolist()
        history.append({"step": step, "prompts": [list(s) for s in samples], "rewards": rewards,
                        "calls_used": budget.used, "argmax": argmax, "top_probs": top})
        bar.update()
        if on_step is not None:
            on_step(_loop_state(candidates, settings, seed, sizes, budget, rng, probs, optimizer, history))
    bar.close()
    return Trajectory(tuple(candidates), probs.detach().numpy().copy(), budget.used, history)


def _loop_state(candidates, settings, seed, sizes, budget, rng, probs, optimizer, history) -> dict:
    """``optimize_prompt``'s state after a step, as JSON (floats round-trip exactly)."""
    moments = optimizer.state.get(probs)
    return {
        "candidates": list(candidates), "settings": dataclasses.asdict(settings), "seed": seed,
        "sizes": list(sizes), "calls_used": budget.used, "rng": rng.bit_generator.state,
        "probs": probs.detach().tolist(), "history": list(history),
        "adamw": None if not moments else {"step": float(moments["step"]), "exp_avg": moments["exp_avg"].tolist(),
                                           "exp_avg_sq": moments["exp_avg_sq"].tolist()},
    }


def _restore(state: dict, candidates, settings, seed, budget: ApiBudget, rng, probs, optimizer
             ) -> tuple[list[int], list[dict]]:
    """Put ``optimize_prompt``'s variables back as ``state`` left them; (step sizes, history)."""
    if state["candidates"] != list(candidates):
        raise ValueError("The saved BDPL state was made with other candidate phrases; it cannot be resumed.")
    # A state saved before these two keys existed has neither (its caller's fingerprint covers them).
    saved_with = (state.get("settings", dataclasses.asdict(settings)), state.get("seed", seed))
    if saved_with != (dataclasses.asdict(settings), seed):
        raise ValueError(f"The saved BDPL state was made with settings {state['settings']} and seed {state['seed']}, "
                         f"not {dataclasses.asdict(settings)} and seed {seed}; it cannot be resumed.")
    sizes, history = list(state["sizes"]), list(state["history"])
    if budget.used + sum(sizes) != budget.total or state["calls_used"] != budget.used + sum(sizes[:len(history)]):
        raise ValueError(f"The saved BDPL state spent {state['calls_used']} of {budget.used + sum(sizes)} calls; "
                         f"this budget is {budget.total} calls with {budget.used} used.")
    budget.used = state["calls_used"]
    rng.bit_generator.state = state["rng"]
    with torch.no_grad():
        probs.copy_(torch.tensor(state["probs"], dtype=probs.dtype))
    if state["adamw"] is not None:
        moments = state["adamw"]
        optimizer.load_state_dict({
            "state": {0: {"step": torch.tensor(moments["step"]),
                          "exp_avg": torch.tensor(moments["exp_avg"], dtype=probs.dtype),
                          "exp_avg_sq": torch.tensor(moments["exp_avg_sq"], dtype=probs.dtype)}},
            "param_groups": optimizer.state_dict()["param_groups"]})
    return sizes, history


def choose_prefix(learned: Sequence[tuple[str, str]], score: Callable[[str], tuple[float, int]]
                  ) -> tuple[str, str, list[dict], int]:
    """The best of the empty prefix and the ``learned`` (origin, prefix) pairs by ``score``
    (value, calls), each distinct prefix scored once; the first best wins, so the empty prefix
    wins ties. Returns (prefix, origin, every candidate's score, calls)."""
    rows, seen, calls = [], {}, 0
    for origin, prefix in [(NO_PREFIX, "")] + list(learned):
        if prefix not in seen:
            seen[prefix], used = score(prefix)
            calls += used
        rows.append({"origin": origin, "prefix": prefix, "hyper_reward": seen[prefix]})
    best = max(rows, key=lambda row: row["hyper_reward"])  # max keeps the first of equals
    return best["prefix"], best["origin"], rows, calls


def train_bdpl(
    base: BlackBoxLM,
    train: Sequence[Example],
    hyper: Sequence[Example],
    task_prompt: Callable[[Example], str],
    settings: Bdpl,
    *,
    budget: ApiBudget | int = DEFAULT_BUDGET,
    seed: int = 0,
    reward: str = "loglik",
    candidates: Sequence[str] | None = None,
    format_prompt: Callable[[str], str] = identity,
    checkpoint: dict | None = None,
    save_checkpoint: Callable[[dict], None] | None = None,
    progress: bool = False,
) -> BDPLResult:
    """BDPL on a task: candidates from the ``train`` references, the prompt optimised on
    ``train`` within ``budget``, the final prefix chosen on ``hyper`` (``choose_prefix``).

    ``task_prompt(example)`` is the task prompt (e.g. ``prompts.build_prompt``); the learned
    prefix goes in front of it. ``reward`` is "loglik" (items: one per reference) or "rougeL"
    (items: one per input).

    Resumable: ``save_checkpoint`` gets, after every step and every hyper-validation score, a
    JSON-able dict (the loop's state, ``optimize_prompt``, and the scores so far); given back
    as ``checkpoint``, the work goes on from there to the same result.
    """
    if not train or not hyper:
        raise ValueError(f"BDPL needs training and hyper-validation examples, got {len(train)} and {len(hyper)}.")
    if candidates is None:
        candidates = candidate_ngrams([r for e in train for r in e.references], settings.num_candidates)
    saved = {"loop": None, "scores": {}, **(checkpoint or {})}

    def keep(part: str, value) -> None:
        saved[part] = value
        if save_checkpoint is not None:
            save_checkpoint(saved)

    trajectory = optimize_prompt(make_reward(reward, base, train, task_prompt, format_prompt), candidates, settings,
                                 budget=budget, seed=seed, resume=saved["loop"],
                                 on_step=lambda state: keep("loop", state), progress=progress)
    on_hyper = make_reward(reward, base, hyper, task_prompt, format_prompt)
    scores = dict(saved["scores"])

    def score(text: str) -> tuple[float, int]:
        if text not in scores:
            scores[text] = list(on_hyper.score_all(text, settings.batch_size))
            keep("scores", scores)
        value, calls = scores[text]
        return value, calls

    prefix, origin, selection, calls = choose_prefix(trajectory.step_prefixes(), score)
    return BDPLResult(prefix, origin, trajectory, selection, calls)


# ---------------------------------------------------------------- where prompts and runs are stored


def is_learning_budget(profile: Profile, budget: int | None) -> bool:
    """One of the profile's ``bdpl_learning_budgets`` (other than its ``bdpl_budget``): its
    prompts and runs are stored beside the main budget's, under their own names."""
    return budget in (profile.wrapper.bdpl_learning_budgets or ()) and budget != profile.wrapper.bdpl_budget


def prompt_path(profile: Profile, dataset: str, model: str, seed: int, budget: int | None = None) -> Path:
    """The learned prompt's record (``calls<budget>-seed<k>.json`` at a learning budget)."""
    from ..running.run_store import runs_dir

    name = f"calls{budget}-seed{seed}.json" if is_learning_budget(profile, budget) else f"seed{seed}.json"
    return runs_dir(profile, dataset, model) / "bdpl-prompts" / name


def run_labels(profile: Profile, budget: int) -> tuple[str, str]:
    """The run labels of BDPL and BDPL + Plugin at ``budget`` calls ("BDPL@1200calls" at a
    learning budget)."""
    tag = f"@{budget}calls" if is_learning_budget(profile, budget) else ""
    return f"BDPL{tag}", f"BDPL+Plugin{tag}"
