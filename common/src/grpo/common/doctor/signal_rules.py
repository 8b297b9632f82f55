"""The doctor's rules on the learning signal: groups without one, unbalanced prompts, reward hacking, truncation.

Each rule is a pure function of the run's metric rows and settings returning a Finding or None. The metric names
are the trainer's (grpo.trainer.run and grpo.trainer.consumer.group_metrics): rollout/* describe every group the
policy sampled in a step, groups/* the verdict each group got.
"""

from __future__ import annotations

import math

from grpo.common.doctor.series import Finding, MetricRows, RunSettings, Series, first_and_last, series

# Half the groups without a reward difference: each step then trains on half the rollouts it paid for, and with
# few groups left the gradient is mostly noise. DAPO's dynamic sampling was made for exactly this.
ZERO_VARIANCE_HIGH = 0.5
# A move of the mean reward smaller than a tenth of the per-step reward std is "flat": the batch mean of a few
# hundred samples wanders that much from step to step without any learning.
FLAT_STD_FRACTION = 0.1
# A quarter of a per-step std is a real move (far beyond the noise of a mean over a window of steps), so reward
# "rising" and a component "falling" both use it.
TREND_STD_FRACTION = 0.25
# ...and a component must also fall by five points of a 0–1 rule score (R1's rewards are 0/1 rules): a rare
# penalty (an overlong ramp that seldom fires) has a tiny std, and a wobble of its mean is not a degradation.
COMPONENT_DROP_MIN = 0.05
# Completions 1.5× longer while accuracy did not rise: the reward pays for length, not for answers.
LENGTH_GROWTH = 1.5
# One completion in ten cut by the length limit: its reward judges an unfinished answer, and the policy learns
# to pad or to stop early (DAPO's overlong problem).
TRUNCATION_HIGH = 0.1
# A truncation rate that grew by five points over the run is heading there even while still under 10 %.
TRUNCATION_RISE = 0.05
# Imbalance: at a middling batch accuracy, groups of prompts of one difficulty are almost never all-right or
# all-wrong (0.5^8·2 < 1 % at G = 8); when half the groups are, prompts are split into solved and unsolvable.
IMBALANCE_ZERO_VARIANCE = 0.5
IMBALANCE_EXCESS = 0.4  # how far the observed fraction must exceed what one shared difficulty would give
# With direct evidence, each side (all-right groups, all-wrong groups) must hold a fifth of the groups: one side
# alone is a prompt set too easy or too hard (zero_variance's symptom), not one split in two.
SPLIT_SIDE_MIN = 0.2
# unbalanced_groups' remedy: difficulty buckets (docs/algorithms.md), with refill for the flat groups that remain.
BUCKETS_REMEDY = (
    "difficulty buckets: skip_solved_after: 2 and set_aside_after: 4 pass over the prompts every sample solves or none "
    "does (docs/algorithms.md); DAPO's dynamic sampling (refill_zero_variance: true) replaces the flat groups left"
)
BUCKETS_SETTINGS = ("skip_solved_after", "set_aside_after", "skip_flat_above", "refill_zero_variance")
MIDDLING_ACCURACY = (0.2, 0.8)  # outside it, all-right (or all-wrong) groups are expected of any prompt set
# Without the run's settings, the smallest group there is: its expected all-equal fraction is the largest, so
# the imbalance rule errs towards silence.
UNKNOWN_GROUP_SIZE = 2


def _std_scale(rows: MetricRows, key: str) -> float:
    """The mean per-step std of a rollout metric (its `_std` twin; for the accuracy, √(p(1−p)) of its mean)."""
    if key == "rollout/accuracy":
        p = series(rows, key).mean()
        return math.sqrt(max(p * (1 - p), 0.0))
    twin = series(rows, key.removesuffix("_mean") + "_std")
    return twin.mean() if len(twin) else 0.0


