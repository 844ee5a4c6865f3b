"""Token cross-entropy with transformers' label convention.

``labels`` are the input ids with -100 on prompt and padding positions; position t of the
logits predicts token t + 1, so the shift happens here. Masked positions take no part: their
log-probabilities are never gathered and they do not count in the mean.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from .combine import combine_log_probs

IGNORE_INDEX = -100


def shift_labels(labels: torch.Tensor) -> torch.Tensor:
    """Targets aligned with the logits: targets[..., t] = labels[..., t + 1], -100 at the end."""
    pad = torch.full_like(labels[..., :1], IGNORE_INDEX)
    return torch.cat((labels[..., 1:], pad), dim=-1)


def target_positions(labels: torch.Tensor) -> torch.Tensor:
    """Boolean mask of the logit positions whose next token is a target token."""
    return shift_labels(labels) != IGNORE_INDEX


def plugin_loss(base_logits: torch.Tensor, reweight_logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Cross-entropy of the combined distribution, mean over unmasked target tokens.

    ``base_logits`` and ``reweight_logits`` are (B, T, V) for the same input ids, ``labels``
    (B, T). Only the target positions are combined, so prompt and padding cost nothing.
    """
    positions = target_positions(labels)
    if not positions.any():
        raise ValueError("No target tokens in this batch: every label is -100.")
    log_p = combine_log_probs(base_logits[positions], reweight_logits[positions])
    return F.nll_loss(log_p, shift_labels(labels)[positions])
