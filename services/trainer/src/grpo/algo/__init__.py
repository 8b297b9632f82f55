"""grpo.algo — the GRPO math as small pure tensor functions: advantages, KL, policy loss, presets.

Importing the package loads no torch: each name below is imported from its module on first use (PEP 562), so
the trainer's settings can read the loss settings' definition (`grpo.algo.presets`, pure data) before torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from grpo.algo.advantages import ADVANTAGE_MODES, group_advantages, zero_variance_groups
    from grpo.algo.aggregation import AGGREGATIONS, seq_mean_token_mean, seq_mean_token_sum, token_mean
    from grpo.algo.kl import KL_ESTIMATORS, kl_estimate
    from grpo.algo.logprobs import entropy_from_logits, sft_loss, token_logprobs
    from grpo.algo.loss import RATIO_LEVELS, policy_loss, sequence_ratio, tis_weights, token_ratio
    from grpo.algo.masked import masked_mean, masked_sum, zero_masked
    from grpo.algo.presets import DEFAULTS, PRESETS, LossConfig, Preset, get_preset

# name → the module of grpo.algo that defines it (the same names as the imports above)
_HOMES = {
    "ADVANTAGE_MODES": "advantages",
    "group_advantages": "advantages",
    "zero_variance_groups": "advantages",
    "AGGREGATIONS": "aggregation",
    "seq_mean_token_mean": "aggregation",
    "seq_mean_token_sum": "aggregation",
    "token_mean": "aggregation",
    "KL_ESTIMATORS": "kl",
    "kl_estimate": "kl",
    "entropy_from_logits": "logprobs",
    "sft_loss": "logprobs",
    "token_logprobs": "logprobs",
    "RATIO_LEVELS": "loss",
    "policy_loss": "loss",
    "sequence_ratio": "loss",
    "tis_weights": "loss",
    "token_ratio": "loss",
    "masked_mean": "masked",
    "masked_sum": "masked",
    "zero_masked": "masked",
    "DEFAULTS": "presets",
    "PRESETS": "presets",
    "LossConfig": "presets",
    "Preset": "presets",
    "get_preset": "presets",
}

__all__ = [
    "ADVANTAGE_MODES",
    "AGGREGATIONS",
    "DEFAULTS",
    "KL_ESTIMATORS",
    "PRESETS",
    "RATIO_LEVELS",
    "LossConfig",
    "Preset",
    "entropy_from_logits",
    "get_preset",
    "group_advantages",
    "kl_estimate",
    "masked_mean",
    "masked_sum",
    "policy_loss",
    "seq_mean_token_mean",
    "seq_mean_token_sum",
    "sequence_ratio",
    "sft_loss",
    "tis_weights",
    "token_logprobs",
    "token_mean",
    "token_ratio",
    "zero_masked",
    "zero_variance_groups",
]


def __getattr__(name: str) -> Any:
    if name not in _HOMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{_HOMES[name]}"), name)
    globals()[name] = value  # later look-ups skip this function
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_HOMES])