def zero_variance(rows: MetricRows, settings: RunSettings) -> Finding | None:
    """Loss and reward flat while many groups have no reward difference: no signal to learn from."""
    zv = first_and_last(series(rows, "groups/zero_variance_fraction"))
    reward = first_and_last(series(rows, "rollout/reward_mean"))
    if zv is None or reward is None:
        return None
    late_zv = zv[1]
    change = reward[1].mean() - reward[0].mean()
    if late_zv.mean() < ZERO_VARIANCE_HIGH or abs(change) > FLAT_STD_FRACTION * _std_scale(rows, "rollout/reward_mean"):
        return None
    refilling = settings.refill_zero_variance or any(v > 0 for v in series(rows, "groups/refills").values)
    remedy = (
        "dynamic sampling is on and not enough: raise max_refill_per_step, or give prompts the policy solves "
        "sometimes (neither always nor never)"
        if refilling
        else "turn on DAPO's dynamic sampling, refill_zero_variance: true (with skip_zero_variance: true), so each "
        "step refills the dropped groups with new prompts; or give prompts of a difficulty the policy solves sometimes"
    )
    return Finding(
        rule="zero_variance",
        symptom="loss and reward flat: most groups have all-equal rewards, so they carry no gradient",
        evidence=f"{late_zv.describe()}; rollout/reward_mean {reward[0].mean():.3g} → {reward[1].mean():.3g} "
        f"(steps {reward[0].span[0]}–{reward[1].span[1]})",
        remedy=remedy,
        settings=("max_refill_per_step",) if refilling else ("refill_zero_variance", "skip_zero_variance"),
        steps=(zv[0].span[0], late_zv.span[1]),
    )


def unbalanced_groups(rows: MetricRows, settings: RunSettings) -> Finding | None:
    """Reward very unbalanced across groups: prompts split into always-solved and never-solved. Judged on the
    trainer's direct evidence (groups/all_solved_fraction, groups/none_solved_fraction) when it logged them, else
    inferred from the zero-variance fraction at a middling accuracy (an older metrics file)."""
    solved = first_and_last(series(rows, "groups/all_solved_fraction"))
    unsolved = first_and_last(series(rows, "groups/none_solved_fraction"))
    if solved is not None and unsolved is not None:
        return _split_groups(solved[1], unsolved[1], settings)
    zv = first_and_last(series(rows, "groups/zero_variance_fraction"))
    acc = first_and_last(series(rows, "rollout/accuracy"))
    if zv is None or acc is None:
        return None
    late_zv, p = zv[1], acc[1].mean()
    g = settings.group_size or UNKNOWN_GROUP_SIZE
    expected = p**g + (1 - p) ** g
    low, high = MIDDLING_ACCURACY
    if not low <= p <= high or late_zv.mean() < IMBALANCE_ZERO_VARIANCE or late_zv.mean() < expected + IMBALANCE_EXCESS:
        return None
    return Finding(
        rule="unbalanced_groups",
        symptom="reward very unbalanced across groups: prompts are either always solved or never",
        evidence=f"{late_zv.describe()} at a batch accuracy of {p:.3g} ({acc[1].key}, same steps), where prompts of "
        f"one difficulty would give {expected:.2g} all-equal groups of {g}"
        + ("" if settings.group_size else " (group size unknown: assumed 2)"),
        remedy=BUCKETS_REMEDY,
        settings=BUCKETS_SETTINGS,
        steps=late_zv.span,
    )


def _split_groups(solved: Series, unsolved: Series, settings: RunSettings) -> Finding | None:
    """unbalanced_groups on the last window's all-right and all-wrong group shares: both sides well present, and
    together far more than prompts of one difficulty at the same accuracy would give."""
    a, n = solved.mean(), unsolved.mean()
    g = settings.group_size or UNKNOWN_GROUP_SIZE
    # The batch accuracy those shares imply at the least (the mixed groups' samples are not known): a/(a+n).
    p = a / (a + n) if a + n > 0 else 0.5
    expected = p**g + (1 - p) ** g
    if min(a, n) < SPLIT_SIDE_MIN or a + n < max(IMBALANCE_ZERO_VARIANCE, expected + IMBALANCE_EXCESS):
        return None
    return Finding(
        rule="unbalanced_groups",
        symptom="reward very unbalanced across groups: prompts are either always solved or never",
        evidence=f"{solved.describe()} all right and {unsolved.key} {n:.3g} all wrong (same steps): "
        f"{a + n:.2g} of the groups teach nothing, where prompts of one difficulty would give {expected:.2g} "
        f"all-equal groups of {g}" + ("" if settings.group_size else " (group size unknown: assumed 2)"),
        remedy=BUCKETS_REMEDY,
        settings=BUCKETS_SETTINGS,
        steps=solved.span,
    )


