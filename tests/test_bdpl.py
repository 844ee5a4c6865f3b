"""BDPL (harness.baselines.bdpl, after Diao et al.'s run_glue_discrete_LM.py): the estimator, the projection
against their bisection, the AdamW step, the budget, the final choice on hyper-validation with
the empty prompt, learning on a synthetic reward, candidate n-grams and the black-box rewards."""
from __future__ import annotations

import dataclasses
import json
import math

import numpy as np
import pytest
import torch

from plugin_lib.core.decode import generate
from plugin_lib.data import Example
from plugin_lib.harness.baselines.bdpl import (NO_PREFIX, ApiBudget, BudgetExhausted, candidate_ngrams, check_settings,
                                               choose_prefix, constrain_to_simplex, optimize_prompt, policy_gradient,
                                               step_sizes, train_bdpl, words)
from plugin_lib.harness.baselines.bdpl_rewards import LoglikReward, RougeLReward, prefixed_prompts
from plugin_lib.harness.profile import load_profile

PAPER = load_profile("paper").wrapper.bdpl  # 20 samples per step, lr 1e-4, weight decay 0.1, clip 3
CANDIDATES = [f"w{i}" for i in range(5)]
BEST = "w3"


def settings(**changes):
    return dataclasses.replace(PAPER, **changes)


class ToyReward:
    """Fraction of prompt positions holding ``BEST``; checks its minibatches and counts its calls."""

    def __init__(self, items: int = 20, batch_size: int = PAPER.batch_size):
        self.items, self.batch_size = items, batch_size
        self.calls = 0

    def __len__(self) -> int:
        return self.items

    def __call__(self, prefix: str, indices) -> float:
        assert len(indices) == min(self.batch_size, self.items) and len(set(indices)) == len(indices)
        self.calls += 1
        words = prefix.split(" ")
        return sum(w == BEST for w in words) / len(words)


def their_bisection(row: torch.Tensor) -> torch.Tensor:
    """Diao et al.'s solve_v_total_exact + constrainScoreByWholeExact on one row, as their code
    runs it: bisection for v in [0, max p], stop at |sum - 1| < 1e-3 or after 21 halvings."""
    low, high, rounds = 0.0, row.max().item(), 0
    while True:
        rounds += 1
        v = (low + high) / 2
        excess = (row - v).clamp(0, 1).sum().item() - 1
        if abs(excess) < 1e-3 or rounds > 20:
            break
        if excess < 0:
            high = v
        else:
            low = v
    return (row - v).clamp(0, 1)


# ---------------------------------------------------------------- the estimator


def test_policy_gradient_by_hand():
    probs = torch.tensor([[0.5, 0.25, 0.25], [0.2, 0.4, 0.4]], dtype=torch.float64)
    samples = [(0, 1), (0, 2), (1, 2)]
    losses = [3.0, 2.0, 1.0]
    # Mean loss 2: advantages +1, 0, -1; 1/(S-1) = 1/2. d_k = +1/p at the sampled index, -1/p elsewhere.
    # Position 0, 1/p = [2, 4, 4]: d_1 = [2, -4, -4], d_3 = [-2, 4, -4]; g = (d_1 - d_3) / 2 = [2, -4, 0].
    # Position 1, 1/p = [5, 2.5, 2.5]: d_1 = [-5, 2.5, -2.5], d_3 = [-5, -2.5, 2.5]; g = [0, 2.5, -2.5].
    grad = policy_gradient(probs, samples, losses)
    np.testing.assert_allclose(grad.numpy(), [[2.0, -4.0, 0.0], [0.0, 2.5, -2.5]])


