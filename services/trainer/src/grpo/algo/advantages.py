"""Group-relative advantages: one scalar per completion from the rewards of its group (no critic)."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from grpo.algo.presets import DEFAULTS

# Every mode maps rewards [N, G] (one row per prompt) to advantages [N, G]; zero-variance rows are
# zeroed afterwards by group_advantages, so a mode never has to special-case them.
AdvantageFn = Callable[[Tensor, float, bool], Tensor]


def std(r: Tensor, unbiased: bool, dim: int | None = None) -> Tensor:
    """Population std (numpy's default, ÷n) or Bessel-corrected std (÷(n−1), torch's default)."""
    n = r.numel() if dim is None else r.shape[dim]
    correction = 1 if unbiased and n > 1 else 0  # n = 1: a flat group, zeroed later; avoid torch's dof warning
    if dim is None:
        return r.std(correction=correction)
    return r.std(dim=dim, keepdim=True, correction=correction)


def grpo_advantages(r: Tensor, eps: float, std_unbiased: bool) -> Tensor:
    """A_i = (r_i − mean(r)) / (std(r) + eps) within the group (Shao et al., 2024, DeepSeekMath §4.1.2)."""
    return (r - r.mean(dim=1, keepdim=True)) / (std(r, std_unbiased, dim=1) + eps)


def dr_grpo_advantages(r: Tensor, eps: float, std_unbiased: bool) -> Tensor:
    """A_i = r_i − mean(r), no std division (Liu et al., 2025, "Understanding R1-Zero-Like Training", Dr. GRPO)."""
    return r - r.mean(dim=1, keepdim=True)


def rloo_advantages(r: Tensor, eps: float, std_unbiased: bool) -> Tensor:
    """A_i = r_i − mean_{j≠i} r_j = G/(G−1)·(r_i − mean(r)) (Kool et al., 2019; Ahmadian et al., 2024, RLOO)."""
    g = r.shape[1]
    if g < 2:
        raise ValueError("rloo advantages need group_size >= 2: a leave-one-out baseline needs another sample")
    leave_one_out_mean = (r.sum(dim=1, keepdim=True) - r) / (g - 1)
    return r - leave_one_out_mean


def reinforce_pp_advantages(r: Tensor, eps: float, std_unbiased: bool) -> Tensor:
    """A_i = (r_i − mean_group(r)) / (std_batch(r − mean_group) + eps) (Hu, 2025, REINFORCE++-baseline).

    arXiv 2501.03262. The group-centred rewards have batch mean 0 by construction, so the global whitening
    reduces to the division by their batch std. Computed once per completion (not per token as in OpenRLHF).
    """
    centred = r - r.mean(dim=1, keepdim=True)
    return centred / (std(centred.flatten(), std_unbiased) + eps)


def rank_advantages(r: Tensor, eps: float, std_unbiased: bool) -> Tensor:
    """A_i = (rank_i − (G+1)/2) / ((G−1)/2) ∈ [−1, 1], ties averaged (centred ranks; Salimans et al., 2017).

    Insensitive to the reward scale and to outliers, for multi-modal or heavy-tailed rewards.
    """
    g = r.shape[1]
    if g < 2:
        return torch.zeros_like(r)
    smaller = (r.unsqueeze(2) > r.unsqueeze(1)).sum(dim=2)  # [N, G]: how many rewards lie below r_i
    equal = (r.unsqueeze(2) == r.unsqueeze(1)).sum(dim=2)  # [N, G]: ties, r_i itself included
    rank = smaller.to(r.dtype) + (equal.to(r.dtype) + 1) / 2  # 1-based, ties averaged
    return (rank - (g + 1) / 2) / ((g - 1) / 2)


ADVANTAGE_MODES: dict[str, AdvantageFn] = {
    "grpo": grpo_advantages,
    "dr_grpo": dr_grpo_advantages,
    "rloo": rloo_advantages,
    "reinforce_pp": reinforce_pp_advantages,
    "rank": rank_advantages,
}


def _as_groups(rewards: Tensor, group_size: int) -> Tensor:
    """Flat [N·G] rewards (group by group) → [N, G], with errors a caller can act on."""
    if group_size < 1:
        raise ValueError(f"group_size must be >= 1, got {group_size}")
    if rewards.dim() != 1:
        raise ValueError(f"rewards must be a flat [N*G] tensor, got shape {tuple(rewards.shape)}")
    if rewards.numel() % group_size != 0:
        raise ValueError(f"{rewards.numel()} rewards do not split into groups of {group_size}")
    if not rewards.is_floating_point():
        rewards = rewards.float()
    elif rewards.dtype in (torch.float16, torch.bfloat16):
        rewards = rewards.float()  # group statistics in half precision lose the small differences that matter
    if not torch.isfinite(rewards).all():
        raise ValueError("rewards contain NaN or inf; a failed verification must be dropped, not scored")
    return rewards.view(-1, group_size)


def zero_variance_groups(rewards: Tensor, group_size: int) -> Tensor:
    """[N] bool: True where every reward of the group is identical (no learning signal; DAPO dynamic sampling)."""
    r = _as_groups(rewards, group_size)
    return r.amax(dim=1) == r.amin(dim=1)


def group_advantages(
    rewards: Tensor,
    group_size: int,
    *,
    mode: str = DEFAULTS.advantage_mode,
    eps: float = DEFAULTS.advantage_eps,
    std_unbiased: bool = DEFAULTS.std_unbiased,
    clip: tuple[float, float] | None = DEFAULTS.reward_clip,
) -> Tensor:
    """Advantages [N·G] for flat rewards [N·G] ordered group by group; mode in ADVANTAGE_MODES.

    The keywords default to the loss settings' defaults (grpo.algo.presets); a run passes `advantage_kwargs()`.

    clip=(lo, hi) clamps rewards before any statistic, so one outlier cannot dominate the group.
    A zero-variance group gets exact zeros in every mode (mean-centring in floating point may leave
    ~1e-8 residues that a small std would blow up; we never divide them).
    """
    if mode not in ADVANTAGE_MODES:
        raise ValueError(f"unknown advantage mode {mode!r}; choose one of {sorted(ADVANTAGE_MODES)}")
    r = _as_groups(rewards, group_size)
    if clip is not None:
        lo, hi = clip
        if lo > hi:
            raise ValueError(f"reward clip range must have lo <= hi, got {clip}")
        r = r.clamp(lo, hi)
    flat = r.amax(dim=1, keepdim=True) == r.amin(dim=1, keepdim=True)  # [N, 1]
    adv = ADVANTAGE_MODES[mode](r, eps, std_unbiased)
    adv = torch.where(flat, torch.zeros((), dtype=adv.dtype, device=adv.device), adv)
    return adv.reshape(-1)
