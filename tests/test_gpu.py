"""The paper profile's GPU path, on the full-size shape twins of its bases (``pytest -m gpu``).

Skipped where CUDA is absent. ``PLUGIN_GPU_TESTS_ON_CPU=1`` runs the same tests on the CPU
with the small twins instead (a dry run of the test code; it says nothing about a GPU).
Every comparison happens on one device, with the tolerance of its dtype (``devices.py``).
The metrics that need Java (METEOR, CIDEr's tokenizer) are never called here: a GPU machine
may have no Java. Twins have random weights: twin: says nothing about the paper's numbers.
"""
from __future__ import annotations

import dataclasses
import math
import os

import pytest
import torch
from devices import assert_forward_close

from plugin_lib.core.blackbox import TopKBlackBox
from plugin_lib.core.decode import PluginLogitsProcessor, greedy_decode_uncached
from plugin_lib.core.reweighter import make_reweighter
from plugin_lib.core.cache import (BaseOutputCache, cache_dtype, choose_placement, gpu_free_bytes, host_available_bytes,
                                   release_gpu_caches)
from plugin_lib.core.pairs import encode_pairs
from plugin_lib.core.train import TokenObjective, TrainConfig, fit
from plugin_lib.harness.baselines import bdpl, bdpl_rewards, lora
from plugin_lib.harness import models
from plugin_lib.harness.profile import load_profile

CUDA = torch.cuda.is_available()
DRY_RUN = os.environ.get("PLUGIN_GPU_TESTS_ON_CPU") == "1"
DEVICE = torch.device("cuda" if CUDA else "cpu")

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not (CUDA or DRY_RUN), reason="needs CUDA (run `pytest -m gpu` on a GPU machine)"),
]

# E2E-style meaning representations and references (no data folder needed).
PROMPTS = [
    "Given the following attributes, write a sentence. name[The Eagle], eatType[coffee shop], food[French]",
    "name[Aromi], eatType[restaurant], area[city centre]",
    "name[The Punter], priceRange[cheap], customer rating[average], familyFriendly[yes]",
    "name[Zizzi], eatType[pub], food[Italian], near[The Sorrento]",
    "name[Blue Spice], area[riverside]",
    "name[The Mill], eatType[coffee shop], food[Indian], priceRange[high], area[city centre], near[Café Rouge]",
    "name[Loch Fyne], food[Japanese]",
    "name[Cotto], customer rating[5 out of 5]",
]
TARGETS = [
    "The Eagle is a French coffee shop.", "Aromi is a restaurant in the city centre.",
    "The Punter is cheap and family friendly with an average rating.", "Zizzi is an Italian pub near The Sorrento.",
    "Blue Spice is by the riverside.", "The Mill is an expensive Indian coffee shop in the city centre.",
    "Loch Fyne serves Japanese food.", "Cotto has a rating of 5 out of 5.",
]


def twin(name: str) -> str:
    """The full-size twin on a GPU, its small sibling in a CPU dry run."""
    return name if CUDA else f"{name}-small"


def need_gpu_memory(gib: float) -> None:
    if CUDA and torch.cuda.get_device_properties(0).total_memory < gib * 2**30:
        pytest.skip(f"needs a GPU with at least {gib:.0f} GiB")


def free_gpu() -> None:
    release_gpu_caches()
    if CUDA:
        torch.cuda.empty_cache()


def spread(model: torch.nn.Module, factor: float = 25.0) -> torch.nn.Module:
    """Spread a reweighting model's logits so that it changes greedy choices."""
    with torch.no_grad():
        model.get_output_embeddings().weight.mul_(factor)
    return model.eval()


def plugin_greedy(base, reweighter, prompts, new_tokens, penalty=1.1):
    enc = base.tokenizer(prompts, return_tensors="pt", padding=True)
    out = base.generate(enc.input_ids, enc.attention_mask, max_new_tokens=new_tokens, do_sample=False,
                        min_new_tokens=new_tokens, pad_token_id=base.tokenizer.pad_token_id,
                        logits_processor=[PluginLogitsProcessor(reweighter, enc.attention_mask,
                                                                repetition_penalty=penalty)])
    return enc, out


# ---------------------------------------------------------------- dtype rules


def test_dtype_rules_on_this_machine():
    bf16 = CUDA and torch.cuda.is_bf16_supported()
    half = torch.bfloat16 if bf16 else torch.float16
    expected_llama = half if CUDA else torch.float32
    assert models.resolve_dtype("llama-3.1-8b", "auto", DEVICE) == expected_llama
    assert models.resolve_dtype("gpt2-xl", "auto", DEVICE) == (torch.float16 if CUDA else torch.float32)
    base = models.load_base_model(twin("llama-3.1-8b-twin"), dtype="auto")
    assert base.dtype == expected_llama and base.device.type == DEVICE.type
    assert cache_dtype(base.dtype) == (torch.float16 if CUDA else torch.float32)
    del base
    free_gpu()


# ---------------------------------------------------------------- decoding


