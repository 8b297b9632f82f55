"""grpo.algo — the GRPO math as small pure tensor functions: advantages, KL, policy loss, presets."""

from grpo.algo.advantages import ADVANTAGE_MODES, group_advantages, zero_variance_groups
from grpo.algo.aggregation import AGGREGATIONS, seq_mean_token_mean, seq_mean_token_sum, token_mean
from grpo.algo.kl import KL_ESTIMATORS, kl_estimate
from grpo.algo.logprobs import entropy_from_logits, sft_loss, token_logprobs
from grpo.algo.loss import RATIO_LEVELS, policy_loss, sequence_ratio, tis_weights, token_ratio
from grpo.algo.masked import masked_mean, masked_sum, zero_masked
from grpo.algo.presets import PRESETS, LossConfig, Preset, get_preset

__all__ = [
    "ADVANTAGE_MODES",
    "AGGREGATIONS",
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
