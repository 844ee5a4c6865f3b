"""Device- and dtype-aware helpers for tests that also run on a GPU (``pytest -m gpu``).

One device per comparison: ``same_device`` moves the expected tensor to the actual one's
device. Tolerances per dtype: ``tolerance(dtype)`` gives ``assert_close`` keywords for a whole
forward pass compared with another path through the same model (padding, batching, KV cache),
where rounding accumulates over layers: exact enough in float32, a few hundredths of a logit
in float16 (0.047 measured on an H100 for SmolLM2's shape), about ten times that in bfloat16.
"""
from __future__ import annotations

import torch

FORWARD_TOLERANCE = {
    torch.float32: {"atol": 1e-4, "rtol": 1e-4},
    torch.float16: {"atol": 1e-1, "rtol": 1e-2},
    torch.bfloat16: {"atol": 5e-1, "rtol": 5e-2},
}


def tolerance(dtype: torch.dtype) -> dict[str, float]:
    """``assert_close`` keywords for comparing two forward passes computed in ``dtype``."""
    return dict(FORWARD_TOLERANCE[dtype])


def same_device(expected: torch.Tensor, actual: torch.Tensor) -> torch.Tensor:
    return expected.to(actual.device)


def assert_forward_close(actual: torch.Tensor, expected: torch.Tensor, dtype: torch.dtype | None = None) -> None:
    """``actual`` equals ``expected`` up to the rounding of a forward pass in ``dtype``
    (default: the dtype of ``actual``), compared on ``actual``'s device, in float32."""
    torch.testing.assert_close(actual.float(), same_device(expected, actual).float(),
                               **tolerance(dtype or actual.dtype))