def test_policy_gradient_is_twice_the_plain_estimator():
    """With the mean baseline the -1/p terms add up to the sampled ones (module docstring)."""
    rng = np.random.default_rng(0)
    probs = torch.tensor(rng.dirichlet(np.ones(7), size=3))
    samples = [tuple(int(i) for i in rng.integers(0, 7, size=3)) for _ in range(6)]
    losses = rng.normal(size=6).tolist()
    plain = torch.zeros_like(probs)
    for sample, loss in zip(samples, losses):
        for position, index in enumerate(sample):
            plain[position, index] += (loss - np.mean(losses)) / probs[position, index] / 5
    np.testing.assert_allclose(policy_gradient(probs, samples, losses).numpy(), 2 * plain.numpy(), atol=1e-12)


def test_a_zero_probability_gets_derivative_zero_not_inf():
    probs = torch.tensor([[0.5, 0.5, 0.0]], dtype=torch.float64)
    grad = policy_gradient(probs, [(0,), (1,)], [1.0, 0.0])
    assert torch.isfinite(grad).all() and grad[0, 2] == 0
    # Advantages +0.5, -0.5; 1/p = 2: d_1 = [2, -2, 0], d_2 = [-2, 2, 0]; g = (d_1 - d_2) / 2.
    np.testing.assert_allclose(grad.numpy(), [[2.0, -2.0, 0.0]])


def test_policy_gradient_refuses_bad_input():
    probs = torch.full((1, 3), 1 / 3, dtype=torch.float64)
    with pytest.raises(ValueError, match="two samples"):
        policy_gradient(probs, [(0,)], [1.0])
    with pytest.raises(ValueError, match="losses"):
        policy_gradient(probs, [(0,), (1,)], [1.0])


# ---------------------------------------------------------------- the projection


def test_projection_agrees_with_their_bisection():
    rng = np.random.default_rng(0)
    near_uniform = list(1 / 50 + rng.normal(scale=1e-4, size=(20, 50)))  # what a step of lr 1e-4 leaves
    rough = [np.abs(rng.normal(scale=0.4, size=9)) for _ in range(30)] + [rng.normal(size=9) for _ in range(30)]
    for row in near_uniform + rough:
        row = torch.tensor(row, dtype=torch.float64)
        ours = constrain_to_simplex(row[None].clone())[0]
        theirs = their_bisection(row)
        assert (ours >= 0).all()
        if row.clamp(0, 1).sum() >= 1:
            assert ours.sum().item() == pytest.approx(1.0, abs=1e-12)
            # Their answer is off by at most their own stopping error |sum - 1| (< 1e-3).
            assert (ours - theirs).abs().max().item() <= abs(theirs.sum().item() - 1) + 1e-12
        else:  # their v stays >= 0: the row is only clamped; theirs stops within its tolerance of v = 0
            torch.testing.assert_close(ours, row.clamp(0, 1), rtol=0, atol=0)
            assert (ours - theirs).abs().max().item() < 1e-3


def test_projection_by_hand():
    rows = torch.tensor([[1.0, 0.8, -1.0], [3.0, 0.0, 0.0], [0.4, 0.3, 0.1]], dtype=torch.float64)
    constrain_to_simplex(rows)  # in place
    # theta = (1 + 0.8 - 1) / 2 = 0.4; theta = 2; sum 0.8 < 1: v = 0, only clamped.
    np.testing.assert_allclose(rows.numpy(), [[0.6, 0.4, 0.0], [1.0, 0.0, 0.0], [0.4, 0.3, 0.1]], atol=1e-12)


def test_projection_is_the_closest_simplex_point_when_the_clamped_sum_exceeds_one():
    rng = np.random.default_rng(1)
    v = rng.normal(size=5) + 0.5
    assert np.clip(v, 0, 1).sum() >= 1
    best = constrain_to_simplex(torch.tensor(v)[None].clone())[0].numpy()
    others = rng.dirichlet(np.ones(5), size=2000)
    assert np.linalg.norm(v - best) <= np.linalg.norm(v - others, axis=1).min() + 1e-12


# ---------------------------------------------------------------- one step, the budget


