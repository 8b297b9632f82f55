"""Log-prob losses. `token_logprobs` and `entropy_from_logits` are defined once, in grpo.common.logprobs (the
rollout's sampler uses the same function), and re-exported here for the algorithm code."""

from __future__ import annotations

from torch import Tensor

from grpo.algo.masked import masked_mean, zero_masked
from grpo.common.logprobs import entropy_from_logits, token_logprobs


def sft_loss(logits: Tensor, labels: Tensor, mask: Tensor) -> Tensor:
    """L = −Σ_t m_t log π(y_t) / Σ_t m_t — token-mean NLL over response tokens (R1's cold-start SFT, DeepSeek-AI, 2025).

    logits [B, T, V] already aligned with labels [B, T]; mask [B, T] is 1 on response tokens. Masked
    labels may hold anything (e.g. -100): they are replaced before the gather.
    """
    safe_labels = zero_masked(labels, mask)
    return masked_mean(-token_logprobs(logits, safe_labels), mask)


__all__ = ["entropy_from_logits", "sft_loss", "token_logprobs"]
