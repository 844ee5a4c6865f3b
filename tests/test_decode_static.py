"""Decoding from static KV caches (``decode.generate(static_cache=True)``) gives today's tokens.

On a GPU the static path's steps run as CUDA graphs; here, on the CPU, the same caches, masks and
positions run eagerly, and once compiled (torch.compile with inductor), so that what a GPU
session replays is the code these tests check.
"""
from __future__ import annotations

import dataclasses
import functools

import pytest
import torch

from plugin_lib.core.combine import mixture_log_probs
from plugin_lib.core.decode import STATIC_PAD, PluginLogitsProcessor, compiled_step, generate, has_static_cache


def _pair(base, prompts, rw, **kwargs):
    dynamic = generate(base, prompts, rw, progress=False, **kwargs)
    static = generate(base, prompts, rw, progress=False, static_cache=True, **kwargs)
    return dynamic, static


@pytest.mark.parametrize("arch", ["llama", "gpt2", "mlp"])
def test_static_cache_gives_the_same_tokens(tiny_base, small_reweighter, prompts, arch):
    """The Plugin with the repetition penalty, in batches of uneven prompts (left padding to
    STATIC_PAD added): the static path's texts are the dynamic path's."""
    rw = small_reweighter(arch, n_layer=1)
    dynamic, static = _pair(tiny_base, prompts, rw, batch_size=2, max_new_tokens=12, repetition_penalty=1.1)
    assert static == dynamic and all(dynamic)
    assert has_static_cache(rw) == (arch != "mlp")  # the context-free model keeps its own path
    # The reweighting model changes the output: the comparison is not of the base with itself.
    assert dynamic != generate(tiny_base, prompts, None, batch_size=2, max_new_tokens=12, progress=False)


def test_static_cache_for_the_base_alone_and_weightedcomb(tiny_base, small_reweighter, prompts):
    dynamic, static = _pair(tiny_base, prompts, None, max_new_tokens=10)
    assert static == dynamic and all(dynamic)
    mixture = functools.partial(mixture_log_probs, alpha=0.5)
    dynamic, static = _pair(tiny_base, prompts, small_reweighter("llama"), max_new_tokens=10, combine=mixture)
    assert static == dynamic


@pytest.mark.parametrize("search", [{"num_beams": 3}, {"do_sample": True, "top_p": 0.9}])
def test_static_cache_with_beam_search_and_sampling(tiny_base, small_reweighter, prompts, search):
    """Beam search reorders the rows of both caches between steps; sampling draws from p_t."""
    rw = small_reweighter("llama")
    torch.manual_seed(0)
    dynamic = generate(tiny_base, prompts, rw, max_new_tokens=8, progress=False, **search)
    torch.manual_seed(0)
    assert generate(tiny_base, prompts, rw, max_new_tokens=8, progress=False, static_cache=True, **search) == dynamic


def test_static_cache_on_the_real_model(smollm2, small_reweighter, prompts):
    """SmolLM2 (30 layers, grouped-query attention) as the base: its near-ties are real ones."""
    dynamic, static = _pair(smollm2, prompts, small_reweighter("llama"), max_new_tokens=16, repetition_penalty=1.1)
    assert static == dynamic and all(dynamic)


def test_the_processor_refuses_to_go_past_its_static_length(tiny_base, small_reweighter, prompts):
    rw = small_reweighter("llama")
    enc = tiny_base.tokenizer(prompts, return_tensors="pt", padding=True)
    processor = PluginLogitsProcessor(rw, enc.attention_mask, static_length=enc.input_ids.shape[1] + 2)
    with pytest.raises(RuntimeError, match="static cache's"):
        tiny_base.generate(enc.input_ids, enc.attention_mask, logits_processor=[processor], max_new_tokens=5,
                           do_sample=False)


def test_the_compiled_step_gives_the_same_tokens(tiny_base, small_reweighter, prompts):
    """The reweighting model's one-token step compiled as a GPU session compiles it (on a GPU,
    reduce-overhead also captures it in CUDA graphs). Prompts padded to one STATIC_PAD bucket:
    one compilation."""
    rw = small_reweighter("llama")
    enc = tiny_base.tokenizer(prompts, return_tensors="pt", padding=True, pad_to_multiple_of=STATIC_PAD)
    length = enc.input_ids.shape[1] + 8

    def decode(step):
        processor = PluginLogitsProcessor(rw, enc.attention_mask, repetition_penalty=1.1, static_length=length,
                                          step=step)
        return tiny_base.generate(enc.input_ids, enc.attention_mask, logits_processor=[processor],
                                  max_new_tokens=8, do_sample=False)

    dynamic = tiny_base.generate(enc.input_ids, enc.attention_mask, max_new_tokens=8, do_sample=False,
                                 logits_processor=[PluginLogitsProcessor(rw, enc.attention_mask, repetition_penalty=1.1)])
    torch._dynamo.reset()
    assert torch.equal(decode(None), dynamic)
    assert torch.equal(decode(compiled_step(rw)), dynamic)


def test_the_profile_turns_it_on_for_a_base_on_a_gpu_only(toy_task, small_reweighter):
    """``static_decoding: gpu`` reaches ``generate`` through the task; a task on a CPU base
    keeps the dynamic cache, and a task told to use it decodes the same texts."""
    from plugin_lib.harness import methods
    from plugin_lib.harness.profile import Decoding, load_profile

    profile = load_profile("smoke", static_decoding="gpu")
    assert profile.static_decoding == "gpu"
    with pytest.raises(ValueError, match="static_decoding"):
        load_profile("smoke", static_decoding="yes")
    decoding = Decoding(max_new_tokens=6, repetition_penalty=1.1, batch_size=2)
    rw = small_reweighter("llama")
    dynamic = methods.predict(toy_task, "Plugin", rw, 0, decoding, progress=False)
    static = methods.predict(dataclasses.replace(toy_task, static_decoding=True), "Plugin", rw, 0, decoding,
                             progress=False)
    assert static == dynamic and all(dynamic)
