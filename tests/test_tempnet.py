"""TempNet (harness.baselines.tempnet): its loss, that its network learns a temperature other than 1,
that greedy TempNet is Zeroshot, and that sampled TempNet is seeded."""
from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
import torch

from plugin_lib.core.decode import generate
from plugin_lib.core.cache import BaseOutputCache
from plugin_lib.core.pairs import EncodedPair
from plugin_lib.core.train import TrainConfig, fit
from plugin_lib.harness import methods
from plugin_lib.harness.running import run_keys, runner
from plugin_lib.harness.profile import TempNetSettings, load_profile, profile_names
from plugin_lib.harness.baselines.tempnet import (TempNet, TempNetObjective, cache_temperatures, make_tempnet,
                                                  tempnet_generate, tempnet_loss)

# ---------------------------------------------------------------- the loss


def test_loss_is_the_dro_formula_on_a_hand_example():
    z, y, tau, rho = [2.0, 0.0, -1.0], 1, 0.5, 0.7
    # tau * CE(z / tau, y) + tau * (rho - log V), written out
    log_sum = math.log(sum(math.exp(v / tau) for v in z))
    expected = tau * (log_sum - z[y] / tau) + tau * (rho - math.log(3))
    got = tempnet_loss(torch.tensor([z]), torch.tensor([y]), torch.tensor([tau]), rho)
    assert got.item() == pytest.approx(expected, rel=1e-6)
    assert tempnet_loss(torch.tensor([z]), torch.tensor([y]), torch.tensor([tau]), None).item() == pytest.approx(
        log_sum - z[y] / tau, rel=1e-6)  # rho None: plain NLL of z / tau


def test_the_dro_loss_moves_tau_by_rho_minus_the_kl_from_uniform_whatever_the_label():
    torch.manual_seed(0)
    z = torch.randn(5, 12) * 3
    rho = 1.3
    grads = []
    for labels in (torch.zeros(5, dtype=torch.long), torch.arange(5)):
        tau = torch.full((5,), 0.8, requires_grad=True)
        tempnet_loss(z, labels, tau, rho).sum().backward()
        grads.append(tau.grad)
    p = torch.softmax(z / 0.8, -1)
    kl_from_uniform = (p * (p * 12).log()).sum(-1)
    torch.testing.assert_close(grads[0], rho - kl_from_uniform)
    torch.testing.assert_close(grads[0], grads[1])


# ---------------------------------------------------------------- it learns a temperature that is not 1

VOCAB, TOKENS = 16, 16
# Two kinds of input; the base is 3x too confident on the first and 2x too flat on the second,
# so the NLL-optimal temperatures are 3 and 0.5.
_g = torch.Generator().manual_seed(0)
TRUE_LOGITS = [2 * torch.randn(VOCAB, generator=_g) for _ in range(2)]
BASE_SCALE = [3.0, 0.5]


def synthetic(n: int, seed: int) -> tuple[list[EncodedPair], BaseOutputCache, torch.Tensor]:
    """n inputs alternating between the two kinds: TOKENS labels each, drawn from the true
    distribution, and the base's log-probabilities (the cache) at every position."""
    g = torch.Generator().manual_seed(seed)
    pairs, rows, kinds = [], [], []
    for i in range(n):
        kind = i % 2
        labels = torch.multinomial(torch.softmax(TRUE_LOGITS[kind], -1), TOKENS, replacement=True, generator=g)
        pairs.append(EncodedPair((0, *labels.tolist()), prompt_length=1))
        rows.append(torch.log_softmax(BASE_SCALE[kind] * TRUE_LOGITS[kind], -1).expand(TOKENS, VOCAB))
        kinds.append(kind)
    return pairs, BaseOutputCache(torch.cat(rows), np.arange(n + 1) * TOKENS), torch.tensor(kinds)


