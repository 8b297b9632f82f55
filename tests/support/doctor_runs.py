"""Metric rows shaped like a healthy run (the demo's, docs/demo.md) with any metric's shape changed: the doctor's
tests make runs show one symptom each from them.

Healthy: reward and accuracy rising, more groups all-right as the policy learns, KL climbing to ~0.1 over the
warm-up and then flat, completions far under the budget, the trainer waiting for rollouts half of each step.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable

from grpo.common.doctor import RunSettings

Shape = Callable[[int, float], float]  # (step, t in [0, 1]) -> value


def const(value: float) -> Shape:
    return lambda step, t: value


def ramp(start: float, end: float) -> Shape:
    return lambda step, t: start + (end - start) * t


HEALTHY: dict[str, Shape] = {
    "rollout/reward_mean": ramp(0.9, 1.9),
    "rollout/reward_std": const(0.6),
    "rollout/reward/math_mean": ramp(0.45, 0.88),
    "rollout/reward/math_std": const(0.45),
    "rollout/reward/format_mean": const(0.98),
    "rollout/reward/format_std": const(0.1),
    "rollout/reward/overlong_mean": lambda step, t: -0.01 - 0.005 * math.sin(step),
    "rollout/reward/overlong_std": const(0.03),
    "rollout/accuracy": ramp(0.45, 0.88),
    "rollout/response_len_mean": lambda step, t: 16.5 + 0.3 * math.sin(step),
    "rollout/truncation_rate": const(0.004),
    "groups/zero_variance_fraction": ramp(0.1, 0.5),
    "groups/train": ramp(29, 16),
    "groups/zero_variance": ramp(3, 16),
    "groups/stale": const(0.0),
    "groups/refills": const(0.0),
    "train/kl": lambda step, t: 0.01 * step if step <= 10 else 0.1 + 0.01 * math.sin(step),
    "train/clip_frac": const(0.02),
    "train/ratio_mean": const(1.0),
    "train/ratio_max": lambda step, t: 1.3 + 0.2 * math.sin(step),
    "train/tis_weight_mean": const(1.0),
    "train/tis_truncated_frac": const(0.0),
    "time/wait_rollouts_s": const(2.0),
    "time/step_s": const(4.0),
}
# What the trainer logs since the doctor asked for it (a metrics file from before has none of these): the β in
# effect, the reference's age (the demo refreshes it every 400 steps), and how rewards spread across groups (as
# the policy learns, more groups all right; few ever all wrong).
LOGGED: dict[str, Shape] = {
    "train/beta": const(0.001),
    "train/steps_since_ref_refresh": lambda step, t: float(step % 400),
    "groups/all_solved_fraction": ramp(0.05, 0.45),
    "groups/none_solved_fraction": const(0.05),
    "groups/reward_mean_std": const(0.4),
}
DEMO = RunSettings(beta=0.001, ref_refresh_steps=400, group_size=8, max_staleness=1, refill_zero_variance=False)


def run(n: int = 40, /, **changes: Shape) -> list[dict[str, object]]:
    """n metrics rows of the healthy run, with some metrics' shapes changed (`/` written `__` in the names)."""
    shapes = {**HEALTHY, **{k.replace("__", "/"): v for k, v in changes.items()}}
    return [{"step": s, **{k: f(s, (s - 1) / (n - 1)) for k, f in shapes.items()}} for s in range(1, n + 1)]


def paid_length(prompts: list[str], completions: list[str], **kwargs: object) -> list[float]:
    """A reward plug-in that pays for length (a character is worth 0.05): the reward hack the doctor must catch in
    a real run (tests/service/test_doctor_real_runs.py), as TRL's `fn(prompts, completions, **kwargs)`."""
    return [0.05 * len(c) for c in completions]


def paid_by_rank(prompts: list[str], completions: list[str], **kwargs: object) -> list[float]:
    """A reward plug-in that pays 0…1 by each completion's rank in the call, ranked by a hash of its text: every
    group has a spread (an advantage for each sample, so each update moves the policy) in no direction the policy
    could learn, and the mean over a call is always ½, so the reward never rises (no reward hacking to see)."""
    if len(completions) < 2:
        return [0.5] * len(completions)
    order = sorted(range(len(completions)), key=lambda i: (hashlib.sha256(completions[i].encode()).digest(), i))
    rank = {i: r for r, i in enumerate(order)}
    return [rank[i] / (len(completions) - 1) for i in range(len(completions))]
