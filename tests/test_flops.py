"""FLOP counting: the counter's convention, agreement with real decoding, Plugin and LoRA costs."""
from __future__ import annotations

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode
from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

from plugin_lib.core.blackbox import BlackBoxLM
from plugin_lib.core.decode import generate
from plugin_lib.harness.flops import decoding_flops, decoding_flops_by_op, generation_flops
from plugin_lib.harness.baselines.lora import add_lora

PROMPT = "Hello, my name is"
NEW_TOKENS = 5


def tiny_llama(vocab_size: int, attn: str = "eager") -> LlamaForCausalLM:
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        attn_implementation=attn,
    )
    return LlamaForCausalLM(config).eval()


def counted(fn) -> int:
    with FlopCounterMode(display=False) as counter:
        fn()
    return counter.get_total_flops()


def test_linear_layer_costs_two_flops_per_multiply_add():
    layer, tokens = torch.nn.Linear(48, 20), 7
    assert counted(lambda: layer(torch.randn(tokens, 48))) == 2 * 48 * 20 * tokens


def test_gpt2_decoding_on_meta_matches_the_closed_form():
    d, layers, vocab, prompt_length = 64, 3, 100, 6
    with torch.device("meta"):
        model = GPT2LMHeadModel(GPT2Config(n_embd=d, n_layer=layers, n_head=4, vocab_size=vocab, bos_token_id=0, eos_token_id=0))
    ops = decoding_flops_by_op(model, prompt_length=prompt_length, new_tokens=NEW_TOKENS)
    positions = prompt_length + NEW_TOKENS - 1  # every position the blocks process
    # Per block and position: c_attn 3d^2, attention c_proj d^2, MLP 8d^2 multiply-adds.
    assert ops["aten.addmm"] == 2 * 12 * d * d * layers * positions
    # The output head runs once per generated token (the prompt's last position included).
    assert ops["aten.mm"] == 2 * d * vocab * NEW_TOKENS
    # Eager attention: scores and weighted values, each 2 * d * (keys seen) per position.
    keys_seen = prompt_length * prompt_length + sum(prompt_length + t for t in range(1, NEW_TOKENS))
    assert ops["aten.bmm"] == 2 * 2 * d * keys_seen * layers
    assert model.config._attn_implementation == "sdpa"  # switched to eager only while counting


def _step_by_step(model, prompt_length: int, new_tokens: int) -> dict[str, int]:
    """Every step counted, as the counts were before the steps between were taken from a line."""
    from plugin_lib.harness.flops import _eager_attention, _prefill, _step

    with torch.no_grad(), _eager_attention(model), FlopCounterMode(display=False) as counter:
        out, mask = _prefill(model, prompt_length, 1)
        for _ in range(new_tokens - 1):
            out, mask = _step(model, out, mask)
    return {str(op): n for op, n in counter.get_flop_counts()["Global"].items() if n}


@pytest.mark.parametrize("family", ["gpt2", "llama", "llama-lora"])
def test_sixty_four_steps_counted_from_a_line_are_every_steps_count(family):
    with torch.device("meta"):
        model = (GPT2LMHeadModel(GPT2Config(n_embd=64, n_layer=2, n_head=4, vocab_size=100)) if family == "gpt2"
                 else tiny_llama(100))
    if family == "llama-lora":
        model = add_lora(model, r=4)
    assert decoding_flops_by_op(model, prompt_length=7, new_tokens=64) == _step_by_step(model, 7, 64)


def test_steps_off_the_line_are_each_counted():
    """A sliding window caps what a step attends to, so attention stops growing: the last step
    is off the line through the first three, and every step is then counted."""
    from transformers import MistralConfig, MistralForCausalLM

    with torch.device("meta"):
        model = MistralForCausalLM(MistralConfig(vocab_size=100, hidden_size=32, intermediate_size=64,
                                                 num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=2,
                                                 sliding_window=8))
    every = _step_by_step(model, 3, 20)
    assert decoding_flops_by_op(model, prompt_length=3, new_tokens=20) == every
    with torch.device("meta"):
        unwindowed = MistralForCausalLM(MistralConfig(vocab_size=100, hidden_size=32, intermediate_size=64,
                                                      num_hidden_layers=2, num_attention_heads=2,
                                                      num_key_value_heads=2, sliding_window=None))
    assert every["aten.bmm"] < _step_by_step(unwindowed, 3, 20)["aten.bmm"]  # the window did cap attention


@pytest.fixture
def plugin_pair(tokenizer):
    base = tiny_llama(len(tokenizer))
    reweighter = tiny_llama(len(tokenizer))
    return BlackBoxLM(base, tokenizer, "tiny"), base, reweighter


def prompt_length_of(tokenizer) -> int:
    return len(tokenizer(PROMPT)["input_ids"])


def test_base_count_matches_real_decoding(plugin_pair, tokenizer):
    box, base, _ = plugin_pair
    real = counted(
        lambda: generate(box, [PROMPT], max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, progress=False)
    )
    assert decoding_flops(base, prompt_length=prompt_length_of(tokenizer), new_tokens=NEW_TOKENS) == real


def test_plugin_costs_base_plus_reweighter(plugin_pair, tokenizer):
    box, base, reweighter = plugin_pair
    real = counted(
        lambda: generate(
            box, [PROMPT], reweighter, max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, progress=False
        )
    )
    kwargs = {"prompt_length": prompt_length_of(tokenizer), "new_tokens": NEW_TOKENS}
    plugin = generation_flops(base, reweighter, **kwargs)
    assert plugin.total == real
    assert plugin.base == decoding_flops(base, **kwargs)
    assert plugin.reweighter == decoding_flops(reweighter, **kwargs) > 0
    assert generation_flops(base, **kwargs).total == plugin.base


def test_unmerged_lora_adds_its_low_rank_products(tokenizer):
    r, prompt_length = 4, 6
    kwargs = {"prompt_length": prompt_length, "new_tokens": NEW_TOKENS}
    base_flops = decoding_flops(tiny_llama(len(tokenizer)), **kwargs)
    lora = add_lora(tiny_llama(len(tokenizer)), r=r, seed=0)
    lora_flops = decoding_flops(lora, **kwargs)
    # q_proj and v_proj (32 -> 32) in 2 layers, at every processed position: x A then (x A) B.
    positions = prompt_length + NEW_TOKENS - 1
    assert lora_flops - base_flops == 2 * r * (32 + 32) * 2 * 2 * positions
    assert decoding_flops(lora.merge_and_unload(), **kwargs) == base_flops


def test_a_shape_comparison_counts_the_base_its_reweighter_and_lora_on_the_registry_shape():
    """The FLOPs row's counts (report.paper_rows): a small twin's exact shape, its family's
    reweighting model and rank-8 LoRA, each counted on the meta device."""
    from plugin_lib.harness import flops, models
    from plugin_lib.core.reweighter import make_reweighter

    counts = flops.shape_comparison("llama-3.1-8b-twin-small", new_tokens=4)
    assert counts["shape"] == "llama-3.1-8b-twin-small"
    config = models.model_config("llama-3.1-8b-twin-small")
    with torch.device("meta"):
        reweighter = make_reweighter(vocab_size=config.vocab_size, seed=0, **models.arch_for("llama-3.1-8b-twin-small"))
    assert counts["reweighter_flops"] == decoding_flops(reweighter, prompt_length=1, new_tokens=4)
    assert counts["plugin_flops"] == counts["base_flops"] + counts["reweighter_flops"]
    assert counts["base_flops"] < counts["lora_flops"] < counts["plugin_flops"]  # adapters are cheap, the head is not
