"""Each of the doctor's rules fires on a metric series that shows its symptom and stays silent on a healthy run.

The healthy run (tests/support/doctor_runs.py) is shaped like the demo's.
"""

from __future__ import annotations

import pytest

from grpo.common.doctor import RULES, Finding, RunSettings, diagnose
from grpo.common.doctor.series import MIN_TREND_STEPS, series
from tests.support.doctor_runs import DEMO, LOGGED, const, ramp, run


def fired(rows: list[dict[str, object]], rule: str, settings: RunSettings = DEMO) -> Finding:
    finding = RULES[rule](rows, settings)
    assert finding is not None, f"{rule} silent"
    assert finding.rule == rule and finding.symptom and finding.evidence and finding.remedy and finding.settings
    return finding


def test_a_healthy_run_has_no_finding() -> None:
    assert diagnose(run(), DEMO) == []
    assert diagnose(run(**LOGGED), DEMO) == []  # with the rows the trainer logs now
    assert diagnose(run(**LOGGED), RunSettings()) == []
    assert diagnose(run(), RunSettings()) == []  # nor without its settings
    assert diagnose(run(200), DEMO) == []


def test_flat_reward_with_most_groups_all_equal() -> None:
    rows = run(rollout__reward_mean=const(0.9), groups__zero_variance_fraction=const(0.7), rollout__accuracy=const(0.1))
    f = fired(rows, "zero_variance")
    assert "groups/zero_variance_fraction 0.7" in f.evidence and f.settings[0] == "refill_zero_variance"
    refilling = fired(rows, "zero_variance", RunSettings(refill_zero_variance=True))
    assert refilling.settings == ("max_refill_per_step",)
    assert RULES["zero_variance"](run(groups__zero_variance_fraction=const(0.7)), DEMO) is None  # reward rises


def test_unbalanced_groups_at_middling_accuracy() -> None:
    rows = run(rollout__accuracy=const(0.5), groups__zero_variance_fraction=const(0.6))
    f = fired(rows, "unbalanced_groups")
    assert "batch accuracy of 0.5" in f.evidence and "groups of 8" in f.evidence
    # Groups of 2 are all-equal half the time at p = 0.5 anyway: no evidence of imbalance.
    assert RULES["unbalanced_groups"](rows, RunSettings(group_size=2)) is None
    assert RULES["unbalanced_groups"](rows, RunSettings()) is None  # unknown G errs towards silence


def test_unbalanced_groups_from_the_logged_split() -> None:
    split = {**LOGGED, "groups/all_solved_fraction": const(0.35), "groups/none_solved_fraction": const(0.3)}
    f = fired(run(**split), "unbalanced_groups")
    assert "groups/all_solved_fraction 0.35" in f.evidence and "none_solved_fraction 0.3 all wrong" in f.evidence
    # The logged split outweighs the inference: the same zero-variance share at a middling accuracy is no finding
    # when the all-equal groups are nearly all solved (a prompt set getting easy, not split in two).
    easy = {**LOGGED, "groups/all_solved_fraction": const(0.55), "groups/none_solved_fraction": const(0.05)}
    inferred = run(rollout__accuracy=const(0.5), groups__zero_variance_fraction=const(0.6))
    assert RULES["unbalanced_groups"](inferred, DEMO) is not None
    assert RULES["unbalanced_groups"](run(**easy, rollout__accuracy=const(0.5),
                                          groups__zero_variance_fraction=const(0.6)), DEMO) is None  # fmt: skip


def test_reward_rising_while_a_component_falls() -> None:
    f = fired(run(rollout__reward__format_mean=ramp(0.98, 0.5)), "reward_hacking")
    assert "rollout/reward/format_mean 0.9" in f.evidence and "→ 0.5" in f.evidence
    assert f.settings == ("reward_weights",)
    longer = run(rollout__accuracy=const(0.45), rollout__reward__math_mean=const(0.45),
                 rollout__response_len_mean=ramp(16, 40))  # fmt: skip
    assert "rollout/response_len_mean" in fired(longer, "reward_hacking").evidence


def test_truncation_high_or_rising() -> None:
    assert "0.3" in fired(run(rollout__truncation_rate=const(0.3)), "truncation").evidence
    rising = fired(run(rollout__truncation_rate=ramp(0.0, 0.08)), "truncation")
    assert "more and more" in rising.symptom and "max_new_tokens" in rising.settings


