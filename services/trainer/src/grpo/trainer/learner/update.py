"""Pure helpers of the update step: where π_old comes from, and how per-micro-batch metrics combine."""

from __future__ import annotations

from enum import StrEnum

from grpo.trainer.learner.batch import TrainableSample


class OldLogprobSource(StrEnum):
    SAMPLER = "sampler"  # the sampler's own log-probs: exact (see old_logprob_source)
    CURRENT = "current"  # logp.detach() from the training forward: θ_old == θ until the single step
    RECOMPUTE = "recompute"  # one no-grad forward before the first of several epochs


def old_logprob_source(samples: list[TrainableSample], *, ppo_epochs: int, sampler_exact: bool) -> OldLogprobSource:
    """Where π_old(o_t) comes from for this batch — the rule, in one place.

    SAMPLER whenever the sampler's log-probs are exact (it computes fp32 log_softmax(logits / T)
    like the trainer: the HF fp32 engine, never vLLM/bf16). They are the log-probs of the policy
    that actually generated each sample — the behaviour policy — so PPO's ratio π_θ / π_old also
    corrects stale samples (max_staleness > 0) exactly, and π_old stays fixed across epochs.
    Otherwise π_old is the trainer's current policy: with one epoch the weights cannot move before
    the only optimizer step, so the detached log-probs of the training forward ARE the recomputation
    (bit-identical, one forward cheaper); with several epochs it is recomputed once before the first
    pass. A stale sample's ratio then starts at 1: only TIS (tis_cap) against the inexact sampler
    log-probs corrects for the staleness.
    """
    if sampler_exact and all(s.sampler_logprobs is not None for s in samples):
        return OldLogprobSource.SAMPLER
    return OldLogprobSource.CURRENT if ppo_epochs == 1 else OldLogprobSource.RECOMPUTE


def merge_metrics(parts: list[tuple[float, dict[str, float]]]) -> dict[str, float]:
    """Combine (weight, metrics) of micro-batches: *_min → min, *_max → max, the rest weighted mean."""
    out: dict[str, float] = {}
    total = sum(w for w, _ in parts) or 1.0
    keys = {k for _, m in parts for k in m}
    for key in sorted(keys):
        values = [(w, m[key]) for w, m in parts if key in m]
        if key.endswith("_min"):
            out[key] = min(v for _, v in values)
        elif key.endswith("_max"):
            out[key] = max(v for _, v in values)
        elif key in ("loss", "pg_loss", "kl_loss"):
            out[key] = sum(w * v for w, v in values)  # weights sum to 1 per pass: the full-batch loss
        else:
            out[key] = sum(w * v for w, v in values) / total
    return out


def batch_stats(samples: list[TrainableSample]) -> dict[str, float]:
    """Response length mean/max and truncation rate of the batch as sampled (before masking)."""
    lengths = [len(s.completion_token_ids) for s in samples]
    return {
        "response_length_mean": sum(lengths) / len(lengths),
        "response_length_max": float(max(lengths)),
        "truncation_rate": sum(s.truncated for s in samples) / len(samples),
    }