def reward_hacking(rows: MetricRows, settings: RunSettings) -> Finding | None:
    """Reward rising while a component (format, accuracy, a penalty) falls, or length grows without accuracy."""
    reward = first_and_last(series(rows, "rollout/reward_mean"))
    if reward is None or reward[1].mean() - reward[0].mean() < TREND_STD_FRACTION * _std_scale(
        rows, "rollout/reward_mean"
    ):
        return None
    keys = sorted({k for row in rows for k in row if k.startswith("rollout/reward/") and k.endswith("_mean")})
    fallen: list[tuple[Series, Series]] = []
    for key in [*keys, "rollout/accuracy"]:
        windows = first_and_last(series(rows, key))
        if windows is None:
            continue
        drop = windows[0].mean() - windows[1].mean()
        if drop >= max(COMPONENT_DROP_MIN, TREND_STD_FRACTION * _std_scale(rows, key)):
            fallen.append(windows)
    evidence = [f"{w[0].key} {w[0].mean():.3g} → {w[1].mean():.3g}" for w in fallen]
    length = first_and_last(series(rows, "rollout/response_len_mean"))
    acc = first_and_last(series(rows, "rollout/accuracy"))
    longer = length is not None and length[1].mean() >= LENGTH_GROWTH * length[0].mean()
    if longer and length is not None and acc is not None and acc[1].mean() <= acc[0].mean():
        evidence.append(f"rollout/response_len_mean {length[0].mean():.3g} → {length[1].mean():.3g} tokens while "
                        f"rollout/accuracy went {acc[0].mean():.3g} → {acc[1].mean():.3g}")  # fmt: skip
    if not evidence:
        return None
    return Finding(
        rule="reward_hacking",
        symptom="reward hacking suspected: the reward rises while what it should measure degrades",
        evidence=f"rollout/reward_mean {reward[0].mean():.3g} → {reward[1].mean():.3g} (steps {reward[0].span[0]}–"
        f"{reward[1].span[1]}, first vs last {len(reward[1])} steps) while " + "; ".join(evidence),
        remedy="read the completions of the last steps; weight the degrading component up (reward_weights), or add "
        "a rule to the reward that catches the exploit (a format check, a length penalty)",
        settings=("reward_weights",),
        steps=(reward[0].span[0], reward[1].span[1]),
    )


def truncation(rows: MetricRows, settings: RunSettings) -> Finding | None:
    """Completions cut by the length limit: many, or more and more."""
    windows = first_and_last(series(rows, "rollout/truncation_rate"))
    if windows is None:
        return None
    first, last = windows
    rising = last.mean() - first.mean() >= TRUNCATION_RISE
    if last.mean() < TRUNCATION_HIGH and not rising:
        return None
    trend = (
        f"{first.key} {first.mean():.3g} → {last.mean():.3g} (steps {first.span[0]}–{first.span[1]} vs "
        f"{last.span[0]}–{last.span[1]})"
    )
    return Finding(
        rule="truncation",
        symptom="completions cut by the length limit" + (", more and more" if rising else ""),
        evidence=trend if rising else last.describe(),
        remedy="give a larger budget (max_new_tokens), or shape the length: overlong_soft_penalty: true with "
        "overlong_buffer (DAPO's soft penalty), and mask_truncated: true so cut answers teach nothing",
        settings=("max_new_tokens", "overlong_soft_penalty", "overlong_buffer", "mask_truncated"),
        steps=(first.span[0] if rising else last.span[0], last.span[1]),
    )
