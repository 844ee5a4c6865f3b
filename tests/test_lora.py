"""LoRA: which parameters train, their number, training through train.fit, decoding."""
from __future__ import annotations

import pytest
import torch
from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

from plugin_lib.core.decode import generate
from plugin_lib.core.reweighter import count_parameters
from plugin_lib.core.pairs import encode_pairs
from plugin_lib.core.train import TrainConfig
from plugin_lib.harness.baselines.lora import add_lora, fit_lora, lora_black_box, lora_objective, lora_targets

from conftest import killed_at_validation

PAIRS = [
    ("name[The Eagle], eatType[pub]", "The Eagle is a pub."),
    ("name[Aromi], food[Chinese]", "Aromi serves Chinese food."),
    ("name[Zizzi], area[riverside]", "Zizzi is by the riverside."),
    ("name[Cotto], eatType[coffee shop]", "Cotto is a coffee shop."),
]


def tiny_llama(tokenizer, seed: int = 0) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,  # grouped-query attention: v_proj is 32 -> 16
        initializer_range=0.5,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    model = LlamaForCausalLM(config)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    return model


def tiny_gpt2(n_embd: int = 32, n_layer: int = 2) -> GPT2LMHeadModel:
    return GPT2LMHeadModel(GPT2Config(vocab_size=64, n_embd=n_embd, n_layer=n_layer, n_head=2, bos_token_id=0, eos_token_id=0))


def test_targets_are_query_and_value_projections(tokenizer):
    assert lora_targets(tiny_llama(tokenizer)) == ["q_proj", "v_proj"]
    assert lora_targets(tiny_gpt2()) == ["c_attn"]


def test_llama_parameter_count_is_r_times_in_plus_out(tokenizer):
    r = 8
    model = add_lora(tiny_llama(tokenizer), r=r)
    # Per layer: q_proj 32 -> 32 and v_proj 32 -> 16 (2 KV heads of 8); 2 layers.
    assert count_parameters(model) == 2 * (r * (32 + 32) + r * (32 + 16))
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable and all("lora_A" in n or "lora_B" in n for n in trainable)
    assert any("q_proj" in n for n in trainable) and any("v_proj" in n for n in trainable)
    assert not any(k in n for n in trainable for k in ("k_proj", "o_proj", "mlp", "embed", "lm_head"))


def test_gpt2_parameter_count_covers_the_fused_qkv_layer():
    r = 8
    model = add_lora(tiny_gpt2(n_embd=32, n_layer=3), r=r)
    # c_attn maps d -> 3d (q, k and v fused): r * (d + 3d) = 2 * r * (d + d), as separate q and v.
    assert count_parameters(model) == 3 * r * (32 + 3 * 32) == 3 * 2 * r * (32 + 32)
    assert all("c_attn" in n for n, p in model.named_parameters() if p.requires_grad)


def test_adapter_starts_as_the_identity(tokenizer):
    base = tiny_llama(tokenizer)
    ids = torch.tensor([[1, 2, 3, 4]])
    expected = base(input_ids=ids).logits
    model = add_lora(tiny_llama(tokenizer), seed=0).eval()
    torch.testing.assert_close(model(input_ids=ids).logits, expected)


