"""Pure helpers of the update step: where π_old comes from, and how per-micro-batch metrics combine."""

from __future__ import annotations

from enum import StrEnum
from typing import NamedTuple

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


LOSS_KEYS = frozenset({"loss", "pg_loss", "kl_loss", "sft_loss"})


class MetricPart(NamedTuple):
    """One micro-batch's metrics with its share of the batch loss and its counted tokens."""

    share: float
    tokens: int
    metrics: dict[str, float]


def merge_metrics(parts: list[MetricPart]) -> dict[str, float]:
    """The whole batch's metrics from its micro-batches' (on any number of ranks, however split).

    Losses add up by loss share (the shares sum to 1); *_min/*_max take the min/max; every other metric
    is a per-token mean, so it is weighted by counted tokens. Parts with no counted token (padding
    passes, fully masked rows) do not count, unless nothing else does.
    """
    parts = [p for p in parts if p.tokens > 0] or parts
    total_tokens = sum(p.tokens for p in parts) or 1
    out: dict[str, float] = {}
    for key in sorted({k for p in parts for k in p.metrics}):
        have = [p for p in parts if key in p.metrics]
        values = [p.metrics[key] for p in have]
        if key in LOSS_KEYS:
            out[key] = sum(p.share * p.metrics[key] for p in have)
        elif key.endswith("_min"):
            out[key] = min(values)
        elif key.endswith("_max"):
            out[key] = max(values)
        else:
            out[key] = sum(p.tokens * p.metrics[key] for p in have) / total_tokens
    return out


def batch_stats(samples: list[TrainableSample]) -> dict[str, float]:
    """Response length mean/max and truncation rate of the batch as sampled (before masking). An episode's length
    counts the model's tokens only, as rollout/response_len_mean does: tool output is not the model's response."""
    lengths = [s.model_tokens() for s in samples]
    return {
        "response_length_mean": sum(lengths) / len(lengths),
        "response_length_max": float(max(lengths)),
        "truncation_rate": sum(s.truncated for s in samples) / len(samples),
    }