def test_one_step_is_their_adamw_step_by_hand():
    """Uniform start, their gradient on the losses (-reward), clip at 3, AdamW's first step
    p <- p (1 - lr wd) - lr g / (|g| + eps), then the projection."""
    step = settings(samples_per_step=4, prompt_length=2, lr=0.01, clip_norm=0.5)
    trajectory = optimize_prompt(ToyReward(), CANDIDATES, step, budget=4, seed=3)
    (only,) = trajectory.history
    probs = torch.full((2, 5), 0.2, dtype=torch.float64)
    grad = policy_gradient(probs, only["prompts"], [-r for r in only["rewards"]])
    grad = grad * min(1.0, 0.5 / (grad.norm().item() + 1e-6))
    expected = probs * (1 - 0.01 * 0.1) - 0.01 * grad / (grad.abs() + 1e-8)
    constrain_to_simplex(expected)
    np.testing.assert_allclose(trajectory.probs, expected.numpy(), atol=1e-12)
    assert only["argmax"] == expected.argmax(dim=1).tolist()
    assert len(set(only["rewards"])) > 1  # a step that had something to learn from


def test_paper_budget_is_four_updates_of_twenty_twenty_twenty_fifteen():
    assert step_sizes(75, 20) == [20, 20, 20, 15]
    trajectory = optimize_prompt(ToyReward(), CANDIDATES, PAPER, budget=75)
    assert [len(h["prompts"]) for h in trajectory.history] == [20, 20, 20, 15]
    assert [h["calls_used"] for h in trajectory.history] == [20, 40, 60, 75]
    assert [origin for origin, _ in trajectory.step_prefixes()] == ["step 1", "step 2", "step 3", "step 4"]


@pytest.mark.parametrize("total, per_step", [(75, 20), (76, 5), (77, 5), (3, 5), (1, 5), (10, 3), (21, 20)])
def test_step_sizes_spend_the_budget_exactly(total, per_step):
    sizes = step_sizes(total, per_step)
    assert sum(sizes) == total
    assert all(s >= 2 for s in sizes) or sizes == [1]


def test_budget_counts_and_refuses_extra_calls():
    budget = ApiBudget(2)
    budget.spend()
    budget.spend()
    assert budget.used == 2 and budget.remaining == 0
    with pytest.raises(BudgetExhausted, match="2 calls"):
        budget.spend()
    assert budget.used == 2


@pytest.mark.parametrize("total", [75, 76, 1])
def test_training_never_exceeds_the_budget(total):
    reward = ToyReward()
    budget = ApiBudget(total)
    trajectory = optimize_prompt(reward, CANDIDATES, settings(prompt_length=3), budget=budget)
    assert reward.calls == total == trajectory.calls_used == budget.used
    assert len(trajectory.rewards_per_call) == total  # the reward of every call, in order
    assert trajectory.rewards_per_call == [r for h in trajectory.history for r in h["rewards"]]
    with pytest.raises(BudgetExhausted):
        budget.spend()


def test_a_shared_budget_stops_training_where_it_runs_out():
    budget = ApiBudget(30)
    budget.spend()
    trajectory = optimize_prompt(ToyReward(), CANDIDATES, PAPER, budget=budget)
    assert trajectory.calls_used == 30 and [len(h["prompts"]) for h in trajectory.history] == [20, 9]


def test_settings_are_checked():
    with pytest.raises(ValueError, match="samples_per_step"):
        check_settings(settings(samples_per_step=1))
    with pytest.raises(ValueError, match="lr"):
        optimize_prompt(ToyReward(), CANDIDATES, settings(lr=0.0))


def test_seeded_runs_are_identical_and_seeds_differ():
    first = optimize_prompt(ToyReward(), CANDIDATES, PAPER, seed=7)
    again = optimize_prompt(ToyReward(), CANDIDATES, PAPER, seed=7)
    other = optimize_prompt(ToyReward(), CANDIDATES, PAPER, seed=8)
    np.testing.assert_array_equal(first.probs, again.probs)
    assert first.history == again.history
    assert [h["prompts"] for h in first.history] != [h["prompts"] for h in other.history]


class Interrupt(Exception):
    """Stands for a process killed mid-search."""