def test_processor_matches_the_uncached_loop_in_float32_on_the_llama_twin():
    need_gpu_memory(40)  # 8B parameters in float32: 32 GB
    base = models.load_base_model(twin("llama-3.1-8b-twin"), dtype="float32", device=DEVICE)
    rw = spread(make_reweighter(vocab_size=base.vocab_size, seed=1, **models.arch_for("llama-3.1-8b")).to(DEVICE))
    enc, cached = plugin_greedy(base, rw, PROMPTS, new_tokens=24)
    reference = greedy_decode_uncached(base, enc.input_ids, enc.attention_mask, rw, max_new_tokens=24,
                                       min_new_tokens=24, repetition_penalty=1.1)
    assert cached.device == reference.device
    assert torch.equal(cached, reference)  # 8/8 rows, 24 tokens
    alone = greedy_decode_uncached(base, enc.input_ids, enc.attention_mask, max_new_tokens=24, min_new_tokens=24)
    assert not torch.equal(alone, reference)  # the reweighting model changes the output
    del base, rw
    free_gpu()


def test_batched_equals_one_by_one_on_the_gpt2_xl_twin():
    base = models.load_base_model(twin("gpt2-xl-twin"), dtype="float32", device=DEVICE)
    rw = spread(make_reweighter(vocab_size=base.vocab_size, seed=2, **models.arch_for("gpt2-xl")).to(DEVICE), 5.0)
    prompts = PROMPTS[:4]
    enc, batched = plugin_greedy(base, rw, prompts, new_tokens=16)
    width = enc.input_ids.shape[1]
    for row, prompt in enumerate(prompts):
        single_enc, single = plugin_greedy(base, rw, [prompt], new_tokens=16)
        assert torch.equal(batched[row, width:], single[0, single_enc.input_ids.shape[1]:]), f"row {row}"
    del base, rw
    free_gpu()


def test_left_padding_within_the_dtype_tolerance_on_the_half_twin():
    base = models.load_base_model(twin("gpt2-xl-twin"), dtype="auto", device=DEVICE)
    enc = base.tokenizer(PROMPTS[:2], return_tensors="pt", padding=True)
    batched = base.logits(enc.input_ids, enc.attention_mask)
    alone = base.logits(base.tokenizer(PROMPTS[1:2], return_tensors="pt").input_ids)
    assert_forward_close(batched[1, -alone.shape[1]:], alone[0], base.dtype)
    del base
    free_gpu()


# ---------------------------------------------------------------- the cache and training


def test_training_from_the_cache_on_the_gpu(tmp_path):
    base = models.load_base_model(twin("llama-3.1-8b-twin"), dtype="auto", device=DEVICE)
    pairs = encode_pairs(base.tokenizer, PROMPTS, TARGETS)
    cache = BaseOutputCache.build(base, pairs, directory=tmp_path, layout="full", progress=False)
    assert cache.dtype == cache_dtype(base.dtype)
    if CUDA:  # small next to the base: it stays on the GPU
        assert cache.placement == "gpu" and cache.rows.is_cuda
    rw = make_reweighter(vocab_size=base.vocab_size, seed=0, **models.arch_for("llama-3.1-8b")).to(DEVICE)
    train = TokenObjective(pairs[:6], base.tokenizer.pad_token_id,
                           cache=BaseOutputCache(cache.rows[: cache.offsets[6]], cache.offsets[:7], head=cache.head))
    hyper = TokenObjective(pairs, base.tokenizer.pad_token_id, cache=cache)
    before = hyper.mean_nll(rw)
    result = fit(rw, train, hyper, TrainConfig(lr=1e-3, max_epochs=3, batch_size=2), progress=False)
    assert math.isfinite(result.best_val_loss) and result.best_val_loss < before
    # The same loss from a host copy of the cache, on the same device as the model.
    host = BaseOutputCache(cache.get(range(len(cache))).cpu().clone(), cache.offsets)
    torch.testing.assert_close(TokenObjective(pairs, base.tokenizer.pad_token_id, cache=host).mean_nll(rw),
                               hyper.mean_nll(rw), atol=1e-5, rtol=1e-5)
    # Loading the next base moves GPU-held caches to host memory; training goes on from there.
    if CUDA:
        assert release_gpu_caches() > 0 and cache.placement in ("pinned", "memory") and not cache.rows.is_cuda
        assert math.isfinite(hyper.mean_nll(rw))
    del base, rw, cache, hyper, train
    free_gpu()


def test_the_compact_cache_on_the_gpu_gives_the_full_caches_loss(tmp_path):
    """The paper profile's layout on a GPU (core.cache): the LLaMA-8B twin's final hidden states,
    held on the GPU, give the full cache's loss within the half-precision cache's bound."""
    base = models.load_base_model(twin("llama-3.1-8b-twin"), dtype="auto", device=DEVICE)
    pairs = encode_pairs(base.tokenizer, PROMPTS, TARGETS)
    full = BaseOutputCache.build(base, pairs, layout="full", progress=False)
    compact = BaseOutputCache.build(base, pairs, directory=tmp_path, progress=False)  # auto
    if CUDA:
        assert compact.layout == "compact" and compact.placement == "gpu" and compact.head.device.type == "cuda"
    rw = make_reweighter(vocab_size=base.vocab_size, seed=0, **models.arch_for("llama-3.1-8b")).to(DEVICE)
    pad = base.tokenizer.pad_token_id
    losses = [TokenObjective(pairs, pad, cache=cache).mean_nll(rw) for cache in (full, compact)]
    assert abs(losses[0] - losses[1]) < (1e-3 if base.dtype != torch.float32 else 1e-5)
    del base, rw, full, compact
    free_gpu()


