"""The GRPO debugging checklist as a program: rules over a run's metrics.jsonl rows, each naming a symptom, the
steps and numbers that show it, and the setting to change.

The seeds' table (§15.11: flat loss and reward, reward hacking, KL spikes, truncation, slow rollouts, unbalanced
groups) plus ours (ratio and clip fraction, sampler–trainer mismatch, stale drops). Pure floats, no torch: the
`grpo doctor` command runs them on a finished run's folder, and the trainer may run them on the rows so far.
"""

from __future__ import annotations

from collections.abc import Callable

from grpo.common.doctor.series import Finding, MetricRows, RunSettings
from grpo.common.doctor.signal_rules import reward_hacking, truncation, unbalanced_groups, zero_variance
from grpo.common.doctor.update_rules import clip_ratio, kl_spike, logprob_mismatch, rollout_wait, stale_drops

Rule = Callable[[MetricRows, RunSettings], Finding | None]

# In the order a person should read them: no signal first (nothing else matters then), then what the signal
# teaches, then the update's health, then cost.
RULES: dict[str, Rule] = {
    "zero_variance": zero_variance,
    "unbalanced_groups": unbalanced_groups,
    "reward_hacking": reward_hacking,
    "truncation": truncation,
    "kl_spike": kl_spike,
    "clip_ratio": clip_ratio,
    "logprob_mismatch": logprob_mismatch,
    "stale_drops": stale_drops,
    "rollout_wait": rollout_wait,
}


def diagnose(rows: MetricRows, settings: RunSettings | None = None) -> list[Finding]:
    """Every rule's finding on `rows` (metrics.jsonl's, in any order), in RULES' order; [] for a healthy run."""
    settings = settings or RunSettings()
    return [f for rule in RULES.values() if (f := rule(rows, settings)) is not None]


__all__ = ["RULES", "Finding", "MetricRows", "Rule", "RunSettings", "diagnose"]
