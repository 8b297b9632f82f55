"""The doctor's rules on the update and the pipeline: KL, ratio and clipping, sampler–trainer mismatch, stale
drops, and rollouts the trainer waits for.

Each rule is a pure function of the run's metric rows and settings returning a Finding or None. train/* are the
Learner's metrics of a step's update (grpo.algo.loss's diagnostics), time/* and groups/* the trainer loop's.
"""

from __future__ import annotations

import statistics
from itertools import pairwise

from grpo.common.doctor.series import (
    MIN_TREND_STEPS,
    Finding,
    MetricRows,
    RunSettings,
    Series,
    series,
    whole_span,
    worst_window,
)

# A KL spike: a step's KL at least 3× the median of the 10 steps before it and 0.1 nat/token above it. The factor
# ignores the slow climb after warm-up (the demo's KL goes 0 → ~0.1 over its 10 warm-up steps); the absolute
# jump ignores tripling from 0.001.
KL_SPIKE_FACTOR = 3.0
KL_SPIKE_JUMP = 0.1
KL_BASELINE_STEPS = 10
# Half a nat per token to the reference, sustained: far outside any trust region the KL term was meant to keep.
KL_HIGH = 0.5
# β under 0.01 barely restrains the policy (R1's 0.001 relies on the reference refresh every 400 steps).
BETA_SMALL = 0.01
# More than a fifth of the tokens clipped, sustained: each update moves the policy further than the clip range,
# so most of the batch's gradient is thrown away (PPO practice keeps the clip fraction near 0.1).
CLIP_FRAC_HIGH = 0.2
# A token 10× more likely than under π_old: the update (epochs, stale samples) went far past the trust region.
RATIO_MAX_HIGH = 10.0
# TIS weights π_old/π_sampler should sit at 1: a mean 10 % off, or 5 % of tokens at the cap, means sampler and
# trainer disagree about the same weights (a bf16 or vLLM sampler, a weight sync that did not land).
TIS_WEIGHT_DRIFT = 0.1
TIS_TRUNCATED_HIGH = 0.05
# One group in ten thrown away as too stale: a tenth of the rollout compute wasted.
STALE_DROP_FRACTION = 0.1
# The trainer idles nine tenths of each step waiting for groups: generation is the bottleneck. (A sync run on a
# CPU waits most of each step anyway; only this much is worth acting on.) Judged over MIN_TREND_STEPS steps at
# least: the first steps wait on replicas still warming up, and a run cut that short says nothing of its pace.
WAIT_SHARE_HIGH = 0.9
# Every verdict that resolves a group's task (grpo.trainer.accounting: train plus the drop reasons).
RESOLVING_VERDICTS = ("train", "zero_variance", "stale", "failed", "unscored", "timeout")


def _kl_spike(kl: Series) -> tuple[int, float, float] | None:
    """The first step whose KL spikes over the median of the steps before it: (step, kl, baseline)."""
    for i in range(KL_BASELINE_STEPS, len(kl)):
        base = statistics.median(kl.values[i - KL_BASELINE_STEPS : i])
        value = kl.values[i]
        if value >= KL_SPIKE_FACTOR * base and value - base >= KL_SPIKE_JUMP:
            return kl.steps[i], value, base
    return None


def kl_spike(rows: MetricRows, settings: RunSettings) -> Finding | None:
    """KL to the reference spiking (or sustained high): β too small and no reference refresh, or too large steps."""
    kl = series(rows, "train/kl")
    spike, high = _kl_spike(kl), worst_window(kl)
    if spike is None and (high is None or high.mean() < KL_HIGH):
        return None
    if spike is not None:
        step, value, base = spike
        evidence = f"train/kl {value:.3g} at step {step}, median {base:.3g} over the {KL_BASELINE_STEPS} steps before"
        steps = (step, step)
    else:
        assert high is not None
        evidence, steps = high.describe(), high.span
    beta, no_refresh, known = _reference_facts(rows, settings, steps[1])
    if beta is None or beta < BETA_SMALL or no_refresh:
        remedy = (
            "raise beta (R1: 0.001 with a refresh; 0.01–0.04 without one), or turn the reference refresh on or make "
            "it more frequent (ref_refresh_steps)"
        )
        names: tuple[str, ...] = ("beta", "ref_refresh_steps")
    else:
        remedy = "beta is not small and the reference is refreshed: the steps are too large; lower lr"
        names = ("lr",)
    return Finding(
        rule="kl_spike",
        symptom="KL to the reference spikes" if spike else "KL to the reference stays high",
        evidence=evidence + known,
        remedy=remedy,
        settings=names,
        steps=steps,
    )