class StopsAfter(ToyReward):
    """ToyReward that raises ``Interrupt`` on its call number ``calls_allowed + 1``."""

    def __init__(self, calls_allowed: int):
        super().__init__()
        self.calls_allowed = calls_allowed

    def __call__(self, prefix, indices):
        if self.calls >= self.calls_allowed:
            raise Interrupt
        return super().__call__(prefix, indices)


@pytest.mark.parametrize("killed_at", [0, 7, 33, 74])
def test_a_search_interrupted_and_resumed_ends_exactly_as_an_uninterrupted_one(killed_at):
    whole = optimize_prompt(ToyReward(), CANDIDATES, settings(prompt_length=3), budget=75, seed=4)
    saved = []  # what a checkpoint file would hold: the state after each step, through JSON
    with pytest.raises(Interrupt):
        optimize_prompt(StopsAfter(killed_at), CANDIDATES, settings(prompt_length=3), budget=75, seed=4,
                        on_step=lambda state: saved.append(json.loads(json.dumps(state))))
    reward = ToyReward()
    resumed = optimize_prompt(reward, CANDIDATES, settings(prompt_length=3), budget=75, seed=4,
                              resume=saved[-1] if saved else None)
    assert len(saved) == killed_at // 20  # steps of 20 calls completed before the kill
    assert reward.calls == 75 - 20 * len(saved)  # no paid call made twice
    np.testing.assert_array_equal(resumed.probs, whole.probs)
    assert resumed.history == whole.history and resumed.calls_used == whole.calls_used == 75


def test_a_saved_state_from_other_candidates_or_another_budget_is_refused():
    saved = []
    optimize_prompt(ToyReward(), CANDIDATES, PAPER, budget=40, seed=0, on_step=saved.append)
    with pytest.raises(ValueError, match="other candidate"):
        optimize_prompt(ToyReward(), CANDIDATES[:4], PAPER, budget=40, resume=saved[0])
    with pytest.raises(ValueError, match="75 calls"):
        optimize_prompt(ToyReward(), CANDIDATES, PAPER, budget=75, resume=saved[0])
    with pytest.raises(ValueError, match="seed 1"):
        optimize_prompt(ToyReward(), CANDIDATES, PAPER, budget=40, seed=1, resume=saved[0])
    with pytest.raises(ValueError, match="settings"):
        optimize_prompt(ToyReward(), CANDIDATES, settings(lr=0.5), budget=40, resume=saved[0])
    # The state handed out after a step does not change with later steps (its history is a copy).
    resumed = optimize_prompt(ToyReward(), CANDIDATES, PAPER, budget=40, resume=saved[0])
    assert resumed.history == optimize_prompt(ToyReward(), CANDIDATES, PAPER, budget=40).history


# ---------------------------------------------------------------- learning on a synthetic reward


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_papers_75_calls_raise_the_best_candidate_everywhere(seed):
    trajectory = optimize_prompt(ToyReward(), CANDIDATES, settings(prompt_length=3), budget=75, seed=seed)
    best = CANDIDATES.index(BEST)
    rows = trajectory.probs / trajectory.probs.sum(axis=1, keepdims=True)
    assert (rows[:, best] > 0.2 + 1e-4).all()  # from the uniform 0.2, by about lr per update
    assert (rows.argmax(axis=1) == best).all()
    assert trajectory.step_prefixes()[-1][1] == " ".join([BEST] * 3)


@pytest.mark.parametrize("seed", [0, 1])
def test_with_more_calls_and_a_larger_step_the_distribution_concentrates(seed):
    many = [f"w{i}" for i in range(10)]
    trajectory = optimize_prompt(ToyReward(), many, settings(prompt_length=3, lr=0.02), budget=600, seed=seed)
    rows = trajectory.probs / trajectory.probs.sum(axis=1, keepdims=True)
    assert rows[:, many.index(BEST)].min() > 0.9  # from 0.1
    per_call = trajectory.rewards_per_call
    assert np.mean(per_call[-60:]) > np.mean(per_call[:60]) + 0.5


