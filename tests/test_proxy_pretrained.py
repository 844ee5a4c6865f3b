"""Proxy-tuning with a pretrained expert and its anti-expert (issue 60): the pair decodes through
the KV-cached LogitsProcessor as the uncached loop does, a uniform anti-expert gives back the
expert alone, and the runner's ``-pretrained`` arms pair NewModel-pretrained's expert with the same
pretrained model untuned, beside the Plugin trained from that model."""
from __future__ import annotations

import functools

import torch

from plugin_lib.core.combine import proxy_combine
from plugin_lib.core.decode import PluginLogitsProcessor, greedy_decode_uncached
from plugin_lib.core.reweighter import ExpertDifference, PairCache, make_reweighter, reweighter_logits
from plugin_lib.harness import methods
from plugin_lib.harness.running import runner, search


def _small(vocab_size: int, seed: int, scale: float = 6.0):
    model = make_reweighter("llama", vocab_size, hidden_size=32, intermediate_size=64, seed=seed)
    with torch.no_grad():
        model.get_output_embeddings().weight.mul_(scale)  # far from uniform: the test is not vacuous
    return model.eval()


def test_a_pair_decodes_with_kv_caches_as_the_uncached_loop(tiny_base, prompts):
    pair = ExpertDifference(_small(tiny_base.vocab_size, 5), _small(tiny_base.vocab_size, 7))
    combine = functools.partial(proxy_combine, alpha=1.5)
    enc = tiny_base.tokenizer(prompts, return_tensors="pt", padding=True)
    cached = tiny_base.generate(
        enc.input_ids, enc.attention_mask, max_new_tokens=8, do_sample=False,
        logits_processor=[PluginLogitsProcessor(pair, enc.attention_mask, combine=combine)])
    reference = greedy_decode_uncached(tiny_base, enc.input_ids, enc.attention_mask, pair, max_new_tokens=8,
                                       combine=combine)
    assert torch.equal(cached, reference)
    expert_alone = greedy_decode_uncached(tiny_base, enc.input_ids, enc.attention_mask, pair.expert,
                                          max_new_tokens=8, combine=combine)
    assert not torch.equal(expert_alone, reference)  # the anti-expert changes the output


def test_a_uniform_anti_expert_gives_the_expert_alone(tiny_base, prompts):
    expert, uniform = _small(tiny_base.vocab_size, 5), _small(tiny_base.vocab_size, 7, scale=0.0)
    enc = tiny_base.tokenizer(prompts, return_tensors="pt", padding=True)
    pair_logits = reweighter_logits(ExpertDifference(expert, uniform), enc.input_ids, enc.attention_mask)
    expert_logits = reweighter_logits(expert, enc.input_ids, enc.attention_mask)
    base = torch.randn(pair_logits.shape) * 3
    for top_p in (None, 0.9):
        assert torch.allclose(proxy_combine(base, pair_logits, 0.7, top_p), proxy_combine(base, expert_logits, 0.7, top_p),
                              atol=1e-4)


def test_both_caches_follow_a_beam_reorder(tiny_base, prompts):
    pair = ExpertDifference(_small(tiny_base.vocab_size, 5), _small(tiny_base.vocab_size, 7))
    enc = tiny_base.tokenizer(prompts[:2], return_tensors="pt", padding=True)
    out = pair(input_ids=enc.input_ids, attention_mask=enc.attention_mask, use_cache=True)
    assert isinstance(out.past_key_values, PairCache)
    before = [c.layers[0].keys.clone() for c in out.past_key_values.caches]
    out.past_key_values.reorder_cache(torch.tensor([1, 0]))
    for cache, keys in zip(out.past_key_values.caches, before):
        assert torch.equal(cache.layers[0].keys, keys.flip(0))


def test_the_pretrained_arms_pair_the_tuned_expert_with_itself_untuned(task, profile, tmp_path):
    source = make_reweighter("llama", task.base.vocab_size, hidden_size=32, intermediate_size=64, seed=11)
    source.save_pretrained(tmp_path / "pretrained")
    arch = {"arch": "pretrained", "pretrained": str(tmp_path / "pretrained")}
    expert = runner.run_experiment(task, "NewModel", 0, profile, arch=arch, label="NewModel-pretrained", progress=False)
    plain = runner.run_experiment(task, "ProxyTuning", 0, profile, progress=False)
    paired = runner.run_experiment(task, "ProxyTuning", 0, profile, arch=arch, label="ProxyTuning-pretrained",
                                   progress=False)
    assert paired["method"] == "ProxyTuning-pretrained"
    assert {k: paired["hparams"][k] for k in ("lr", "weight_decay")} == expert["hparams"]
    losses, plain_losses = paired["training"]["alpha_hyper_losses"], plain["training"]["alpha_hyper_losses"]
    assert losses["0"] == plain_losses["0"]  # alpha 0: the base alone either way
    assert losses != plain_losses
    # The anti-expert is the pretrained model as saved: the pair's losses are the difference's.
    tuned = search.trained_model(task, "NewModel", profile, arch=arch, label="NewModel-pretrained")
    pair = methods.proxy_expert(task, tuned, arch, 0)
    untuned = make_reweighter("pretrained", task.base.vocab_size, pretrained=arch["pretrained"])
    assert all(torch.equal(a, b) for a, b in zip(pair.anti_expert.state_dict().values(), untuned.state_dict().values()))
    assert methods.choose_alpha(task, "ProxyTuning", pair, profile.proxy)[1] == losses
    # A later seed trains its own pretrained expert, kept apart from the uniform arm's.
    later = runner.run_experiment(task, "DExperts", 1, profile, arch=arch, label="DExperts-pretrained", progress=False)
    plain_later = runner.run_experiment(task, "DExperts", 1, profile, progress=False)
    assert later["training"]["history"] != plain_later["training"]["history"]


def test_the_plugin_and_the_expert_start_from_the_same_weights(task):
    arch = {"arch": "llama", "n_layer": 1, "hidden_size": 32, "intermediate_size": 64}
    plugin, expert = (methods.build_model(task, m, arch, 3) for m in ("Plugin", "NewModel"))
    assert all(torch.equal(a, b) for a, b in zip(plugin.state_dict().values(), expert.state_dict().values()))
