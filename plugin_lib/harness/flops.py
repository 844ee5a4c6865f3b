"""FLOPs of inference up to 64 decoding steps, and trainable parameters (the paper's Table 8 text).

Counting: ``torch.utils.flop_counter.FlopCounterMode``, which counts matrix products only
(mm, addmm, bmm, attention kernels, convolutions), at 2 FLOPs per multiply-add. Element-wise
work (softmax, layer norms, the Plugin's product of distributions, about 3V FLOPs per token)
is not counted. FLOPs do not depend on the weights, so models may live on the meta device:
a GPT2-XL-shaped model then costs no memory, and counting its 64 steps takes seconds.

What is counted mirrors ``decode.generate`` (transformers' ``generate`` with KV caches, greedy):
for ``new_tokens`` tokens, one forward over the prompt that computes the output head at the
last position only, then ``new_tokens - 1`` forwards of one token each. The Plugin's
reweighting model follows the same pattern inside ``PluginLogitsProcessor`` (context-free
reweighters see one token per step). The tests check these counts against
``decode.generate`` itself.

Attention is counted under the eager implementation: FlopCounterMode has no formula for the
CPU's fused SDPA kernel, and SDPA cannot build its mask on meta tensors, so models are
switched to eager attention while they are counted (and switched back).

LoRA: counted unmerged, i.e. with the two low-rank products per adapted layer and token that
a PeftModel runs. Merged adapters cost nothing at inference, so a merged LoRA model costs
exactly what the base does.
"""
from __future__ import annotations

import functools
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode
from transformers import GPT2Config, GPT2LMHeadModel

from .. import paper as published
from ..core.reweighter import count_parameters, make_reweighter
from .baselines.lora import add_lora

GPT2_VOCAB_SIZE = 50257
# GPT2-XL's published shape; the weights are irrelevant to FLOPs.
GPT2_XL_SHAPE = {"n_embd": 1600, "n_layer": 48, "n_head": 25}


@contextmanager
def _eager_attention(model: nn.Module) -> Iterator[None]:
    """Run ``model`` with eager attention (countable), restoring its implementation afterwards."""
    hf_model = model.get_base_model() if hasattr(model, "get_base_model") else model
    config = getattr(hf_model, "config", None)
    if config is None or config._attn_implementation == "eager":
        yield
        return
    previous = config._attn_implementation
    hf_model.set_attn_implementation("eager")
    try:
        yield
    finally:
        hf_model.set_attn_implementation(previous)


def _device(model: nn.Module) -> torch.device:
    return next(model.parameters()).device


Counts = dict[str, int]


def _counted(forward) -> tuple[Counts, object]:
    """The FLOPs of one call, per aten op, and what it returned."""
    with FlopCounterMode(display=False) as counter:
        out = forward()
    return {str(op): n for op, n in counter.get_flop_counts().get("Global", {}).items()}, out


def _added(total: Counts, counts: Counts, times: int = 1) -> Counts:
    return {op: total.get(op, 0) + times * counts.get(op, 0) for op in total.keys() | counts.keys()}


def _prefill(model: nn.Module, length: int, batch: int):
    """The forward over a prompt of ``length`` (the output head at its last position alone), as
    ``decode.generate`` runs it; token ids are dummies (which token is chosen changes no FLOPs,
    and argmax on meta tensors is impossible anyway)."""
    mask = torch.ones((batch, length), dtype=torch.long, device=_device(model))
    return model(input_ids=torch.zeros_like(mask), attention_mask=mask, use_cache=True, logits_to_keep=1), mask


def _step(model: nn.Module, out, mask: torch.Tensor):
    """One cached decoding step after ``out``: one token, attending to every earlier position."""
    mask = torch.cat((mask, mask.new_ones(mask.shape[0], 1)), dim=1)
    step_ids = torch.zeros((mask.shape[0], 1), dtype=torch.long, device=mask.device)
    return model(input_ids=step_ids, attention_mask=mask, past_key_values=out.past_key_values, use_cache=True), mask


