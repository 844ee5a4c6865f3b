import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from plugin_lib.core.loss import IGNORE_INDEX, plugin_loss, shift_labels, target_positions


def test_shift_follows_transformers_convention():
    labels = torch.tensor([[-100, -100, 5, 6, 7]])
    assert shift_labels(labels).tolist() == [[-100, 5, 6, 7, -100]]
    assert target_positions(labels).tolist() == [[False, True, True, True, False]]


def test_matches_hand_computed_product_cross_entropy():
    g = torch.Generator().manual_seed(0)
    b, r = torch.randn(2, 4, 9, generator=g), torch.randn(2, 4, 9, generator=g)
    labels = torch.tensor([[-100, 3, 1, 8], [-100, -100, 2, 4]])
    expected, n = 0.0, 0
    for i, t in [(0, 0), (0, 1), (0, 2), (1, 1), (1, 2)]:  # positions whose next label is a target
        p = torch.softmax(b[i, t].double(), -1) * torch.softmax(r[i, t].double(), -1)
        expected -= torch.log(p[labels[i, t + 1]] / p.sum())
        n += 1
    torch.testing.assert_close(plugin_loss(b, r, labels).double(), expected / n)


def test_with_constant_reweighting_equals_transformers_own_loss():
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=30, hidden_size=16, intermediate_size=32,
                                         num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=2))
    ids = torch.randint(0, 30, (3, 8))
    labels = ids.clone()
    labels[:, :3] = IGNORE_INDEX
    out = model(input_ids=ids, labels=labels)
    torch.testing.assert_close(plugin_loss(out.logits, torch.zeros_like(out.logits), labels), out.loss)


def test_masked_positions_do_not_leak():
    b = torch.randn(1, 6, 12, requires_grad=True)
    r = torch.randn(1, 6, 12, requires_grad=True)
    labels = torch.tensor([[-100, -100, 4, 5, -100, -100]])  # targets at 2,3 -> logits 1,2 count
    loss = plugin_loss(b, r, labels)
    loss.backward()
    used = target_positions(labels)[0]
    assert used.tolist() == [False, True, True, False, False, False]
    assert (r.grad[0, ~used] == 0).all() and (r.grad[0, used] != 0).any()
    with torch.no_grad():
        b2, r2 = b.clone(), r.clone()
        b2[0, ~used] = 1e4 * torch.randn_like(b2[0, ~used])
        r2[0, ~used] = float("nan")
    torch.testing.assert_close(plugin_loss(b2, r2, labels), loss.detach())


def test_no_target_tokens_is_an_error():
    with pytest.raises(ValueError, match="No target tokens"):
        plugin_loss(torch.zeros(1, 3, 5), torch.zeros(1, 3, 5), torch.full((1, 3), IGNORE_INDEX))