def _until(s: Series, step: int) -> Series:
    return s.at_steps([x for x in s.steps if x <= step])


def _reference_facts(rows: MetricRows, settings: RunSettings, until: int) -> tuple[float | None, bool, str]:
    """(β, whether the reference was never refreshed up to step `until`, how the evidence says so): from the
    trainer's own rows (train/beta, train/steps_since_ref_refresh) when it logged them, else from the settings
    (an older metrics file, whose rows hold neither)."""
    logged_beta = _until(series(rows, "train/beta"), until)
    age = _until(series(rows, "train/steps_since_ref_refresh"), until)
    beta: float | None
    if len(logged_beta):
        beta = logged_beta.values[-1]
        known = f"; beta {beta:g} (train/beta)"
    else:
        beta = settings.beta
        known = f"; beta {beta:g}" if beta is not None else "; beta unknown"
    if len(age):
        # The reference's age drops (or is 0) right after a refresh; -1: the run never refreshes it.
        ages = age.values
        no_refresh = 0 not in ages and all(b >= a for a, b in pairwise(ages))
        known += ", no reference refresh" if no_refresh else ", reference refreshed"
        known += f" up to step {age.steps[-1]} (train/steps_since_ref_refresh)"
        return beta, no_refresh, known
    every = settings.ref_refresh_steps
    no_refresh = every == 0 or (every is not None and every > until)
    known += f", ref_refresh_steps {every}" if every is not None else ""
    return beta, no_refresh, known


def clip_ratio(rows: MetricRows, settings: RunSettings) -> Finding | None:
    """PPO ratio and clip fraction out of range: each update moves the policy further than the trust region."""
    clip, ratio = worst_window(series(rows, "train/clip_frac")), worst_window(series(rows, "train/ratio_max"))
    evidence = []
    if clip is not None and clip.mean() >= CLIP_FRAC_HIGH:
        evidence.append(clip)
    if ratio is not None and ratio.mean() >= RATIO_MAX_HIGH:
        evidence.append(ratio)
    if not evidence:
        return None
    return Finding(
        rule="clip_ratio",
        symptom="PPO ratio out of range: updates move the policy past the clip range",
        evidence="; ".join(s.describe() for s in evidence),
        remedy="take smaller steps: lower lr, fewer ppo_epochs, or a smaller max_staleness (stale samples start "
        "further from the policy); widening clip_low/clip_high only hides it",
        settings=("lr", "ppo_epochs", "max_staleness"),
        steps=(min(s.span[0] for s in evidence), max(s.span[1] for s in evidence)),
    )