def best_constant_tau(pairs, cache, kinds, kind: int, rho: float | None) -> float:
    """The loss's minimiser over one temperature for all inputs of ``kind``: a 1-D search."""
    chosen = [i for i in range(len(pairs)) if kinds[i] == kind]
    logits = cache.get(chosen).float()
    labels = torch.tensor([t for i in chosen for t in pairs[i].input_ids[1:]])
    grid = torch.linspace(0.05, 5.0, 2000)
    losses = torch.stack([tempnet_loss(logits, labels, torch.full((len(labels),), float(t)), rho).mean()
                          for t in grid])
    return float(grid[losses.argmin()])


@pytest.mark.parametrize("rho", [None, 1.0], ids=["nll", "dro"])
def test_the_network_recovers_the_optimal_temperature_of_each_kind_of_input(rho):
    torch.set_num_threads(1)
    train, hyper = synthetic(128, seed=1), synthetic(128, seed=2)
    torch.manual_seed(0)
    net = TempNet(VOCAB, hidden_size=32, tau_min=0.05, tau_max=5.0)
    fit(net, TempNetObjective(train[0], 0, cache=train[1], rho=rho), TempNetObjective(hyper[0], 0, cache=hyper[1], rho=rho),
        TrainConfig(lr=3e-2, weight_decay=0.0, max_epochs=40, patience=40, batch_size=8, warmup_ratio=0.0),
        progress=False)
    learned = cache_temperatures(net, train[1])
    pairs, cache, kinds = train
    for kind in (0, 1):
        optimum = best_constant_tau(pairs, cache, kinds, kind, rho)
        if rho is None:  # the sample's NLL optimum is the true one, up to label noise
            assert optimum == pytest.approx(BASE_SCALE[kind], rel=0.10)
        # Within 10%: the two kinds' optima differ six-fold, DRO's and NLL's (below) by a third.
        assert learned[kinds == kind].mean().item() == pytest.approx(optimum, rel=0.10)
    if rho is not None:  # the DRO loss has its own optimum: not the calibrating one
        assert best_constant_tau(pairs, cache, kinds, 0, None) > 1.25 * best_constant_tau(pairs, cache, kinds, 0, rho)


def test_fit_refuses_a_network_over_another_vocabulary():
    pairs, cache, _ = synthetic(4, seed=3)
    objective = TempNetObjective(pairs, 0, cache=cache)
    with pytest.raises(ValueError, match=rf"TempNet reads {VOCAB + 1} logits .* scores {VOCAB} tokens.*make_tempnet"):
        fit(TempNet(VOCAB + 1, hidden_size=4, tau_min=0.5, tau_max=2.0), objective, objective,
            TrainConfig(max_epochs=1), progress=False)


# ---------------------------------------------------------------- settings and decoding


def test_every_profile_has_typed_tempnet_settings():
    for name in profile_names():
        settings = load_profile(name).tempnet
        assert isinstance(settings, TempNetSettings) and 0 < settings.tau_min < settings.tau_max
    with pytest.raises(ValueError, match="tau_min < tau_max"):
        make_tempnet(10, dataclasses.replace(load_profile("smoke").tempnet, tau_min=2.0, tau_max=1.0), seed=0)


def _tempnet_at(vocab_size: int, tau: float, tau_min: float = 0.05, tau_max: float = 3.0) -> TempNet:
    """A TempNet whose output is ``tau`` for every input (its last layer's bias set to it)."""
    net = TempNet(vocab_size, hidden_size=8, tau_min=tau_min, tau_max=tau_max).eval()
    with torch.no_grad():
        net.last.weight.zero_()
        net.last.bias.fill_(math.log((tau - tau_min) / (tau_max - tau)))  # the inverse of the scaled sigmoid
    return net


@pytest.mark.parametrize("tau", [0.06, 0.7, 2.9])
def test_greedy_tempnet_is_zeroshot_at_any_temperature(tiny_base, prompts, tau):
    net = _tempnet_at(tiny_base.vocab_size, tau)
    settings = dict(max_new_tokens=8, repetition_penalty=1.1, batch_size=2, progress=False)
    greedy, temperatures = tempnet_generate(tiny_base, prompts, net, seed=0, do_sample=False, **settings)
    assert temperatures == pytest.approx([tau] * len(prompts), rel=1e-4)
    assert greedy == generate(tiny_base, prompts, None, **settings)


