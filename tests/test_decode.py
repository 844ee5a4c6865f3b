import pytest
import torch
from transformers import LogitsProcessor

from plugin_lib.core.combine import combine_log_probs
from plugin_lib.core.decode import PluginLogitsProcessor, generate, greedy_decode_uncached
from plugin_lib.core.reweighter import ContextFreeReweighter, make_reweighter, reweighter_logits


class UncachedPluginProcessor(LogitsProcessor):
    """Test oracle: re-runs the reweighting model over the whole sequence at every step."""

    def __init__(self, reweighter, prompt_mask):
        self.reweighter, self.prompt_mask = reweighter, prompt_mask

    @torch.no_grad()
    def __call__(self, input_ids, scores):
        mask = self.prompt_mask.repeat_interleave(input_ids.shape[0] // self.prompt_mask.shape[0], 0)
        mask = torch.cat((mask, mask.new_ones(mask.shape[0], input_ids.shape[1] - mask.shape[1])), 1)
        return combine_log_probs(scores, reweighter_logits(self.reweighter, input_ids, mask)[:, -1])


def _encode(base, prompts):
    return base.tokenizer(prompts, return_tensors="pt", padding=True)


@pytest.mark.parametrize("arch", ["llama", "gpt2", "mlp"])
@pytest.mark.parametrize("penalty", [None, 1.1])
def test_processor_matches_uncached_loop(tiny_base, small_reweighter, prompts, arch, penalty):
    rw = small_reweighter(arch, n_layer=1)
    enc = _encode(tiny_base, prompts)
    cached = tiny_base.generate(
        enc.input_ids, enc.attention_mask, max_new_tokens=12, do_sample=False,
        logits_processor=[PluginLogitsProcessor(rw, enc.attention_mask, repetition_penalty=penalty)],
    )
    reference = greedy_decode_uncached(tiny_base, enc.input_ids, enc.attention_mask, rw,
                                       max_new_tokens=12, repetition_penalty=penalty)
    assert torch.equal(cached, reference)
    # The reweighting model really changes the output (the test would be vacuous otherwise).
    base_only = greedy_decode_uncached(tiny_base, enc.input_ids, enc.attention_mask, max_new_tokens=12)
    assert not torch.equal(base_only, reference)


def test_batched_equals_one_by_one_on_the_real_model(smollm2, small_reweighter, prompts):
    rw = small_reweighter("llama")
    batched = generate(smollm2, prompts, rw, max_new_tokens=16, repetition_penalty=1.1, progress=False)
    singles = [generate(smollm2, [p], rw, max_new_tokens=16, repetition_penalty=1.1, progress=False)[0]
               for p in prompts]
    assert batched == singles and all(batched)
    assert generate(smollm2, prompts[::-1], rw, max_new_tokens=16, repetition_penalty=1.1,
                    progress=False) == batched[::-1]


def test_constant_reweighting_leaves_greedy_output_unchanged(smollm2, prompts):
    constant = ContextFreeReweighter(smollm2.vocab_size, 8, None)
    torch.nn.init.zeros_(constant.lm_head.weight)
    torch.nn.init.constant_(constant.lm_head.bias, 3.0)
    plugin = generate(smollm2, prompts, constant, max_new_tokens=16, progress=False)
    assert plugin == generate(smollm2, prompts, None, max_new_tokens=16, progress=False)


def test_beam_search_reorders_the_reweighting_cache(tiny_base, small_reweighter, prompts):
    rw = small_reweighter("llama")
    enc = _encode(tiny_base, prompts)
    kwargs = dict(max_new_tokens=10, num_beams=3, num_return_sequences=2, do_sample=False)
    processor = PluginLogitsProcessor(rw, enc.attention_mask)
    reorders = []
    follow = processor._follow_reordered_rows
    processor._follow_reordered_rows = lambda prefix: reorders.append(not torch.equal(prefix, processor._seen)) or follow(prefix)
    cached = tiny_base.generate(enc.input_ids, enc.attention_mask, logits_processor=[processor], **kwargs)
    assert any(reorders), "beam search never reordered rows: the test would not exercise the cache reorder"
    oracle = tiny_base.generate(enc.input_ids, enc.attention_mask,
                                logits_processor=[UncachedPluginProcessor(rw, enc.attention_mask)], **kwargs)
    assert torch.equal(cached, oracle)


def test_sampling_with_top_p_over_the_combined_distribution(tiny_base, small_reweighter, prompts):
    rw = small_reweighter("llama")
    enc = _encode(tiny_base, prompts)
    runs = []
    for processor in (PluginLogitsProcessor(rw, enc.attention_mask), UncachedPluginProcessor(rw, enc.attention_mask)):
        torch.manual_seed(0)
        runs.append(tiny_base.generate(enc.input_ids, enc.attention_mask, logits_processor=[processor],
                                       max_new_tokens=10, do_sample=True, top_p=0.9, temperature=0.8))
    assert torch.equal(*runs)


def test_processor_misuse_is_a_clear_error(tiny_base, small_reweighter, prompts):
    rw = small_reweighter("llama")
    enc = _encode(tiny_base, prompts)
    processor = PluginLogitsProcessor(rw, enc.attention_mask)
    tiny_base.generate(enc.input_ids, enc.attention_mask, logits_processor=[processor], max_new_tokens=3)
    with pytest.raises(RuntimeError, match="reset"):
        tiny_base.generate(enc.input_ids, enc.attention_mask, logits_processor=[processor], max_new_tokens=3)
    processor.reset()
    tiny_base.generate(enc.input_ids, enc.attention_mask, logits_processor=[processor], max_new_tokens=3)
    with pytest.raises(ValueError, match="attention mask"):
        tiny_base.generate(enc.input_ids, enc.attention_mask, max_new_tokens=3,
                           logits_processor=[PluginLogitsProcessor(rw, enc.attention_mask[:, 1:])])


def test_a_reweighter_over_fewer_tokens_than_the_ids_is_a_clear_error(tiny_base, prompts):
    small = make_reweighter("linear", 64, hidden_size=8)  # the prompts' ids run into the thousands
    advice = (rf"Vocabulary mismatch: the base model scores {tiny_base.vocab_size} tokens, the reweighting "
              r"model 64\..*plugin_lib\.make_reweighter")
    with pytest.raises(ValueError, match=advice):
        generate(tiny_base, prompts, small, max_new_tokens=3, progress=False)
    enc = _encode(tiny_base, prompts)
    with pytest.raises(ValueError, match=advice):
        tiny_base.generate(enc.input_ids, enc.attention_mask, max_new_tokens=3,
                           logits_processor=[PluginLogitsProcessor(small, enc.attention_mask)])
    with pytest.raises(ValueError, match=advice):
        greedy_decode_uncached(tiny_base, enc.input_ids, enc.attention_mask, small, max_new_tokens=3)