@torch.no_grad()
def _decoding_counts(model: nn.Module, prompt_length: int, new_tokens: int, batch: int) -> Counts:
    """The FLOPs of cached greedy decoding, per op.

    A step's matrix products are the same at every step but attention's, which grow by the same
    amount per position of the cache, so step ``i``'s count is ``c_1 + (i - 1) (c_2 - c_1)``. The
    prompt's forward and the first three steps are counted, then the last step alone (after a
    prompt one token shorter than the cache it then holds); only where the third and the last
    steps both equal that line are the steps between it. Otherwise (a sliding window, say)
    every step is counted. Counted step by step, GPT2-XL's comparison (three models, 64 steps
    each, on the meta device) took 51 s on one CPU thread; from the line, 5 s."""
    if getattr(model, "is_context_free", False):  # one token a step, whatever came before
        counts, _ = _counted(lambda: model(torch.zeros((batch, 1), dtype=torch.long, device=_device(model))))
        return _added({}, counts, new_tokens)
    total, (out, mask) = _counted(lambda: _prefill(model, prompt_length, batch))
    steps = []
    for _ in range(min(new_tokens - 1, 3)):
        counts, (out, mask) = _counted(lambda: _step(model, out, mask))
        steps.append(counts)
    if new_tokens - 1 <= 3:
        return functools.reduce(_added, steps, total)
    first, second, third = steps
    growth = {op: second.get(op, 0) - first.get(op, 0) for op in first.keys() | second.keys()}

    def line(i: int) -> Counts:
        return {op: first.get(op, 0) + (i - 1) * growth[op] for op in growth}

    last_prefill = _prefill(model, prompt_length + new_tokens - 2, batch)
    last, _ = _counted(lambda: _step(model, *last_prefill))
    if _nonzero(third) == _nonzero(line(3)) and _nonzero(last) == _nonzero(line(new_tokens - 1)):
        return functools.reduce(_added, (line(i) for i in range(1, new_tokens)), total)
    for _ in range(new_tokens - 1 - 3):  # not on the line: the rest of the steps, one by one
        counts, (out, mask) = _counted(lambda: _step(model, out, mask))
        steps.append(counts)
    return functools.reduce(_added, steps, total)


def _nonzero(counts: Counts) -> Counts:
    return {op: n for op, n in counts.items() if n}


def decoding_flops_by_op(
    model: nn.Module, *, prompt_length: int, new_tokens: int = 64, batch: int = 1
) -> dict[str, int]:
    """FLOPs of generating ``new_tokens`` tokens after a prompt, per counted aten op."""
    model.eval()
    with _eager_attention(model):
        return _nonzero(_decoding_counts(model, prompt_length, new_tokens, batch))


def decoding_flops(model: nn.Module, *, prompt_length: int, new_tokens: int = 64, batch: int = 1) -> int:
    """Total FLOPs of generating ``new_tokens`` tokens after a prompt of ``prompt_length``."""
    return sum(decoding_flops_by_op(model, prompt_length=prompt_length, new_tokens=new_tokens, batch=batch).values())


@dataclass(frozen=True)
class GenerationFlops:
    base: int
    reweighter: int = 0

    @property
    def total(self) -> int:
        return self.base + self.reweighter


def generation_flops(
    base_hf_model: nn.Module,
    reweighter: nn.Module | None = None,
    *,
    prompt_length: int,
    new_tokens: int = 64,
    batch: int = 1,
) -> GenerationFlops:
    """FLOPs of decoding with the base alone, the base + a reweighting model (Plugin), or a
    LoRA model passed as the base (its adapters counted unmerged)."""
    kwargs = {"prompt_length": prompt_length, "new_tokens": new_tokens, "batch": batch}
    base = decoding_flops(base_hf_model, **kwargs)
    return GenerationFlops(base, decoding_flops(reweighter, **kwargs) if reweighter is not None else 0)