def test_sampled_tempnet_is_seeded_and_uses_its_temperature(toy_task, tiny_base):
    toy_task.tempnet = load_profile("smoke").tempnet
    decoding = load_profile("smoke").decoding
    net = _tempnet_at(tiny_base.vocab_size, 2.9)
    first = methods.predict(toy_task, "TempNet", net, 0, decoding, progress=False)
    assert methods.predict(toy_task, "TempNet", net, 0, decoding, progress=False) == first
    others = [methods.predict(toy_task, "TempNet", net, seed, decoding, progress=False) for seed in (1, 2, 3)]
    assert any(o != first for o in others)
    zeroshot = methods.predict(toy_task, "Zeroshot", None, 0, decoding, progress=False)
    assert methods.predict(toy_task, "TempNet-greedy", None, 0, decoding, progress=False) == zeroshot


def test_tempnet_runs_through_the_runner_and_its_settings_make_runs_stale(tiny_profile, toy_task, monkeypatch):
    monkeypatch.setattr(runner, "compute_metrics", lambda predictions, references: {})  # not under test here
    toy_task.tempnet = tiny_profile.tempnet
    record = runner.run_experiment(toy_task, "TempNet", 0, tiny_profile, progress=False)
    assert len(record["predictions"]) == len(toy_task.test) and record["training"]["history"]
    zeroshot = run_keys.settings_fingerprint(toy_task, tiny_profile, method="Zeroshot")
    assert run_keys.settings_fingerprint(toy_task, tiny_profile, method="TempNet") != zeroshot
    toy_task.tempnet = dataclasses.replace(tiny_profile.tempnet, rho=9.0)
    assert run_keys.settings_fingerprint(toy_task, tiny_profile, method="TempNet") != record["settings"]
    assert run_keys.settings_fingerprint(toy_task, tiny_profile, method="Zeroshot") == zeroshot
    with pytest.raises(ValueError, match="no TempNet settings"):
        methods.build_model(dataclasses.replace(toy_task, tempnet=None), "TempNet", {}, seed=0)


def test_the_runner_reads_greedy_tempnet_from_the_zeroshot_run(tiny_profile, toy_task, monkeypatch):
    monkeypatch.setattr(runner, "compute_metrics", lambda predictions, references: {})  # not under test here
    zeroshot = runner.run_experiment(toy_task, "Zeroshot", 0, tiny_profile, progress=False)
    decoded = []
    monkeypatch.setattr(methods, "predict", lambda *args, **kwargs: decoded.append(args[1]) or [])
    greedy = runner.run_experiment(toy_task, "TempNet-greedy", 0, tiny_profile, progress=False)
    assert decoded == []  # nothing decoded again
    assert greedy["predictions"] == zeroshot["predictions"] and greedy["method"] == "TempNet-greedy"


# ---------------------------------------------------------------- one temperature per token (issue 25)


def test_per_token_training_scales_every_row_by_its_own_temperature():
    torch.manual_seed(0)
    pairs = [EncodedPair(input_ids=[1, 2, 3, 4, 5], prompt_length=2), EncodedPair(input_ids=[6, 7, 8], prompt_length=1)]
    rows = torch.randn(5, VOCAB) * 2  # 3 target rows of the first pair, 2 of the second
    cache = BaseOutputCache(rows, np.array([0, 3, 5]))
    net = make_tempnet(VOCAB, TempNetSettings(rho=1.0, tau_min=0.1, tau_max=3.0, hidden_size=8, top_p=1.0, top_k=0),
                       seed=0).eval()
    targets = torch.tensor([3, 4, 5, 7, 8])
    per_token = TempNetObjective(pairs, 0, cache=cache, rho=1.0, per_token=True).nll(net, [0, 1])[0]
    expected = tempnet_loss(rows, targets, net(rows), 1.0).sum()
    torch.testing.assert_close(per_token, expected)
    per_input = TempNetObjective(pairs, 0, cache=cache, rho=1.0).nll(net, [0, 1])[0]
    tau = net(rows[[0, 3]]).repeat_interleave(torch.tensor([3, 2]))
    torch.testing.assert_close(per_input, tempnet_loss(rows, targets, tau, 1.0).sum())


