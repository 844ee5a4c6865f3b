"""Proxy-tuning and DExperts (issue 60): the combination as the authors write it
(alisawuffles/proxy-tuning, modeling/dexperts.py: base + alpha * (expert - antiexpert), DExperts'
base cut to its top-p nucleus first), decoded through the package's KV-cached LogitsProcessor,
and run by the runner over NewModel's own expert with alpha chosen on hyper-validation."""
from __future__ import annotations

import dataclasses
import functools

import pytest
import torch
from transformers import TopPLogitsWarper

from conftest import count_trainings
from plugin_lib.core.combine import nucleus_log_probs, proxy_combine, proxy_log_probs
from plugin_lib.core.decode import PluginLogitsProcessor, greedy_decode_uncached
from plugin_lib.core.reweighter import make_reweighter
from plugin_lib.core.train import TokenObjective
from plugin_lib.harness import methods
from plugin_lib.harness.running import run_keys, runner


def test_the_nucleus_is_transformers_top_p():
    torch.manual_seed(0)
    logits = torch.randn(6, 40) * 3
    for top_p in (0.3, 0.9, 0.99):
        ours = torch.isneginf(nucleus_log_probs(logits, top_p))
        theirs = torch.isneginf(TopPLogitsWarper(top_p)(None, logits.clone()))
        assert torch.equal(ours, theirs), top_p


def test_the_combination_is_the_authors_sum_of_raw_logits():
    torch.manual_seed(1)
    base, expert, anti = (torch.randn(3, 20) * 2 for _ in range(3))
    authors = torch.log_softmax(base + 1.5 * (expert - anti), dim=-1)  # modeling/dexperts.py
    difference = torch.log_softmax(expert, -1) - torch.log_softmax(anti, -1)
    assert torch.allclose(proxy_log_probs(base, difference, 1.5), authors, atol=1e-5)
    # A uniform anti-expert: the base times the expert to the power alpha; alpha 0 is the base.
    product = torch.log_softmax(torch.log_softmax(base, -1) + 0.5 * torch.log_softmax(expert, -1), -1)
    assert torch.allclose(proxy_combine(base, expert, 0.5), product, atol=1e-6)
    assert torch.allclose(proxy_combine(base, expert, 0.0), torch.log_softmax(base, -1), atol=1e-6)
    # DExperts: nothing outside the base's nucleus, however much the expert wants it.
    cut = proxy_combine(base, expert * 50, 2.0, top_p=0.9)
    assert torch.equal(torch.isneginf(cut), torch.isneginf(nucleus_log_probs(base, 0.9)))
    with pytest.raises(ValueError, match="alpha must be at least 0"):
        proxy_combine(base, expert, -1.0)


@pytest.mark.parametrize("top_p", [None, 0.9])
def test_kv_cached_decoding_equals_the_uncached_loop(tiny_base, prompts, top_p):
    from plugin_lib.core.reweighter import make_reweighter

    expert = make_reweighter("llama", tiny_base.vocab_size, hidden_size=32, intermediate_size=64, seed=5)
    with torch.no_grad():
        expert.get_output_embeddings().weight.mul_(6.0)  # an expert that disagrees with the base
    combine = functools.partial(proxy_combine, alpha=1.5, top_p=top_p)
    enc = tiny_base.tokenizer(prompts, return_tensors="pt", padding=True)
    cached = tiny_base.generate(
        enc.input_ids, enc.attention_mask, max_new_tokens=8, do_sample=False,
        logits_processor=[PluginLogitsProcessor(expert, enc.attention_mask, combine=combine, repetition_penalty=1.1)])
    reference = greedy_decode_uncached(tiny_base, enc.input_ids, enc.attention_mask, expert, max_new_tokens=8,
                                       repetition_penalty=1.1, combine=combine)
    assert torch.equal(cached, reference)
    base_only = greedy_decode_uncached(tiny_base, enc.input_ids, enc.attention_mask, max_new_tokens=8)
    assert not torch.equal(base_only, reference)  # the expert changes the output: the test is not vacuous