def test_cache_placement_with_this_machines_memory():
    if not CUDA:
        pytest.skip("measures the GPU's free memory")
    free, total = gpu_free_bytes(DEVICE)
    host = host_available_bytes()
    assert choose_placement(2**20, device_type="cuda", has_directory=True, gpu_free=free, gpu_total=total,
                            host_available=host) == "gpu"
    too_big = free + 2**30
    expected = "pinned" if host and too_big <= 0.5 * host else "mmap"
    assert choose_placement(too_big, device_type="cuda", has_directory=True, gpu_free=free, gpu_total=total,
                            host_available=host) == expected


# ---------------------------------------------------------------- LoRA, BDPL, top-k


def test_a_lora_step_on_the_device():
    model, tokenizer = models.load_causal_lm(twin("gpt2-xl-twin"), dtype="auto", device=DEVICE)
    peft_model = lora.add_lora(model, seed=0)
    adapters = {k: v.detach().clone() for k, v in peft_model.named_parameters() if v.requires_grad}
    frozen = {k: v.detach().clone() for k, v in peft_model.named_parameters()
              if not v.requires_grad and "c_attn.base_layer.weight" in k}
    assert adapters and all(v.device.type == DEVICE.type for v in adapters.values())
    pairs = encode_pairs(tokenizer, PROMPTS, TARGETS)
    objective = lora.lora_objective(pairs, tokenizer.pad_token_id)
    result = lora.fit_lora(peft_model, objective, objective, TrainConfig(lr=1e-3, max_epochs=1, batch_size=8),
                           progress=False)
    assert math.isfinite(result.best_val_loss)
    after = dict(peft_model.named_parameters())
    assert any(not torch.equal(after[k].detach(), v) for k, v in adapters.items() if "lora_B" in k)
    assert all(torch.isfinite(after[k]).all() for k in adapters)
    assert all(torch.equal(after[k].detach(), v) for k, v in frozen.items())  # the base stays frozen
    del model, peft_model
    free_gpu()


def test_a_bdpl_step_on_the_device():
    base = models.load_base_model(twin("gpt2-xl-twin"), dtype="auto", device=DEVICE)
    reward = bdpl_rewards.LoglikReward(base, PROMPTS, TARGETS)
    settings = dataclasses.replace(load_profile("paper").wrapper.bdpl, prompt_length=2, samples_per_step=2,
                                   batch_size=4)
    result = bdpl.optimize_prompt(reward, ["great food", "city centre", "family friendly", "coffee shop"],
                                  settings, budget=4, seed=0)
    assert result.calls_used == 4
    assert all(math.isfinite(r) for r in result.rewards_per_call)
    del base
    free_gpu()


def test_a_topk_view_on_the_device(tmp_path):
    base = models.load_base_model(twin("llama-3.1-8b-twin"), dtype="auto", device=DEVICE)
    ids = base.tokenizer(PROMPTS[:2], return_tensors="pt", padding=True)
    view = TopKBlackBox(base, 5, "renormalize")
    log_p = view.logits(ids.input_ids, ids.attention_mask)
    assert log_p.device.type == DEVICE.type
    assert (log_p.isfinite().sum(-1) == 5).all()
    residual = TopKBlackBox(base, 20, "residual").logits(ids.input_ids, ids.attention_mask)
    torch.testing.assert_close(residual.float().logsumexp(-1), torch.zeros(residual.shape[:2], device=residual.device),
                               atol=5e-2 if residual.dtype != torch.float32 else 1e-4, rtol=0)
    # The Plugin decodes over the view, and the view's cache keeps -inf in float16.
    rw = make_reweighter(vocab_size=base.vocab_size, seed=0, **models.arch_for("llama-3.1-8b")).to(DEVICE)
    _, out = plugin_greedy(view, rw, PROMPTS[:2], new_tokens=4)
    assert out.shape[1] == ids.input_ids.shape[1] + 4
    # Both layouts give the Plugin the view, never the full distribution: a compact cache stores
    # the base's states (shared by every view) and applies the top-k on reading.
    pairs = encode_pairs(base.tokenizer, PROMPTS[:2], TARGETS[:2])
    for layout in ("full", "compact"):
        cache = BaseOutputCache.build(view, pairs, layout=layout, progress=False)
        read = cache.get(range(len(pairs)))
        assert (read.isfinite().sum(-1) == 5).all() and read.isneginf().any(), layout
    del base, view, rw, cache
    free_gpu()