def test_per_token_decoding_reads_every_step_and_applies_the_generation_temperature(tiny_base):
    from plugin_lib.core.combine import temperature_log_probs
    from plugin_lib.harness.baselines.tempnet import TempNetLogitsProcessor

    torch.manual_seed(1)
    net = make_tempnet(tiny_base.vocab_size, TempNetSettings(rho=1.0, tau_min=0.1, tau_max=3.0, hidden_size=8,
                                                             top_p=1.0, top_k=0), seed=3).eval()
    ids = torch.tensor([[5, 6, 7]])
    steps = [torch.randn(1, tiny_base.vocab_size) * s for s in (1.0, 4.0)]
    per_token = TempNetLogitsProcessor(net, None, per_token=True, temperature=0.6)
    per_input = TempNetLogitsProcessor(net, None, temperature=0.6)
    for scores in steps:
        torch.testing.assert_close(per_token(ids, scores), temperature_log_probs(scores, net(scores) * 0.6))
        torch.testing.assert_close(per_input(ids, scores), temperature_log_probs(scores, net(steps[0]) * 0.6))
    torch.testing.assert_close(per_token.temperatures, (net(steps[0]) + net(steps[1])) / 2)


def test_greedy_per_token_tempnet_is_still_zeroshot(tiny_base, prompts):
    net = make_tempnet(tiny_base.vocab_size, TempNetSettings(rho=1.0, tau_min=0.1, tau_max=3.0, hidden_size=8,
                                                             top_p=1.0, top_k=0), seed=0)
    settings = dict(max_new_tokens=8, repetition_penalty=1.1, batch_size=2, progress=False)
    greedy, _ = tempnet_generate(tiny_base, prompts, net, seed=0, do_sample=False, per_token=True, temperature=0.6,
                                 **settings)
    assert greedy == generate(tiny_base, prompts, None, **settings)


# ---------------------------------------------------------------- the control: the base sampled as TempNet samples


def test_a_fixed_temperature_gives_the_generation_configs_own_distribution(tiny_base):
    """With every temperature 1, TempNet's processor leaves the distribution that transformers'
    repetition penalty and generation temperature give (up to normalisation)."""
    from transformers import RepetitionPenaltyLogitsProcessor, TemperatureLogitsWarper

    from plugin_lib.harness.baselines.tempnet import FixedTemperature, TempNetLogitsProcessor

    torch.manual_seed(2)
    ids, scores = torch.tensor([[5, 6, 7], [8, 9, 9]]), torch.randn(2, tiny_base.vocab_size) * 3
    ours = TempNetLogitsProcessor(FixedTemperature(), 1.1, per_token=True, temperature=0.6)(ids, scores.clone())
    theirs = TemperatureLogitsWarper(0.6)(ids, RepetitionPenaltyLogitsProcessor(1.1)(ids, scores.clone()))
    torch.testing.assert_close(ours.softmax(-1), theirs.softmax(-1))


def test_the_sampled_base_control_is_stored_per_seed_and_reused(tiny_profile, toy_task, monkeypatch):
    from plugin_lib.experiments import main_tables

    monkeypatch.setattr(main_tables, "compute_metrics", lambda predictions, references: {"BLEU": 0.0})
    toy_task.tempnet = dataclasses.replace(tiny_profile.tempnet, temperature=0.6, per="token")
    runs = main_tables.sampled_base_runs(tiny_profile, toy_task)
    assert [r["seed"] for r in runs] == list(tiny_profile.seeds)
    assert runs[0]["predictions"] == methods.predict(toy_task, "TempNet", main_tables.FixedTemperature(),
                                                     tiny_profile.seeds[0], tiny_profile.decoding, progress=False)
    monkeypatch.setattr(methods, "predict", lambda *args, **kwargs: pytest.fail("decoded again"))
    assert main_tables.sampled_base_runs(tiny_profile, toy_task) == runs