@pytest.fixture
def trained(tokenizer):
    """A tiny LLaMA with LoRA after two epochs of train.fit, and its frozen weights before."""
    model = add_lora(tiny_llama(tokenizer), r=4, seed=0)
    frozen_before = {n: p.detach().clone() for n, p in model.named_parameters() if not p.requires_grad}
    adapters_before = {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
    encoded = encode_pairs(tokenizer, [p for p, _ in PAIRS], [t for _, t in PAIRS])
    train = lora_objective(encoded, tokenizer.pad_token_id)
    start_loss = train.mean_nll(model.get_base_model())
    cfg = TrainConfig(lr=2e-2, weight_decay=0.0, max_epochs=2, patience=2, batch_size=2, warmup_ratio=0.0)
    result = fit_lora(model, train, train, cfg, progress=False)
    return model, frozen_before, adapters_before, start_loss, result


def test_fit_trains_only_the_adapters(trained):
    model, frozen_before, adapters_before, start_loss, result = trained
    for name, param in model.named_parameters():
        if name in frozen_before:
            torch.testing.assert_close(param, frozen_before[name], rtol=0, atol=0)
    assert any("lora_B" in n and not torch.equal(p, adapters_before[n]) for n, p in model.named_parameters())
    assert result.best_val_loss < start_loss


def test_decoding_merged_equals_unmerged(trained, tokenizer):
    model = trained[0]
    prompts = [p for p, _ in PAIRS[:2]]
    unmerged = generate(lora_black_box(model, tokenizer, merge=False), prompts, max_new_tokens=8, progress=False)
    merged_box = lora_black_box(model, tokenizer)
    assert not any("lora" in n for n, _ in merged_box._model.named_parameters())
    merged = generate(merged_box, prompts, max_new_tokens=8, progress=False)
    assert merged == unmerged
    assert all(isinstance(text, str) for text in merged)


def test_an_interrupted_lora_training_resumes_to_the_same_adapters(tokenizer, tmp_path):
    """The harness's LoRA model (its state dict: the adapters only) through fit's checkpoint;
    LoRA's dropout draws from the global generator, which the checkpoint brings back."""
    from plugin_lib.core.train import fit
    from plugin_lib.harness.baselines.lora import LoraModel

    encoded = encode_pairs(tokenizer, [p for p, _ in PAIRS], [t for _, t in PAIRS])
    train = lora_objective(encoded, tokenizer.pad_token_id)
    cfg = TrainConfig(lr=2e-2, weight_decay=0.0, max_epochs=4, patience=4, batch_size=2, warmup_ratio=0.0)
    whole = LoraModel(add_lora(tiny_llama(tokenizer), r=4, seed=0, dropout=0.3))
    expected = fit(whole, train, train, cfg, progress=False)
    path = tmp_path / "lora.pt"
    with killed_at_validation(3), pytest.raises(KeyboardInterrupt):
        fit(LoraModel(add_lora(tiny_llama(tokenizer), r=4, seed=0, dropout=0.3)), train, train, cfg,
            progress=False, checkpoint=path, checkpoint_every_s=0)
    torch.manual_seed(99)
    resumed = LoraModel(add_lora(tiny_llama(tokenizer), r=4, seed=0, dropout=0.3))
    result = fit(resumed, train, train, cfg, progress=False, checkpoint=path, checkpoint_every_s=0)
    assert result.history == expected.history
    assert resumed.state_dict().keys() == whole.state_dict().keys()
    assert all(torch.equal(v, whole.state_dict()[k]) for k, v in resumed.state_dict().items())


def test_recomputed_activations_give_the_same_loss_and_gradients(tokenizer):
    from transformers import LlamaConfig, LlamaForCausalLM

    from plugin_lib.harness.baselines.lora import add_lora, checkpoint_activations

    def adapter_gradients(checkpointed: bool):
        torch.manual_seed(0)
        config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                             num_attention_heads=2, num_key_value_heads=2)
        model = LlamaForCausalLM(config)
        if checkpointed:
            checkpoint_activations(model)
        peft = add_lora(model, r=4, seed=1)
        peft.train()
        for name, p in peft.named_parameters():  # B starts at zero: make the adapters matter
            if "lora_B" in name:
                torch.nn.init.normal_(p, std=0.1)
        ids = torch.tensor([[5, 17, 300, 42, 7, 9]])
        torch.manual_seed(2)  # the adapters' dropout
        loss = peft(input_ids=ids, labels=ids).loss
        loss.backward()
        return loss.detach(), {n: p.grad.clone() for n, p in peft.named_parameters() if p.requires_grad}

    loss, grads = adapter_gradients(False)
    loss_checkpointed, grads_checkpointed = adapter_gradients(True)
    torch.testing.assert_close(loss_checkpointed, loss)
    assert grads.keys() == grads_checkpointed.keys() and grads
    for name in grads:
        torch.testing.assert_close(grads_checkpointed[name], grads[name], rtol=1e-5, atol=1e-6)


def test_lora_on_gives_the_same_gradients_bit_for_bit_with_activations_recomputed_or_kept():
    """The planned peak decides whether LoRA recomputes (``preflight_counts.lora_recompute``):
    either way the same kernels run on the same inputs with the dropout's random state replayed,
    so one step's gradients have the same digest."""
    import hashlib

    from plugin_lib.harness.baselines.lora import lora_on
    from plugin_lib.harness.models import load_causal_lm

    def digest(recompute: bool) -> str:
        model, _ = load_causal_lm("llama-3.1-8b-twin-small", dtype="float32", device="cpu")
        adapted = lora_on(model, seed=1, recompute=recompute)
        adapted.train()
        ids = torch.tensor([[5, 17, 300, 42, 7, 9, 11, 4]])
        torch.manual_seed(2)  # the adapters' dropout
        adapted.peft(input_ids=ids, labels=ids).loss.backward()
        found = hashlib.sha256()
        for name, p in sorted(adapted.peft.named_parameters()):
            if p.requires_grad:
                found.update(name.encode() + p.grad.contiguous().view(torch.uint8).numpy().tobytes())
        return found.hexdigest()

    assert digest(recompute=True) == digest(recompute=False)


def test_the_planned_peak_decides_whether_lora_recomputes():
    from plugin_lib.harness.planning.preflight_counts import lora_recompute
    from plugin_lib.harness.profile import load_profile

    paper, gib = load_profile("paper"), 2**30
    assert not lora_recompute("llama-3.1-8b", paper, 141 * gib)  # an H200 holds every block's activations
    assert lora_recompute("llama-3.1-8b", paper, 40 * gib)
    assert lora_recompute("gpt2-xl", paper, 15 * gib)  # a T4: recompute, as before


def test_making_a_task_asks_nothing_of_the_base_that_would_load_a_lazy_one():
    """Whether LoRA recomputes is decided when LoRA is built: a fine-tuned base that loads (and
    fine-tunes) on first use stays unloaded while its stored runs are only read."""
    import real_data
    from plugin_lib.harness import tasks
    from plugin_lib.harness.models import load_tokenizer
    from plugin_lib.harness.profile import load_profile

    real_data.require("e2e")

    class Lazy:
        name = states_name = "smollm2-135m-instruct"
        tokenizer = load_tokenizer("smollm2-135m-instruct")

        def __getattr__(self, attribute):
            raise AssertionError(f"make_task asked the base for {attribute!r}")

    task = tasks.make_task(Lazy(), "e2e", load_profile("smoke"))
    assert task.lora_recompute_rule is not None
    with pytest.raises(AssertionError, match="'device'"):
        task.lora_recompute  # noqa: B018 - asked only when LoRA is built