def test_the_arms_use_newmodels_expert_and_choose_alpha_on_hyper_validation(task, profile, monkeypatch):
    trained = []
    newmodel = runner.run_experiment(task, "NewModel", 0, profile, progress=False)
    count_trainings(monkeypatch, lambda hparams, seed: trained.append((hparams, seed)))
    for arm in methods.PROXY_ARMS:
        record = runner.run_experiment(task, arm, 0, profile, progress=False)
        losses = record["training"]["alpha_hyper_losses"]
        assert set(losses) == {"0"} | {f"{a:g}" for a in profile.proxy.alphas}  # 0: the base alone, never chosen
        assert losses[f"{record['hparams']['alpha']:g}"] == min(v for a, v in losses.items() if a != "0")
        assert record["hparams"]["top_p"] == (0.9 if arm == "DExperts" else None)
        assert {k: record["hparams"][k] for k in ("lr", "weight_decay")} == newmodel["hparams"]
        assert len(record["predictions"]) == len(task.test) and record["method"] == arm
    assert trained == []  # the first seed's expert is NewModel's stored one: nothing trained again
    second = runner.run_experiment(task, "ProxyTuning", 1, profile, progress=False)
    dexperts = runner.run_experiment(task, "DExperts", 1, profile, progress=False)
    # A later seed trains its expert as NewModel would, once for both arms.
    assert [seed for _, seed in trained] == [1]
    assert second["hparams"]["lr"] == newmodel["hparams"]["lr"] and second["training"] == {
        **dexperts["training"], "alpha_hyper_losses": second["training"]["alpha_hyper_losses"]}


@pytest.mark.parametrize("arm", methods.PROXY_ARMS)
def test_alpha_selection_runs_the_expert_once_a_batch_and_scores_as_one_alpha_at_a_time(task, profile, arm):
    """The expert's forward and the base's nucleus are shared by every alpha, and each alpha's
    hyper-validation loss is bit for bit the one a separate pass over the pairs gives."""
    expert = make_reweighter("llama", task.base.vocab_size, hidden_size=32, intermediate_size=64, seed=3)
    calls = []
    expert.get_input_embeddings().register_forward_hook(lambda *_: calls.append(1))
    settings = dataclasses.replace(profile.proxy, top_p=0.9999)  # the tiny base's 0.9 nucleus is one token
    alpha, losses = methods.choose_alpha(task, arm, expert, settings)
    hyper = task.encoded("hyper")
    assert len(calls) == -(-len(hyper) // 16)  # one forward a batch of 16, not one per alpha
    top_p = methods.proxy_top_p(arm, settings)

    def one_alpha(base, small, value):
        combined = proxy_log_probs(base, torch.log_softmax(small.float(), -1), value, top_p)
        return combined.masked_fill(torch.isneginf(combined), 0.0)

    for value in (0.0, *settings.alphas):
        objective = TokenObjective(hyper, task.base.tokenizer.pad_token_id, cache=task.base_cache("hyper"),
                                   log_probs=functools.partial(one_alpha, value=value))
        assert losses[f"{value:g}"] == objective.mean_nll(expert), value
    assert len(set(losses.values())) > 1  # the alphas differ: the comparison is not vacuous
    assert losses[f"{alpha:g}"] == min(v for a, v in losses.items() if a != "0")


def test_the_arms_runs_are_keyed_on_the_proxy_settings(task, profile):
    plain = run_keys.settings_fingerprint(task, profile, None, "NewModel")
    arm = run_keys.settings_fingerprint(task, profile, None, "ProxyTuning")
    other = run_keys.settings_fingerprint(task, profile.replace(proxy={"alphas": [1.0], "top_p": 0.9}), None,
                                        "ProxyTuning")
    assert len({plain, arm, other}) == 3
    assert run_keys.settings_fingerprint(task, profile.replace(proxy={"alphas": [1.0]}), None, "NewModel") == plain
