"""Loss aggregation: how per-token losses [B, T] become one scalar. Add a variant = add a function + an entry."""

from __future__ import annotations

from typing import Protocol

from torch import Tensor

from grpo.algo.masked import masked_mean, masked_sum


class Aggregation(Protocol):
    """per_token [B, T], mask [B, T] (1 = completion token) → 0-dim loss."""

    def __call__(self, per_token: Tensor, mask: Tensor, max_len: int | None) -> Tensor: ...


def _mean_over_sequences(per_seq: Tensor, mask: Tensor) -> Tensor:
    """Mean of per-sequence values [B] over rows with at least one token (an empty row is not a sample)."""
    return masked_mean(per_seq, mask.bool().any(dim=-1))


def seq_mean_token_mean(per_token: Tensor, mask: Tensor, max_len: int | None = None) -> Tensor:
    """1/G Σ_i 1/|o_i| Σ_t ℓ_{i,t} — GRPO paper (Shao et al., 2024, eq. 3); long answers' tokens weigh less."""
    return _mean_over_sequences(masked_mean(per_token, mask, dim=-1), mask)


def token_mean(per_token: Tensor, mask: Tensor, max_len: int | None = None) -> Tensor:
    """Σ_{i,t} ℓ_{i,t} / Σ_i |o_i| — every token weighs the same (Yu et al., 2025, DAPO §3.3)."""
    return masked_mean(per_token, mask)


def seq_mean_token_sum(per_token: Tensor, mask: Tensor, max_len: int | None = None) -> Tensor:
    """1/G Σ_i 1/L_max Σ_t ℓ_{i,t} — constant normaliser, no length bias (Liu et al., 2025, Dr. GRPO).

    max_len must be a constant of the run (the generation budget), not this batch's padded length.
    """
    if max_len is None or max_len <= 0:
        raise ValueError("agg='seq_mean_token_sum' needs max_len > 0: the run's constant generation budget")
    return _mean_over_sequences(masked_sum(per_token, mask, dim=-1) / max_len, mask)


AGGREGATIONS: dict[str, Aggregation] = {
    "seq_mean_token_mean": seq_mean_token_mean,
    "token_mean": token_mean,
    "seq_mean_token_sum": seq_mean_token_sum,
}
