"""How a black-box model's next-token distribution is combined with a small model's.

Every function takes logits of shape ``(..., vocab)`` and returns normalised log-probabilities
in float32 (half-precision inputs are upcast first, so bf16/fp16 models lose nothing here).
Working in log space keeps the product of two distributions exact when one of them puts
almost all of its mass on a single token, where ``log(p + eps)`` would not.
"""
from __future__ import annotations

import math
from collections.abc import Iterator, Sequence

import torch
import torch.nn.functional as F


def _log_probs(logits: torch.Tensor) -> torch.Tensor:
    return F.log_softmax(logits.float(), dim=-1)


def combine_log_probs(base_logits: torch.Tensor, reweight_logits: torch.Tensor) -> torch.Tensor:
    """Plugin: log p = log(b * r / sum(b * r)) = log_softmax(log_softmax(b) + log_softmax(r)).

    Normalising each input first keeps the sum finite for logits of any scale; a token that
    either model rules out (-inf) stays ruled out.
    """
    if base_logits.shape[-1] != reweight_logits.shape[-1]:
        raise ValueError(
            f"Vocabulary mismatch: base gives {base_logits.shape[-1]} logits per token, the "
            f"reweighting model {reweight_logits.shape[-1]}. Build the reweighting model with the "
            "base's vocabulary: plugin_lib.make_reweighter(arch, vocab_size=base.vocab_size) "
            "(plugin_lib.core.reweighter)."
        )
    return F.log_softmax(_log_probs(base_logits) + _log_probs(reweight_logits), dim=-1)


def mixture_log_probs(base_logits: torch.Tensor, new_logits: torch.Tensor, alpha: float) -> torch.Tensor:
    """WeightedComb: log(alpha * softmax(n) + (1 - alpha) * softmax(b)), via logsumexp."""
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"alpha must lie in [0, 1], got {alpha}")
    if alpha == 0.0:
        return _log_probs(base_logits)
    if alpha == 1.0:
        return _log_probs(new_logits)
    weighted = torch.stack(
        (_log_probs(new_logits) + math.log(alpha), _log_probs(base_logits) + math.log1p(-alpha))
    )
    return torch.logsumexp(weighted, dim=0)


def temperature_log_probs(logits: torch.Tensor, temperature: torch.Tensor | float) -> torch.Tensor:
    """log_softmax(logits / T); ``temperature`` is a scalar or one value per row of ``logits``."""
    temperature = torch.as_tensor(temperature, dtype=torch.float32, device=logits.device)
    if (temperature <= 0).any():
        raise ValueError("temperature must be positive")
    while temperature.dim() < logits.dim():
        temperature = temperature.unsqueeze(-1)
    return F.log_softmax(logits.float() / temperature, dim=-1)


def nucleus_log_probs(logits: torch.Tensor, top_p: float) -> torch.Tensor:
    """log_softmax(logits) with every token outside the top-``top_p`` nucleus at -inf: the smallest
    set of most likely tokens whose probability reaches ``top_p`` (at least one token), as
    transformers' ``TopPLogitsWarper`` keeps it; not renormalised (DExperts adds to it)."""
    if not 0.0 < top_p <= 1.0:
        raise ValueError(f"top_p must lie in (0, 1], got {top_p}")
    log_probs = _log_probs(logits)
    if top_p == 1.0:
        return log_probs
    ordered, order = log_probs.sort(dim=-1, descending=True)
    before = ordered.exp().cumsum(dim=-1) - ordered.exp()  # probability of the tokens ranked above
    outside = before >= top_p
    return log_probs.masked_fill(outside.scatter(-1, order, outside), float("-inf"))


def proxy_log_probs(base_logits: torch.Tensor, expert_difference: torch.Tensor, alpha: float,
                    top_p: float | None = None) -> torch.Tensor:
    """Proxy-tuning (Liu et al. 2024, alisawuffles/proxy-tuning, modeling/dexperts.py) and DExperts
    (Liu et al. 2021): softmax(b + alpha * (e - a)), where ``expert_difference`` is the expert's
    log-probabilities less the anti-expert's (a uniform anti-expert: the expert's logits alone;
    a per-row constant does not change the result). ``top_p`` (DExperts): the base is first cut
    to its nucleus. Log-space throughout: softmax(b + alpha * d) = softmax(log_softmax(b) + alpha * d)."""
    base = nucleus_log_probs(base_logits, top_p) if top_p is not None else _log_probs(base_logits)
    return _proxy_at(base, expert_difference.float(), alpha)


def _proxy_at(base: torch.Tensor, difference: torch.Tensor, alpha: float) -> torch.Tensor:
    if alpha < 0:
        raise ValueError(f"alpha must be at least 0, got {alpha}")
    return F.log_softmax(base + alpha * difference, dim=-1)


def reachable_proxy_log_probs(base_log_probs: torch.Tensor, expert_logits: torch.Tensor, alphas: Sequence[float],
                              top_p: float | None = None) -> Iterator[torch.Tensor]:
    """``proxy_log_probs`` with a uniform anti-expert at each of ``alphas`` in turn, for
    hyper-validation losses: the base's nucleus and the expert's log-probabilities are computed
    once for all. A target that the combination rules out (outside DExperts' nucleus) reads 0,
    as ``core.train``'s ``reachable_plugin_log_probs`` does for a top-k view, so every alpha is
    judged on one set of reachable targets."""
    base = nucleus_log_probs(base_log_probs, top_p) if top_p is not None else _log_probs(base_log_probs)
    difference = _log_probs(expert_logits).float()
    for alpha in alphas:  # one vocabulary-wide tensor at a time
        combined = _proxy_at(base, difference, alpha)
        yield combined.masked_fill(torch.isneginf(combined), 0.0)


def proxy_combine(base_logits: torch.Tensor, expert_logits: torch.Tensor, alpha: float,
                  top_p: float | None = None) -> torch.Tensor:
    """``proxy_log_probs`` with a uniform anti-expert, as ``PluginLogitsProcessor``'s ``combine``
    (the processor runs the expert with its own KV cache and passes its logits)."""
    return proxy_log_probs(base_logits, _log_probs(expert_logits), alpha, top_p)
