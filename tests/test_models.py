import pytest
import torch
from transformers import GPT2Config, GPT2LMHeadModel

from plugin_lib.core.reweighter import (
    check_vocabulary,
    count_parameters,
    make_reweighter,
    output_vocab_size,
    reweighter_logits,
)

V = 101


def test_gpt2_variant_is_the_authors_config():
    model = make_reweighter("gpt2", V, n_layer=2)
    assert model.config.n_layer == 2 and model.config.n_embd == 768 and model.config.n_head == 12
    assert output_vocab_size(model) == V


def test_llama_variant_is_the_authors_config():
    model = make_reweighter("llama", V)
    c = model.config
    assert (c.num_hidden_layers, c.hidden_size, c.num_attention_heads, c.intermediate_size) == (1, 256, 1, 1024)
    assert output_vocab_size(model) == V


@pytest.mark.parametrize("arch", ["gpt2", "llama", "mlp", "linear"])
def test_every_variant_scores_the_vocabulary(arch):
    model = make_reweighter(arch, V, seed=0).eval()
    ids = torch.randint(0, V, (2, 5))
    assert model(input_ids=ids).logits.shape == (2, 5, V)


def test_seeded_initialisation_is_reproducible():
    a, b = make_reweighter("llama", V, seed=3), make_reweighter("llama", V, seed=3)
    assert all(torch.equal(x, y) for x, y in zip(a.parameters(), b.parameters()))


def test_context_free_variants_ignore_history():
    model = make_reweighter("mlp", V, seed=0).eval()
    a = model(input_ids=torch.tensor([[1, 2, 9]])).logits[0, -1]
    b = model(input_ids=torch.tensor([[7, 7, 9]])).logits[0, -1]
    torch.testing.assert_close(a, b)
    assert count_parameters(make_reweighter("linear", V)) < count_parameters(model)


def test_pretrained_initialisation_and_vocabulary_check(tmp_path):
    GPT2LMHeadModel(GPT2Config(vocab_size=V, n_layer=1, n_embd=16, n_head=2)).save_pretrained(tmp_path)
    assert output_vocab_size(make_reweighter("pretrained", V, pretrained=str(tmp_path))) == V
    with pytest.raises(ValueError, match="Vocabulary mismatch"):
        make_reweighter("pretrained", V + 1, pretrained=str(tmp_path))
    with pytest.raises(ValueError, match="pretrained="):
        make_reweighter("pretrained", V)
    with pytest.raises(ValueError, match="Unknown reweighting architecture"):
        make_reweighter("rnn", V)
    with pytest.raises(ValueError, match="base.vocab_size"):
        check_vocabulary(V + 5, make_reweighter("linear", V))


@pytest.mark.parametrize("arch", ["gpt2", "llama", "mlp"])
def test_logits_at_selected_positions_and_left_padding(arch):
    model = make_reweighter(arch, V, seed=0, n_layer=1).eval()
    ids = torch.tensor([[0, 0, 5, 6, 7], [1, 2, 3, 4, 5]])
    mask = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1]])
    with torch.no_grad():
        full = reweighter_logits(model, ids, mask)
        positions = torch.tensor([[False, False, True, False, True], [False, True, False, False, False]])
        torch.testing.assert_close(reweighter_logits(model, ids, mask, positions), full[positions])
        # A left-padded row gives the same logits as the same tokens without padding.
        alone = reweighter_logits(model, ids[:1, 2:], mask[:1, 2:])
    torch.testing.assert_close(full[0, 2:], alone[0], rtol=1e-5, atol=1e-5)
