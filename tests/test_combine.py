import math

import pytest
import torch

from plugin_lib.core.combine import combine_log_probs, mixture_log_probs, temperature_log_probs


def product_reference(b: torch.Tensor, r: torch.Tensor) -> torch.Tensor:
    """The paper's definition in float64: log(b * r / sum(b * r))."""
    pb, pr = torch.softmax(b.double(), -1), torch.softmax(r.double(), -1)
    prod = pb * pr
    return torch.log(prod / prod.sum(-1, keepdim=True))


def test_matches_normalised_product():
    g = torch.Generator().manual_seed(0)
    b, r = torch.randn(4, 7, 50, generator=g) * 3, torch.randn(4, 7, 50, generator=g) * 3
    out = combine_log_probs(b, r)
    assert out.dtype == torch.float32
    torch.testing.assert_close(out.double(), product_reference(b, r), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(out.exp().sum(-1), torch.ones(4, 7))


def test_invariant_to_shifting_either_logit_vector():
    b, r = torch.randn(3, 20), torch.randn(3, 20)
    torch.testing.assert_close(combine_log_probs(b + 123.0, r - 77.0), combine_log_probs(b, r))


def test_extreme_logits_stay_finite_and_exact():
    b = torch.tensor([[1e4, -1e4, 0.0, 9999.0], [-1e4, -1e4, -1e4, -1e4 + 1]])
    r = torch.tensor([[-1e4, 1e4, 5.0, 1e4], [1e4, 0.0, -1e4, 3.0]])
    out = combine_log_probs(b, r)
    # log p = (b + r) - logsumexp(b + r); b + r = [0, 0, 5, 19999] and [0, -1e4, -2e4, -9996],
    # so worked out by hand (the other terms of the logsumexp are below exp(-9996)):
    expected = torch.tensor([[-19999.0, -19999.0, -19994.0, 0.0], [0.0, -1e4, -2e4, -9996.0]])
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out, expected, rtol=1e-6, atol=1e-6)
    # The probability-space formula underflows to log(0) = -inf here; log space does not.
    assert torch.isinf(product_reference(b, r)).any()


def test_minus_infinity_rules_a_token_out():
    b = torch.tensor([[0.0, float("-inf"), 1.0, 2.0]])
    r = torch.tensor([[5.0, 9.0, float("-inf"), 0.0]])
    out = combine_log_probs(b, r)
    assert out[0, 1] == float("-inf") and out[0, 2] == float("-inf")
    assert torch.isfinite(out[0, [0, 3]]).all()
    torch.testing.assert_close(out[0, [0, 3]].exp().sum(), torch.tensor(1.0))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_inputs_are_upcast(dtype):
    b, r = (torch.randn(5, 30) * 8).to(dtype), (torch.randn(5, 30) * 8).to(dtype)
    out = combine_log_probs(b, r)
    assert out.dtype == torch.float32 and torch.isfinite(out).all()
    torch.testing.assert_close(out, combine_log_probs(b.float(), r.float()), rtol=0, atol=0)


def test_constant_reweighting_returns_base_distribution():
    b = torch.randn(2, 3, 11)
    torch.testing.assert_close(combine_log_probs(b, torch.full_like(b, 4.2)), torch.log_softmax(b, -1))


def test_vocabulary_mismatch_is_a_clear_error():
    with pytest.raises(ValueError, match=r"Vocabulary mismatch.*plugin_lib\.make_reweighter"):
        combine_log_probs(torch.zeros(2, 10), torch.zeros(2, 11))


@pytest.mark.parametrize("alpha", [0.25, 0.5, 0.75])
def test_mixture_matches_definition(alpha):
    b, n = torch.randn(3, 40) * 4, torch.randn(3, 40) * 4
    expected = torch.log(alpha * torch.softmax(n.double(), -1) + (1 - alpha) * torch.softmax(b.double(), -1))
    torch.testing.assert_close(mixture_log_probs(b, n, alpha).double(), expected, rtol=1e-5, atol=1e-6)


def test_mixture_extremes():
    b = torch.tensor([[1e4, -1e4, 0.0]])
    n = torch.tensor([[-1e4, 1e4, 0.0]])
    out = mixture_log_probs(b, n, 0.25)
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out[0, :2], torch.tensor([math.log(0.75), math.log(0.25)]))
    torch.testing.assert_close(mixture_log_probs(b, n, 0.0), torch.log_softmax(b, -1))
    torch.testing.assert_close(mixture_log_probs(b, n, 1.0), torch.log_softmax(n, -1))
    with pytest.raises(ValueError):
        mixture_log_probs(b, n, 1.5)


def test_temperature_per_row_and_argmax_unchanged():
    logits = torch.randn(3, 25)
    temps = torch.tensor([0.5, 1.0, 3.0])
    out = temperature_log_probs(logits, temps)
    for i, t in enumerate(temps):
        torch.testing.assert_close(out[i], torch.log_softmax(logits[i] / t, -1))
    # A positive temperature never changes the greedy choice (why TempNet must sample).
    assert torch.equal(out.argmax(-1), logits.argmax(-1))
    with pytest.raises(ValueError):
        temperature_log_probs(logits, 0.0)
