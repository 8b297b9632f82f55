"""Per-token estimators of KL(π_θ ‖ π_ref) from the sampled token's log-probs (Schulman, 2020)."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

# log π_ref − log π_θ above this is clamped before exp() so k3 cannot overflow (e^20 ≈ 5e8: a token the policy
# has all but given up); beyond it k3's gradient is zero. Only from above: for d → −∞ (a token the policy raised
# far above the reference, where reward hacking shows) e^d → 0 cannot overflow, and k3 ≈ −d − 1 keeps its
# gradient of 1, pulling the token back. (verl's low_var_kl clamps both sides, and loses that pull.)
MAX_LOG_RATIO = 20.0


def kl_k1(logp: Tensor, ref_logp: Tensor) -> Tensor:
    """k1 = log π_θ − log π_ref — unbiased, high variance, can be negative (Schulman, "Approximating KL", 2020)."""
    return logp - ref_logp


def kl_k2(logp: Tensor, ref_logp: Tensor) -> Tensor:
    """k2 = ½ (log π_θ − log π_ref)² — biased, low variance, ≥ 0 (Schulman, 2020)."""
    return 0.5 * (logp - ref_logp).square()


def kl_k3(logp: Tensor, ref_logp: Tensor) -> Tensor:
    """k3 = π_ref/π_θ − log(π_ref/π_θ) − 1 — unbiased, ≥ 0; GRPO's choice (Schulman, 2020; Shao et al., 2024).

    The log-ratio d = log π_ref − log π_θ is clamped to at most MAX_LOG_RATIO before exp(); k3 = e^d − d − 1 ≥ 0
    still holds.
    Computed as expm1(d) − d: exp(d) − d − 1 rounds to −1e-16 for tiny d, expm1(d) ≥ d never does.
    """
    d = (ref_logp - logp).clamp(max=MAX_LOG_RATIO)
    return torch.expm1(d) - d


KL_ESTIMATORS: dict[str, Callable[[Tensor, Tensor], Tensor]] = {"k1": kl_k1, "k2": kl_k2, "k3": kl_k3}


def kl_estimate(logp: Tensor, ref_logp: Tensor, kind: str = "k3") -> Tensor:
    """Per-token KL estimate, same shape as logp ([B, T]); kind in KL_ESTIMATORS (k1, k2, k3)."""
    try:
        estimator = KL_ESTIMATORS[kind]
    except KeyError:
        raise ValueError(f"unknown KL estimator {kind!r}; choose one of {sorted(KL_ESTIMATORS)}") from None
    return estimator(logp, ref_logp)
