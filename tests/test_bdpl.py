"""BDPL: simplex projection, candidate n-grams, budget, determinism, learning on a toy reward."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from plugin_lib.harness.bdpl import (
    ApiBudget,
    BudgetExhausted,
    LoglikReward,
    RougeLReward,
    candidate_ngrams,
    optimize_prompt,
    policy_gradient,
    prefixed_prompts,
    project_to_simplex,
    step_sizes,
    train_bdpl,
)
from plugin_lib.data import Example
from plugin_lib.core.decode import generate

CANDIDATES = [f"w{i}" for i in range(10)]
BEST = "w3"


class ToyReward:
    """Fraction of prompt positions holding ``BEST``; counts its calls."""

    def __init__(self, items: int = 20):
        self.items = items
        self.calls = 0

    def __len__(self) -> int:
        return self.items

    def __call__(self, prefix: str, indices) -> float:
        assert len(indices) == min(8, self.items) and len(set(indices)) == len(indices)
        self.calls += 1
        words = prefix.split(" ")
        return sum(w == BEST for w in words) / len(words)


def test_projection_lands_on_the_simplex_and_is_idempotent():
    rng = np.random.default_rng(0)
    values = rng.normal(size=(6, 9)) * 3
    projected = project_to_simplex(values)
    assert projected.shape == values.shape
    assert (projected >= 0).all()
    np.testing.assert_allclose(projected.sum(axis=1), 1.0, atol=1e-12)
    np.testing.assert_allclose(project_to_simplex(projected), projected, atol=1e-12)


def test_projection_by_hand():
    # Sum 0.8: the missing 0.2 is shared equally by the three entries.
    np.testing.assert_allclose(project_to_simplex(np.array([0.4, 0.3, 0.1])), [0.4 + 0.2 / 3, 0.3 + 0.2 / 3, 0.1 + 0.2 / 3])
    # rho = 2, theta = (1 + 0.8 - 1) / 2 = 0.4: the first two lose 0.4, the negative one clips to 0.
    np.testing.assert_allclose(project_to_simplex(np.array([1.0, 0.8, -1.0])), [0.6, 0.4, 0.0], atol=1e-12)
    np.testing.assert_allclose(project_to_simplex(np.array([3.0, 0.0, 0.0])), [1.0, 0.0, 0.0])


def test_projection_is_the_closest_simplex_point():
    rng = np.random.default_rng(1)
    v = rng.normal(size=5)
    best = project_to_simplex(v)
    others = rng.dirichlet(np.ones(5), size=2000)
    assert np.linalg.norm(v - best) <= np.linalg.norm(v - others, axis=1).min() + 1e-12


def test_candidate_ngrams_by_hand():
    texts = ["New York city", "new york pizza!", "the city"]
    # Words: new 2, york 2, city 2, pizza 1, the 1 (8 in all); bigrams: 5 in all.
    # min_count=2 keeps only "new york"; frequent words (ties alphabetical) fill up.
    assert candidate_ngrams(texts, 3) == ["new york", "city", "new"]
    # PMI: new york = york pizza = the city = log((c/5) / (c1 c2 / 64)) = log 6.4 (ties by
    # count, then alphabet); york city = log 3.2.
    assert candidate_ngrams(texts, 4, min_count=1) == ["new york", "the city", "york pizza", "york city"]
    assert len(candidate_ngrams(texts, 100)) == 1 + 5  # every qualifying phrase and word, no more


def test_candidate_ngrams_trigrams():
    texts = ["price range is high", "price range is low", "the price range"]
    assert candidate_ngrams(texts, 1, max_n=3, min_count=2)[0] == "price range is"


def test_prefixed_prompts():
    assert prefixed_prompts("coffee shop", ["Describe:", "Facts:"]) == ["coffee shop Describe:", "coffee shop Facts:"]
    assert prefixed_prompts("", ["Describe:"]) == ["Describe:"]


def test_budget_counts_and_refuses_extra_calls():
    budget = ApiBudget(2)
    budget.spend()
    budget.spend()
    assert budget.used == 2 and budget.remaining == 0
    with pytest.raises(BudgetExhausted, match="2 calls"):
        budget.spend()
    assert budget.used == 2


@pytest.mark.parametrize("total, per_step", [(75, 5), (76, 5), (77, 5), (3, 5), (1, 5), (10, 3)])
def test_step_sizes_spend_the_budget_exactly(total, per_step):
    sizes = step_sizes(total, per_step)
    assert sum(sizes) == total
    assert all(s >= 2 for s in sizes) or sizes == [1]


@pytest.mark.parametrize("total", [75, 76, 77])
def test_training_stops_exactly_at_the_budget(total):
    reward = ToyReward()
    budget = ApiBudget(total)
    result = optimize_prompt(reward, CANDIDATES, budget=budget, prompt_length=3, samples_per_step=5)
    assert reward.calls == total == result.calls_used == budget.used
    assert result.history[-1]["calls_used"] == total
    assert sum(len(h["rewards"]) for h in result.history) == total
    with pytest.raises(BudgetExhausted):
        budget.spend()


def test_default_budget_is_the_papers_75_calls():
    reward = ToyReward()
    assert optimize_prompt(reward, CANDIDATES, prompt_length=2).calls_used == 75 == reward.calls


def test_seeded_runs_are_identical_and_seeds_differ():
    first = optimize_prompt(ToyReward(), CANDIDATES, prompt_length=3, seed=7)
    again = optimize_prompt(ToyReward(), CANDIDATES, prompt_length=3, seed=7)
    other = optimize_prompt(ToyReward(), CANDIDATES, prompt_length=3, seed=8)
    np.testing.assert_array_equal(first.probs, again.probs)
    assert first.history == again.history and first.prefix == again.prefix
    assert [h["prompts"] for h in first.history] != [h["prompts"] for h in other.history]


def test_policy_gradient_by_hand():
    probs = np.full((1, 4), 0.25)
    grad = policy_gradient(probs, [(0,), (2,)], [1.0, 0.0])
    # Mean reward 0.5: advantages +0.5 and -0.5, over p = 0.25, divided by n - 1 = 1.
    np.testing.assert_allclose(grad, [[2.0, 0.0, -2.0, 0.0]])


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_distribution_concentrates_on_the_best_candidate(seed):
    result = optimize_prompt(ToyReward(), CANDIDATES, prompt_length=3, budget=300, lr=0.1, seed=seed)
    best = CANDIDATES.index(BEST)
    assert result.indices == (best,) * 3
    assert result.prefix == " ".join([BEST] * 3)
    assert result.probs[:, best].min() > 0.6  # from 0.1 at the start
    np.testing.assert_allclose(result.probs.sum(axis=1), 1.0)
    assert np.mean(result.mean_rewards[-5:]) > np.mean(result.mean_rewards[:5]) + 0.3


def test_loglik_reward_is_the_mean_token_loglik_of_the_black_box(tiny_base):
    prompts = ["Describe the place:", "Facts: a | b | c"]
    references = ["A cosy pub.", "A is b of c."]
    reward = LoglikReward(tiny_base, prompts, references)
    value = reward("coffee shop", [1, 0])
    # By hand: per-token log-probs of each reference (and EOS) after "coffee shop <prompt>".
    tok = tiny_base.tokenizer
    total, count = 0.0, 0
    for prompt, ref in zip(prompts, references):
        p = tok(f"coffee shop {prompt}")["input_ids"]
        t = tok(ref, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
        log_probs = torch.log_softmax(tiny_base.logits(torch.tensor([p + t]))[0].float(), -1)
        total += sum(log_probs[len(p) - 1 + k, token].item() for k, token in enumerate(t))
        count += len(t)
    assert math.isclose(value, total / count, rel_tol=1e-4)
    assert value != pytest.approx(reward("", [1, 0]))  # the prefix reaches the black box


def test_rouge_reward_scores_the_prefixed_continuation(tiny_base):
    prompts = ["Describe the place:", "Facts: a | b | c"]
    continuations = generate(tiny_base, prefixed_prompts("coffee shop", prompts), max_new_tokens=6, progress=False)
    reward = RougeLReward(tiny_base, prompts, [[c, "unrelated words"] for c in continuations], max_new_tokens=6)
    assert reward("coffee shop", [0, 1]) == pytest.approx(1.0)  # the best reference is the output itself
    assert reward("", [0, 1]) < 1.0


@pytest.mark.parametrize("kind", ["loglik", "rougeL"])
def test_train_bdpl_end_to_end_on_a_tiny_black_box(tiny_base, kind):
    examples = [
        Example(f"e2e-validation-{i}", f"name[Place {i}], eatType[pub]", (f"Place {i} is a pub.", f"A pub, Place {i}."))
        for i in range(4)
    ]
    result = train_bdpl(
        tiny_base,
        examples,
        lambda e: f"Describe: {e.source}",
        reward=kind,
        num_candidates=6,
        prompt_length=2,
        budget=4,
        samples_per_step=2,
        batch_size=2,
    )
    assert result.calls_used == 4 and len(result.history) == 2
    assert len(result.candidates) == 6 and "is a" in result.candidates
    assert result.prefix == " ".join(result.candidates[i] for i in result.indices)


def test_unknown_reward_is_refused(tiny_base):
    with pytest.raises(ValueError, match="rougeL"):
        train_bdpl(tiny_base, [Example("x", "s", ("r",))], lambda e: e.source, reward="bleu")