def logprob_mismatch(rows: MetricRows, settings: RunSettings) -> Finding | None:
    """Sampler and trainer disagree on the log-probs of the same weights (seen through the TIS weights)."""
    weight = worst_window(series(rows, "train/tis_weight_mean"), highest=False)
    weight_high = worst_window(series(rows, "train/tis_weight_mean"))
    capped = worst_window(series(rows, "train/tis_truncated_frac"))
    evidence = [w for w in (weight, weight_high) if w is not None and abs(w.mean() - 1.0) >= TIS_WEIGHT_DRIFT][:1]
    if capped is not None and capped.mean() >= TIS_TRUNCATED_HIGH:
        evidence.append(capped)
    if not evidence:
        return None
    steps = (min(s.span[0] for s in evidence), max(s.span[1] for s in evidence))
    # Without sampler_exact, π_old is the trainer's current policy: a group made by older weights moves the TIS
    # weights as much as a sampler that computes the same weights differently does.
    lag = series(rows, "staleness/mean").at_steps(range(steps[0], steps[1] + 1))
    stale = len(lag) > 0 and lag.mean() > 0
    return Finding(
        rule="logprob_mismatch",
        symptom="the sampler's log-probs disagree with the trainer's: "
        + ("older weights (the groups lag the policy) or " if stale else "")
        + "the same weights computed differently",
        evidence="; ".join(s.describe() for s in evidence)
        + (f"; {lag.describe()}: the sampled weights are older than the trainer's" if stale else ""),
        remedy="check that weight pushes land (push/failed); sample in fp32 (rollout.dtype) and reuse its exact "
        "log-probs (sampler_exact: true, precision fp32); with vLLM or bf16 keep TIS on (tis_cap, 2 is usual)",
        settings=("sampler_exact", "tis_cap", "rollout.dtype"),
        steps=steps,
    )


def _total(rows: MetricRows, key: str) -> float:
    return sum(series(rows, key).values)


def stale_drops(rows: MetricRows, settings: RunSettings) -> Finding | None:
    """Many groups dropped as too stale: rollouts paid for and thrown away."""
    stale = _total(rows, "groups/stale")
    resolved = sum(_total(rows, f"groups/{v}") for v in RESOLVING_VERDICTS)
    if resolved == 0 or stale / resolved < STALE_DROP_FRACTION:
        return None
    allowed = f" (max_staleness {settings.max_staleness})" if settings.max_staleness is not None else ""
    steps = series(rows, "groups/stale")
    hit = [s for s, v in zip(steps.steps, steps.values, strict=True) if v > 0]
    # The trainer publishes at most max_staleness + 1 batches ahead and a replica takes no task made under weights
    # it lacks, so groups go stale mostly where a replica's pushes fail and it keeps generating from old weights.
    failed = _total(rows, "push/failed")
    pushes = f"; push/failed {failed:g}: weight pushes did not land" if failed else ""
    return Finding(
        rule="stale_drops",
        symptom="groups dropped as too stale" + allowed,
        evidence=f"groups/stale {stale:g} of {resolved:g} resolved groups ({stale / resolved:.0%}), at {len(hit)} "
        f"step(s) from {hit[0]} to {hit[-1]}" + pushes,
        remedy=(
            "first make the weight pushes land (the trainer's log names the replica and why); then " if failed else ""
        )
        + "raise max_staleness (keep the off-policy correction: sampler_exact, or tis_cap), or keep "
        "fewer groups in flight (fewer stack.replicas or a smaller prompts_per_step)",
        settings=("max_staleness", "prompts_per_step", "stack.replicas"),
        steps=(hit[0], hit[-1]),
    )


def rollout_wait(rows: MetricRows, settings: RunSettings) -> Finding | None:
    """The trainer spends most of each step waiting for rollouts."""
    wait, step = series(rows, "time/wait_rollouts_s"), series(rows, "time/step_s")
    common = step.at_steps(wait.steps)
    wait = wait.at_steps(common.steps)
    total = sum(common.values)
    if len(common) < MIN_TREND_STEPS or total <= 0 or sum(wait.values) / total < WAIT_SHARE_HIGH:
        return None
    async_hint = "; go async (max_staleness: 1 or more)" if not settings.max_staleness else ""
    return Finding(
        rule="rollout_wait",
        symptom="rollouts are the bottleneck: the trainer waits for groups most of each step",
        evidence=f"time/wait_rollouts_s {sum(wait.values):.4g} s of time/step_s {total:.4g} s "
        f"({sum(wait.values) / total:.0%}) over steps {common.span[0]}–{common.span[1]}",
        remedy="add rollout replicas (stack.replicas), generate with vLLM (rollout.engine: vllm)" + async_hint,
        settings=("stack.replicas", "rollout.engine", "max_staleness"),
        steps=whole_span(rows) if not common.steps else common.span,
    )
