"""LearnerConfig: every knob of the update step, as one plain dataclass (the service maps its settings onto it).

Its loss settings default to the loss settings' one definition, grpo.algo.presets.DEFAULTS.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from grpo.algo.presets import DEFAULTS
from grpo.trainer.learner.policy import LoraOptions


@dataclass
class LearnerConfig:
    model: str = "tiny"
    """Local HF folder, hub id, or "tiny" for the built-in model."""
    backend: str = "torch"
    """"torch" (one process, CPU or GPU) or "deepspeed" (ZeRO, launched with torchrun)."""
    device: str = "auto"
    """"auto" = cuda when available, else cpu (torch backend)."""
    seed: int = 0

    # optimizer and schedule
    lr: float = 1e-6
    weight_decay: float = 0.0
    betas: tuple[float, float] = (0.9, 0.99)
    adam_eps: float = 1e-8
    warmup_steps: int = 0
    lr_schedule: str = "constant"
    """"constant" or "cosine" after the linear warm-up."""
    total_steps: int = 1000
    """Optimizer steps the cosine schedule spans."""
    min_lr_ratio: float = 0.0
    max_grad_norm: float = 1.0
    """Clip the global grad norm to this (0 = no clipping, the norm is still reported)."""

    # batching
    micro_batch_size: int = 8
    """Rows per forward/backward; gradients accumulate over micro-batches into one optimizer step."""
    max_tokens_per_micro_batch: int | None = None
    """Optional cap on padded tokens per micro-batch (long rows get smaller micro-batches)."""
    packing: bool | Literal["auto"] = False
    """Pack several samples into each row (first-fit decreasing, no sample split) instead of padding each to the
    micro-batch's longest: true, false (the library's default; the trainer's `packing` setting, "auto" by default, is
    always passed), or "auto" (a batch is packed when that cuts its token
    positions by 30 % or more, batch.packing_pays; never on a model that fails the start-up check, which then
    pads). Without max_tokens_per_micro_batch: rows as long as the batch's longest sample,
    micro_batch_size rows per micro-batch (the padded path's largest micro-batch). With it: as many rows of the
    longest sample's length as fit in it (at most micro_batch_size, at least one), stretched to fill it. Rows stay
    about as long as the longest sample because eager attention holds each row's T×T weights. Attention stays
    inside each sample (position ids restart per sample, no attention mask); loss, gradients and every metric
    equal the padded path's up to float rounding. At start-up the Learner checks that the model keeps packed
    samples apart (packing.check_packed_attention) and, with packing true, refuses to start otherwise."""
    ppo_epochs: int = 1
    """Optimizer steps per batch (one per pass); > 1 forces an old-log-prob recomputation."""

    # loss (passed to grpo.algo.policy_loss): the settings' defaults are LossConfig's (grpo.algo.presets.DEFAULTS);
    # the trainer fills every one from its resolved preset (grpo.trainer.assemble.learner_config)
    temperature: float = 1.0
    """Sampling temperature: log-probs are log_softmax(logits / temperature), as the sampler computes them."""
    clip_low: float = DEFAULTS.clip_low
    clip_high: float = DEFAULTS.clip_high
    beta: float = DEFAULTS.beta
    """KL coefficient; 0 = no reference model is loaded at all."""
    kl_kind: str = DEFAULTS.kl_kind
    agg: str = DEFAULTS.agg
    ratio_level: str = DEFAULTS.ratio_level
    max_len: int | None = None
    """Constant normaliser for agg="seq_mean_token_sum" (the generation budget)."""
    tis_cap: float | None = DEFAULTS.tis_cap
    """Truncated importance sampling cap against the sampler's log-probs (None = off)."""
    mask_truncated: bool = DEFAULTS.mask_truncated
    """Completions cut by the length limit contribute no token to the loss (DAPO overlong masking)."""
    sampler_exact: bool = False
    """The sampler computes log-probs in fp32 with the trainer's definition (HF fp32 engine): reuse them."""
    log_entropy: bool = True

    # reference model
    ref_refresh_steps: int = DEFAULTS.ref_refresh_steps or 0
    """Copy the policy into the reference every N updates (0 = never, a preset's None)."""

    # memory / precision
    gradient_checkpointing: bool = False
    precision: str = "auto"
    """"fp32", "bf16" or "auto" (bf16 on GPU unless sampler_exact, fp32 on CPU): the one precision of the policy,
    π_old and the reference forward passes (see `resolve_precision`); log-probs, ratios and KL are always fp32."""
    lora: LoraOptions | None = None

    # deepspeed
    zero_stage: int = 2
    offload_optimizer: bool = False

    def validate(self) -> None:
        """Raise ValueError naming the field when a value cannot work."""
        checks = [
            (self.backend in ("torch", "deepspeed"), "backend", "must be 'torch' or 'deepspeed'"),
            (self.micro_batch_size >= 1, "micro_batch_size", "must be ≥ 1"),
            (self.ppo_epochs >= 1, "ppo_epochs", "must be ≥ 1"),
            (self.temperature > 0, "temperature", "must be > 0 (greedy sampling still uses log_softmax at T=1)"),
            (self.lr > 0, "lr", "must be > 0"),
            (self.warmup_steps >= 0, "warmup_steps", "must be ≥ 0"),
            (self.lr_schedule in ("constant", "cosine"), "lr_schedule", "must be 'constant' or 'cosine'"),
            (self.beta >= 0, "beta", "must be ≥ 0"),
            (self.zero_stage in (1, 2, 3), "zero_stage", "must be 1, 2 or 3"),
            (self.precision in ("auto", "fp32", "bf16"), "precision", "must be 'auto', 'fp32' or 'bf16'"),
            (
                not (self.sampler_exact and self.precision == "bf16"),
                "precision",
                "cannot be 'bf16' with sampler_exact: the sampler's fp32 log-probs are exact only against an fp32 "
                "forward (use precision fp32, or drop sampler_exact and let the trainer recompute π_old)",
            ),
            (self.agg != "seq_mean_token_sum" or bool(self.max_len), "max_len", "is required by seq_mean_token_sum"),
        ]
        for ok, name, why in checks:
            if not ok:
                raise ValueError(f"learner.{name}={getattr(self, name)!r} {why}")


def resolve_precision(precision: str, *, on_gpu: bool, sampler_exact: bool) -> str:
    """`fp32` or `bf16` for a LearnerConfig.precision.

    `auto` is bf16 on a GPU (its speed and memory are why one has a GPU) and fp32 on a CPU, where bf16 is slow and
    fp32 keeps ratios exact. With sampler_exact it is fp32: π_old is then the sampler's fp32 log-probs, and a bf16
    forward of the same weights would differ from them by bf16 rounding, not by a policy change.
    """
    if precision != "auto":
        return precision
    return "bf16" if on_gpu and not sampler_exact else "fp32"
