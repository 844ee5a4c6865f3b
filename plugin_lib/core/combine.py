"""How a black-box model's next-token distribution is combined with a small model's.

Every function takes logits of shape ``(..., vocab)`` and returns normalised log-probabilities
in float32 (half-precision inputs are upcast first, so bf16/fp16 models lose nothing here).
Working in log space keeps the product of two distributions exact when one of them puts
almost all of its mass on a single token, where ``log(p + eps)`` would not.
"""
from __future__ import annotations

import math

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
