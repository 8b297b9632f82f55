"""The GRPO policy loss: PPO-clip surrogate on group advantages, plus β·KL to the reference, aggregated.

Shapes: B completions, T completion tokens (right-padded); mask [B, T] is 1 on real completion tokens.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable

import torch
from torch import Tensor

from grpo.algo.aggregation import AGGREGATIONS
from grpo.algo.kl import KL_ESTIMATORS, MAX_LOG_RATIO, kl_estimate
from grpo.algo.logprobs import entropy_from_logits
from grpo.algo.masked import masked_mean, zero_masked
from grpo.algo.presets import check_kl_loss


def token_ratio(logp: Tensor, old_logp: Tensor, mask: Tensor) -> Tensor:
    """ρ_t = π_θ(o_t) / π_old(o_t) per token [B, T] (Schulman et al., 2017, PPO).

    The log-ratio is clamped to ±MAX_LOG_RATIO (as for k3) so one diverged token gives a huge, finite
    ratio instead of inf; beyond that bound its gradient is zero.
    """
    return torch.exp((logp - old_logp).clamp(-MAX_LOG_RATIO, MAX_LOG_RATIO))


def sequence_ratio(logp: Tensor, old_logp: Tensor, mask: Tensor) -> Tensor:
    """s_{i,t} = sg[s_i]·π_θ(o_t)/sg[π_θ(o_t)], s_i = exp(1/|o_i| Σ_t log ρ_t): [B, T] (GSPO-token, Zheng et al., 2025).

    Every token carries the value s_i, and the gradient of token t is s_i·∇log π_θ(o_t). Averaged with
    seq_mean_token_mean this is exactly GSPO's sequence-level objective and gradient.
    """
    seq_log_ratio = masked_mean(logp - old_logp, mask, dim=-1).clamp(-MAX_LOG_RATIO, MAX_LOG_RATIO)
    seq_log_ratio = seq_log_ratio.unsqueeze(-1)  # [B, 1]
    return torch.exp(seq_log_ratio.detach() + logp - logp.detach())


RATIO_LEVELS: dict[str, Callable[[Tensor, Tensor, Tensor], Tensor]] = {
    "token": token_ratio,
    "sequence": sequence_ratio,
}


def tis_weights(old_logp: Tensor, sampler_logp: Tensor, cap: float) -> Tensor:
    """w_t = min(π_old(o_t) / π_sampler(o_t), C), detached — truncated importance sampling (Yao et al., 2025).

    Corrects for the sampler (e.g. vLLM, bf16) and trainer disagreeing on the same weights. The exponent
    is capped at log C before exp(), which equals min(exp(·), C) and cannot overflow.
    """
    return torch.exp((old_logp - sampler_logp).clamp(max=math.log(cap))).detach()


def policy_loss(
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    clip_low: float,
    clip_high: float,
    beta: float,
    kl_kind: str,
    agg: str,
    ratio_level: str,
    tis_cap: float | None,
    ref_logp: Tensor | None = None,
    max_len: int | None = None,
    sampler_logp: Tensor | None = None,
    logits: Tensor | None = None,
    entropy: Tensor | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """L = agg[ −min(ρA, clip(ρ, 1−ε_low, 1+ε_high)A)·w + β·KL ] (Shao et al., 2024; ε_high: Yu et al., 2025).

    logp, old_logp, ref_logp, sampler_logp, mask: [B, T]; advantages [B], shared by a completion's tokens, or
    [B, T], one per token (process supervision, VinePPO: see credit.py);
    w = TIS weight (1 without sampler_logp); logits [B, T, V] or entropy [B, T] only feed the entropy metric.
    Returns the 0-dim loss and detached 0-dim metrics. Masked positions may hold anything, even inf/NaN.
    The settings (clip_low … tis_cap, `LossConfig.loss_kwargs()`) have no defaults here: theirs are LossConfig's.
    """
    _check_inputs(logp, old_logp, advantages, mask, clip_low, clip_high, beta, kl_kind, agg, ratio_level)
    _check_optional(logp, ref_logp, beta, sampler_logp, tis_cap, entropy)
    mask = mask.bool()
    logp, old_logp = zero_masked(logp, mask), zero_masked(old_logp, mask)  # padding garbage must not reach exp()
    aggregate = functools.partial(AGGREGATIONS[agg], mask=mask, max_len=max_len)

    # PPO-clip: the min() keeps the pessimistic branch, so the gradient vanishes once the ratio has moved
    # past 1+ε_high on a positive advantage (or below 1−ε_low on a negative one).
    ratio = RATIO_LEVELS[ratio_level](logp, old_logp, mask)  # [B, T]
    # [B] → [B, 1]: an outcome advantage for every token of the completion; [B, T]: step/token-level credit.
    adv = advantages.to(logp.dtype)
    adv = adv.unsqueeze(-1) if adv.dim() == 1 else zero_masked(adv, mask)
    surrogate = ratio * adv
    clipped_surrogate = ratio.clamp(1.0 - clip_low, 1.0 + clip_high) * adv
    pg_per_token = -torch.minimum(surrogate, clipped_surrogate)  # [B, T]
    tis_w = None
    if sampler_logp is not None and tis_cap is not None:
        tis_w = tis_weights(old_logp, zero_masked(sampler_logp, mask), tis_cap)  # [B, T], detached
        pg_per_token = pg_per_token * tis_w
    pg_loss = aggregate(pg_per_token)

    # The KL to the reference is its own loss term (not folded into the reward), aggregated like the surrogate.
    # With beta = 0 it is still measured when ref_logp is given, but outside the graph.
    kl_per_token = None
    if ref_logp is not None:
        with torch.set_grad_enabled(beta > 0 and torch.is_grad_enabled()):
            kl_per_token = kl_estimate(logp, zero_masked(ref_logp, mask), kl_kind)  # [B, T]
    kl_loss = beta * aggregate(kl_per_token) if beta > 0 and kl_per_token is not None else pg_loss.new_zeros(())
    loss = pg_loss + kl_loss

    metrics = _metrics(ratio, adv, mask, clip_low, clip_high, kl_per_token, tis_w, tis_cap, logits, entropy)
    metrics.update(loss=loss.detach(), pg_loss=pg_loss.detach(), kl_loss=kl_loss.detach())
    return loss, metrics


@torch.no_grad()
def _metrics(
    ratio: Tensor,
    adv: Tensor,
    mask: Tensor,
    clip_low: float,
    clip_high: float,
    kl_per_token: Tensor | None,
    tis_w: Tensor | None,
    tis_cap: float | None,
    logits: Tensor | None,
    entropy: Tensor | None,
) -> dict[str, Tensor]:
    """Token-level diagnostics over masked tokens only; 0-dim detached tensors (no GPU sync here)."""
    # "clipped" = the clipped branch won the min() and zeroed the token's gradient.
    clipped_high = (ratio > 1.0 + clip_high) & (adv > 0) & mask
    clipped_low = (ratio < 1.0 - clip_low) & (adv < 0) & mask
    one = ratio.new_ones(())
    has_tokens = mask.any()
    metrics = {
        "clip_frac_high": masked_mean(clipped_high.float(), mask),
        "clip_frac_low": masked_mean(clipped_low.float(), mask),
        "clip_frac": masked_mean((clipped_high | clipped_low).float(), mask),
        "ratio_mean": torch.where(has_tokens, masked_mean(ratio, mask), one),
        "ratio_min": torch.where(has_tokens, torch.where(mask, ratio, math.inf).min(), one),
        "ratio_max": torch.where(has_tokens, torch.where(mask, ratio, -math.inf).max(), one),
    }
    if kl_per_token is not None:
        metrics["kl"] = masked_mean(kl_per_token, mask)
    if tis_w is not None and tis_cap is not None:
        metrics["tis_weight_mean"] = masked_mean(tis_w, mask)
        metrics["tis_truncated_frac"] = masked_mean((tis_w >= tis_cap).float(), mask)
    if entropy is None and logits is not None:
        entropy = entropy_from_logits(logits)
    if entropy is not None:
        metrics["entropy"] = masked_mean(entropy, mask)
    return metrics


def _check_inputs(
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    clip_low: float,
    clip_high: float,
    beta: float,
    kl_kind: str,
    agg: str,
    ratio_level: str,
) -> None:
    """Raise ValueError naming the argument, before a broadcast hides the mistake."""
    if logp.dim() != 2:
        raise ValueError(f"logp must be [B, T], got shape {tuple(logp.shape)}")
    for name, t in (("old_logp", old_logp), ("mask", mask)):
        if t.shape != logp.shape:
            raise ValueError(f"{name} shape {tuple(t.shape)} != logp shape {tuple(logp.shape)}")
    if advantages.shape not in (logp.shape[:1], logp.shape):
        raise ValueError(
            f"advantages must be [B] = [{logp.shape[0]}] (one per completion) or [B, T] = {list(logp.shape)} "
            f"(one per token), got shape {tuple(advantages.shape)}"
        )
    if not 0.0 <= clip_low < 1.0 or clip_high < 0.0:
        raise ValueError(f"need 0 <= clip_low < 1 and clip_high >= 0, got {clip_low}, {clip_high}")
    if beta < 0:
        raise ValueError(f"beta must be >= 0, got {beta}")
    for name, value, registry in (
        ("kl_kind", kl_kind, KL_ESTIMATORS),
        ("agg", agg, AGGREGATIONS),
        ("ratio_level", ratio_level, RATIO_LEVELS),
    ):
        if value not in registry:
            raise ValueError(f"unknown {name} {value!r}; choose one of {sorted(registry)}")
    check_kl_loss(kl_kind, beta)


def _check_optional(
    logp: Tensor,
    ref_logp: Tensor | None,
    beta: float,
    sampler_logp: Tensor | None,
    tis_cap: float | None,
    entropy: Tensor | None,
) -> None:
    """The optional inputs: shapes, and the combinations that would otherwise be silently ignored."""
    for name, t in (("ref_logp", ref_logp), ("sampler_logp", sampler_logp), ("entropy", entropy)):
        if t is not None and t.shape != logp.shape:
            raise ValueError(f"{name} shape {tuple(t.shape)} != logp shape {tuple(logp.shape)}")
    if beta > 0 and ref_logp is None:
        raise ValueError("beta > 0 needs ref_logp (reference log-probs); use beta=0 to train without a reference")
    if (sampler_logp is None) != (tis_cap is None):
        raise ValueError("truncated importance sampling needs both sampler_logp and tis_cap (or neither)")
    if tis_cap is not None and tis_cap <= 0:
        raise ValueError(f"tis_cap must be > 0, got {tis_cap}")
