"""Masked reductions that never produce NaN: padding is selected away, not multiplied by zero."""

from __future__ import annotations

import torch
from torch import Tensor


def zero_masked(x: Tensor, mask: Tensor) -> Tensor:
    """x where mask else 0 — applied before any arithmetic so padding garbage (inf, NaN) cannot leak.

    Multiplying by a 0/1 mask is not enough: NaN·0 = NaN and inf·0 = NaN, in values and in gradients.
    """
    return torch.where(mask.bool(), x, torch.zeros((), dtype=x.dtype, device=x.device))


def masked_sum(x: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    """Σ x·m over `dim` (all dims when None)."""
    x = zero_masked(x, mask)
    return x.sum() if dim is None else x.sum(dim)


def masked_mean(x: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    """Σ x·m / Σ m over `dim` (all dims when None); 0 where the mask is empty, never NaN."""
    count = mask.bool().sum() if dim is None else mask.bool().sum(dim)
    return masked_sum(x, mask, dim) / count.clamp(min=1).to(x.dtype)