def test_a_large_step_drives_entries_to_zero_without_nan():
    trajectory = optimize_prompt(ToyReward(), CANDIDATES, settings(prompt_length=2, lr=0.3, samples_per_step=5),
                                 budget=60, seed=0)
    assert (trajectory.probs == 0).any()  # their projection zeroes entries; -1/p would be -inf there
    assert np.isfinite(trajectory.probs).all()
    assert all(math.isfinite(r) for r in trajectory.rewards_per_call)


# ---------------------------------------------------------------- the final choice


def _scores(table: dict[str, float]):
    calls = []

    def score(prefix: str) -> tuple[float, int]:
        calls.append(prefix)
        return table[prefix], 3

    return score, calls


def test_choice_picks_the_empty_prompt_when_every_learned_prompt_is_worse():
    score, calls = _scores({"": -2.0, "a b": -2.5, "c d": -2.1})
    prefix, origin, rows, used = choose_prefix([("step 1", "a b"), ("step 2", "c d"), ("step 3", "c d")], score)
    assert (prefix, origin) == ("", NO_PREFIX)
    assert [row["origin"] for row in rows] == [NO_PREFIX, "step 1", "step 2", "step 3"]
    assert calls == ["", "a b", "c d"] and used == 9  # each distinct prefix scored once


def test_choice_picks_the_best_learned_prompt_and_the_empty_one_on_ties():
    score, _ = _scores({"": -2.0, "a b": -1.5, "c d": -1.9})
    assert choose_prefix([("step 1", "a b"), ("step 2", "c d")], score)[:2] == ("a b", "step 1")
    score, _ = _scores({"": -2.0, "a b": -2.0})
    assert choose_prefix([("step 1", "a b")], score)[:2] == ("", NO_PREFIX)
    score, _ = _scores({"": -2.0})
    assert choose_prefix([], score)[:2] == ("", NO_PREFIX)  # no update made: nothing learned


# ---------------------------------------------------------------- candidates and prompts


def test_candidate_ngrams_by_hand():
    texts = ["New York city", "new york pizza!", "the city"]
    # Words: new 2, york 2, city 2, pizza 1, the 1 (8 in all); bigrams: 5 in all.
    # min_count=2 keeps only "new york"; frequent words (ties alphabetical) fill up.
    assert candidate_ngrams(texts, 3) == ["new york", "city", "new"]
    # PMI: new york = york pizza = the city = log((c/5) / (c1 c2 / 64)) = log 6.4 (ties by
    # count, then alphabet); york city = log 3.2.
    assert candidate_ngrams(texts, 4, min_count=1) == ["new york", "the city", "york pizza", "york city"]
    assert len(candidate_ngrams(texts, 100)) == 1 + 5  # every qualifying phrase and word, no more


def test_words_keep_accented_letters_and_inner_apostrophes():
    assert words("Café Brazil's 5-star, near_by") == ["café", "brazil's", "5", "star", "near", "by"]


def test_candidate_ngrams_trigrams():
    texts = ["price range is high", "price range is low", "the price range"]
    assert candidate_ngrams(texts, 1, max_n=3, min_count=2)[0] == "price range is"


def test_prefixed_prompts():
    assert prefixed_prompts("coffee shop", ["Describe:", "Facts:"]) == ["coffee shop Describe:", "coffee shop Facts:"]
    assert prefixed_prompts("", ["Describe:"]) == ["Describe:"]


# ---------------------------------------------------------------- rewards from the black box


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
    # Over all items in minibatches: the same token-weighted mean, one call per minibatch.
    assert reward.score_all("coffee shop", 1) == (pytest.approx(value, rel=1e-4), 2)