def test_kl_spike_names_beta_and_the_refresh() -> None:
    spiking = run(train__kl=lambda step, t: 0.8 if step == 30 else 0.1)
    f = fired(spiking, "kl_spike", RunSettings(beta=0.001, ref_refresh_steps=0))
    assert "train/kl 0.8 at step 30" in f.evidence and "beta 0.001" in f.evidence
    assert f.settings == ("beta", "ref_refresh_steps") and f.steps == (30, 30)
    steady = fired(spiking, "kl_spike", RunSettings(beta=0.1, ref_refresh_steps=5))
    assert steady.settings == ("lr",)  # β is large and the reference refreshed: the steps are too large
    high = fired(run(train__kl=const(0.7)), "kl_spike")
    assert "stays high" in high.symptom


def test_kl_spike_reads_beta_and_the_refresh_from_the_rows() -> None:
    spike = {"train/kl": lambda step, t: 0.8 if step == 30 else 0.1}
    # The settings say β is large and the reference refreshed; the rows say otherwise, and they win.
    never = run(**{**LOGGED, **spike, "train/beta": const(0.0005), "train/steps_since_ref_refresh": const(-1.0)})
    f = fired(never, "kl_spike", RunSettings(beta=0.1, ref_refresh_steps=5))
    assert "beta 0.0005 (train/beta)" in f.evidence and "no reference refresh up to step 30" in f.evidence
    assert f.settings == ("beta", "ref_refresh_steps")
    refreshed = run(**{**LOGGED, **spike, "train/beta": const(0.1),
                       "train/steps_since_ref_refresh": lambda step, t: float(step % 5)})  # fmt: skip
    f = fired(refreshed, "kl_spike", RunSettings(beta=0.001, ref_refresh_steps=0))
    assert f.settings == ("lr",) and "reference refreshed" in f.evidence
    # Not refreshed yet by the spike (every 400): the reference is as old as the run.
    assert fired(run(**{**LOGGED, **spike}), "kl_spike", RunSettings()).settings == ("beta", "ref_refresh_steps")


def test_clip_fraction_and_ratio_out_of_range() -> None:
    clipped = fired(run(train__clip_frac=lambda step, t: 0.35 if 20 <= step <= 26 else 0.02), "clip_ratio")
    assert "train/clip_frac 0.35" in clipped.evidence and "lr" in clipped.settings
    assert "train/ratio_max 15" in fired(run(train__ratio_max=const(15.0)), "clip_ratio").evidence


def test_sampler_trainer_logprob_mismatch() -> None:
    assert "train/tis_weight_mean 0.8" in fired(run(train__tis_weight_mean=const(0.8)), "logprob_mismatch").evidence
    capped = fired(run(train__tis_truncated_frac=const(0.1)), "logprob_mismatch")
    assert "train/tis_truncated_frac" in capped.evidence and "tis_cap" in capped.settings


def test_stale_drops() -> None:
    f = fired(run(groups__stale=const(8.0)), "stale_drops")
    assert "groups/stale 320 of" in f.evidence and "max_staleness 1" in f.symptom
    assert RULES["stale_drops"](run(groups__stale=lambda step, t: 1.0 if step == 7 else 0.0), DEMO) is None


def test_rollout_wait_dominating_the_step() -> None:
    rows = run(**{"time/wait_rollouts_s": const(9.5), "time/step_s": const(10.0)})
    f = fired(rows, "rollout_wait", RunSettings(max_staleness=0))
    assert "95%" in f.evidence and "async" in f.remedy
    assert "async" not in fired(rows, "rollout_wait", RunSettings(max_staleness=1)).remedy


def test_a_short_run_shows_no_trend_and_bad_values_are_skipped() -> None:
    short = run(MIN_TREND_STEPS - 1, rollout__truncation_rate=ramp(0.0, 0.08))
    assert RULES["truncation"](short, DEMO) is None  # too few steps to tell a trend from noise
    waiting = run(2, **{"time/wait_rollouts_s": const(1.0), "time/step_s": const(1.0)})
    assert RULES["rollout_wait"](waiting, DEMO) is None  # two steps say nothing of a run's pace
    rows: list[dict[str, object]] = [
        {"step": 1, "train/kl": "nan"},
        {"step": 2, "train/kl": 0.1},
        {"step": 2, "train/kl": 0.2},
        {"x": 1},
    ]
    kl = series(rows, "train/kl")
    assert kl.steps == (2,) and kl.values == (0.2,)  # text (a NaN the sink kept) skipped; a step's last row wins


@pytest.mark.parametrize("rule", sorted(RULES))
def test_every_rule_is_silent_on_no_rows(rule: str) -> None:
    assert RULES[rule]([], RunSettings()) is None
