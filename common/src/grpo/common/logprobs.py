"""Per-token log-probabilities and entropies from logits: the one definition the trainer and the rollout share.

The rollout's sampler reports `token_logprobs` of each sampled token and the trainer recomputes the same
function over a forward pass, so the two agree by construction (to float rounding) when the weights and the
precision agree. Needs torch (grpo-common's `model` extra).
"""

from __future__ import annotations

import torch
from torch import Tensor

_FULL_PRECISION = (torch.float32, torch.float64)


def token_logprobs(logits: Tensor, token_ids: Tensor, temperature: float = 1.0) -> Tensor:
    """log softmax(logits / temperature)[token] = z_tok − logsumexp(z): logits [B, T, V], token_ids [B, T] → [B, T].

    Never materialises the [B, T, V] log-softmax (only the logsumexp [B, T]). Half-precision logits are
    upcast to float32 one row at a time: logsumexp in bf16 is too coarse for importance ratios, and a
    whole-batch upcast would double peak memory. Output is float32 (float64 for float64 input).
    `logits[:, t]` must be the logits that predicted `token_ids[:, t]` (the caller shifts by one).
    """
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    if logits.shape[:-1] != token_ids.shape:
        raise ValueError(f"logits {tuple(logits.shape)} and token_ids {tuple(token_ids.shape)} disagree on [B, T]")
    if logits.dtype not in _FULL_PRECISION:
        return torch.stack(
            [token_logprobs(row.float(), ids, temperature) for row, ids in zip(logits, token_ids, strict=True)]
        )
    z = logits / temperature if temperature != 1.0 else logits
    picked = z.gather(-1, token_ids.unsqueeze(-1).long()).squeeze(-1)
    return picked - torch.logsumexp(z, dim=-1)


def all_token_logprobs(logits: Tensor) -> Tensor:
    """log softmax over the vocabulary, in float32 or better: [..., V] → [..., V].

    The same numbers as `token_logprobs` for every token at once, for a sampler that must hand over the whole
    distribution (vLLM gathers the sampled token's and the top-k log-probs from it after sampling). The caller
    has already divided by the temperature, as vLLM's sampler does before this point.
    """
    return logits.log_softmax(dim=-1, dtype=torch.float64 if logits.dtype == torch.float64 else torch.float32)


def entropy_from_logits(logits: Tensor, temperature: float = 1.0) -> Tensor:
    """H = logsumexp(z) − Σ_v softmax(z)_v z_v per position, z = logits / T: [..., V] → [...], float32 or better.

    Batched input is done one row at a time: the few float32 copies softmax needs are [T, V], never
    [B, T, V] (at a 150k vocabulary that difference is gigabytes).
    """
    if logits.dim() > 2:
        return torch.stack([entropy_from_logits(row, temperature) for row in logits])
    z = logits if logits.dtype in _FULL_PRECISION else logits.float()
    z = z / temperature if temperature != 1.0 else z
    return torch.logsumexp(z, dim=-1) - (torch.softmax(z, dim=-1) * z).sum(dim=-1)