def test_rouge_reward_scores_the_prefixed_continuation(tiny_base):
    prompts = ["Describe the place:", "Facts: a | b | c"]
    continuations = generate(tiny_base, prefixed_prompts("coffee shop", prompts), max_new_tokens=6, progress=False)
    reward = RougeLReward(tiny_base, prompts, [[c, "unrelated words"] for c in continuations], max_new_tokens=6)
    assert reward("coffee shop", [0, 1]) == pytest.approx(1.0)  # the best reference is the output itself
    assert reward("", [0, 1]) < 1.0
    assert reward.score_all("coffee shop", 1) == (pytest.approx(1.0), 2)


def _examples(start: int, count: int) -> list[Example]:
    return [Example(f"e2e-validation-{i}", f"name[Place {i}], eatType[pub]",
                    (f"Place {i} is a pub.", f"A pub, Place {i}.")) for i in range(start, start + count)]


@pytest.mark.parametrize("kind", ["loglik", "rougeL"])
def test_train_bdpl_never_ends_worse_than_no_prefix_on_hyper_validation(tiny_base, kind):
    train, hyper = _examples(0, 4), _examples(4, 3)
    small = settings(num_candidates=6, prompt_length=2, samples_per_step=2, batch_size=2)
    result = train_bdpl(tiny_base, train, hyper, lambda e: f"Describe: {e.source}", small, budget=4, reward=kind)
    trajectory = result.trajectory
    assert trajectory.calls_used == 4 and len(trajectory.history) == 2
    assert len(trajectory.candidates) == 6 and "is a" in trajectory.candidates
    origins = [row["origin"] for row in result.selection]
    assert origins[0] == NO_PREFIX and origins[1:] == ["step 1", "step 2"]
    # The empty prefix is scored exactly as Zeroshot's prompts, on every hyper-validation item.
    if kind == "loglik":
        zeroshot = LoglikReward(tiny_base, [f"Describe: {e.source}" for e in hyper for _ in e.references],
                                [r for e in hyper for r in e.references])
        assert result.selection[0]["hyper_reward"] == pytest.approx(zeroshot("", range(6)), rel=1e-4)
        assert result.selection_calls == len({row["prefix"] for row in result.selection}) * 3  # 6 pairs, 2 a call
    chosen = next(row for row in result.selection if row["origin"] == result.origin)
    assert chosen["prefix"] == result.prefix
    assert chosen["hyper_reward"] == max(row["hyper_reward"] for row in result.selection)
    assert chosen["hyper_reward"] >= result.selection[0]["hyper_reward"]


def test_train_bdpl_resumes_from_its_checkpoint_without_scoring_a_prefix_twice(tiny_base, monkeypatch):
    train, hyper = _examples(0, 4), _examples(4, 3)
    small = settings(num_candidates=6, prompt_length=2, samples_per_step=2, batch_size=2)
    args = (tiny_base, train, hyper, lambda e: f"Describe: {e.source}", small)
    checkpoints = []
    whole = train_bdpl(*args, budget=6, save_checkpoint=lambda c: checkpoints.append(json.loads(json.dumps(c))))
    assert [bool(c["scores"]) for c in checkpoints] == [False] * 3 + [True] * (len(checkpoints) - 3)
    scored = []
    real = LoglikReward.score_all
    monkeypatch.setattr(LoglikReward, "score_all", lambda self, text, b: scored.append(text) or real(self, text, b))
    after_one_score = checkpoints[3]  # the loop done, the empty prefix scored
    resumed = train_bdpl(*args, budget=6, checkpoint=after_one_score)
    assert "" not in scored and len(scored) == len({row["prefix"] for row in whole.selection}) - 1
    assert (resumed.prefix, resumed.origin, resumed.selection) == (whole.prefix, whole.origin, whole.selection)
    assert resumed.trajectory.history == whole.trajectory.history


def test_train_bdpl_refuses_an_unknown_reward_and_missing_data(tiny_base):
    with pytest.raises(ValueError, match="rougeL"):
        train_bdpl(tiny_base, _examples(0, 1), _examples(1, 1), lambda e: e.source, PAPER, reward="bleu")
    with pytest.raises(ValueError, match="hyper-validation"):
        train_bdpl(tiny_base, _examples(0, 1), [], lambda e: e.source, PAPER)