def gpt2_xl_comparison(prompt_length: int = 1, new_tokens: int = 64, lora_rank: int = 8) -> dict[str, float]:
    """The paper's GPT2-XL numbers, recomputed on meta-device models of the published shapes.

    Plugin = GPT2-XL + the 1-layer GPT-2 reweighting model (``make_reweighter("gpt2")``, 768
    wide, GPT-2's vocabulary); LoRA = GPT2-XL with rank-``lora_rank`` adapters on ``c_attn``
    (``lora.add_lora``), unmerged. The base's FLOPs are also split into its blocks' linear
    layers, its output head and attention, the parts that explain the paper's figures; the
    paper's own numbers come along as ``paper_*``. Takes about 5 seconds on a CPU.
    """
    with torch.device("meta"):
        base = GPT2LMHeadModel(GPT2Config(**GPT2_XL_SHAPE))
        lora_base = GPT2LMHeadModel(GPT2Config(**GPT2_XL_SHAPE))
        reweighter = make_reweighter("gpt2", GPT2_VOCAB_SIZE)
    lora_model = add_lora(lora_base, r=lora_rank)
    kwargs = {"prompt_length": prompt_length, "new_tokens": new_tokens}
    base_ops = decoding_flops_by_op(base, **kwargs)
    base_flops = sum(base_ops.values())
    reweighter_flops = decoding_flops(reweighter, **kwargs)
    return {
        "prompt_length": prompt_length,
        "new_tokens": new_tokens,
        "base_flops": base_flops,
        # In GPT-2 the blocks' layers (Conv1D) run addmm, the output head (no bias) mm, and
        # eager attention bmm.
        "base_block_linear_flops": base_ops.get("aten.addmm", 0),
        "base_head_flops": base_ops.get("aten.mm", 0),
        "base_attention_flops": base_ops.get("aten.bmm", 0),
        "reweighter_flops": reweighter_flops,
        "plugin_flops": base_flops + reweighter_flops,
        "lora_flops": decoding_flops(lora_model, **kwargs),
        "plugin_params": count_parameters(reweighter),
        "plugin_block_params": count_parameters(reweighter.transformer.h),
        "gpt2_xl_block_params": count_parameters(base.transformer.h[0]),
        "lora_params": count_parameters(lora_model),
        **{f"paper_{name}": value for name, value in published.flops().items()},
    }



def shape_comparison(model: str, prompt_length: int = 1, new_tokens: int = 64, lora_rank: int = 8) -> dict:
    """The Plugin's and LoRA's decoding FLOPs on the exact shape of base ``model`` (its shape
    twin's configuration, ``twin`` in the registry; weights do not change FLOPs): the base with
    its family's reweighting model, and the base with rank-``lora_rank`` LoRA (``lora.add_lora``),
    unmerged, all on the meta device."""
    from transformers import AutoModelForCausalLM

    from . import models

    shape = models.model_spec(model).get("twin", model)
    config = models.model_config(shape)
    with torch.device("meta"):
        base = AutoModelForCausalLM.from_config(config)
        lora_base = AutoModelForCausalLM.from_config(config)
        reweighter = make_reweighter(vocab_size=config.vocab_size, seed=0, **models.arch_for(model))
    lora_model = add_lora(lora_base, r=lora_rank)
    kwargs = {"prompt_length": prompt_length, "new_tokens": new_tokens}
    base_flops, reweighter_flops = decoding_flops(base, **kwargs), decoding_flops(reweighter, **kwargs)
    return {"shape": shape, "prompt_length": prompt_length, "new_tokens": new_tokens, "lora_rank": lora_rank,
            "base_flops": base_flops, "reweighter_flops": reweighter_flops, "plugin_flops": base_flops + reweighter_flops,
            "lora_flops": decoding_flops(lora_model, **kwargs)}
