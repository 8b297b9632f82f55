"""LearnerConfig: every knob of the update step, as one plain dataclass (the service maps its settings onto it)."""

from __future__ import annotations

from dataclasses import dataclass

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
    ppo_epochs: int = 1
    """Optimizer steps per batch (one per pass); > 1 forces an old-log-prob recomputation."""

    # loss (passed to grpo.algo.policy_loss)
    temperature: float = 1.0
    """Sampling temperature: log-probs are log_softmax(logits / temperature), as the sampler computes them."""
    clip_low: float = 0.2
    clip_high: float = 0.2
    beta: float = 0.0
    """KL coefficient; 0 = no reference model is loaded at all."""
    kl_kind: str = "k3"
    agg: str = "seq_mean_token_mean"
    ratio_level: str = "token"
    max_len: int | None = None
    """Constant normaliser for agg="seq_mean_token_sum" (the generation budget)."""
    tis_cap: float | None = None
    """Truncated importance sampling cap against the sampler's log-probs (None = off)."""
    mask_truncated: bool = False
    """Completions cut by the length limit contribute no token to the loss (DAPO overlong masking)."""
    sampler_exact: bool = False
    """The sampler computes log-probs in fp32 with the trainer's definition (HF fp32 engine): reuse them."""
    log_entropy: bool = True

    # reference model
    ref_refresh_steps: int = 400
    """Copy the policy into the reference every N updates (R1: 400; 0 = never)."""

    # memory / precision
    gradient_checkpointing: bool = False
    bf16: bool = True
    """bf16 autocast on GPU (ignored on CPU)."""
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
            (self.agg != "seq_mean_token_sum" or bool(self.max_len), "max_len", "is required by seq_mean_token_sum"),
        ]
        for ok, name, why in checks:
            if not ok:
                raise ValueError(f"learner.{name}={getattr(self, name)!r} {why}")
