"""AdamW and the learning-rate schedule: linear warm-up, then constant or cosine decay."""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch


def lr_factor(step: int, *, warmup_steps: int, total_steps: int, schedule: str, min_ratio: float = 0.0) -> float:
    """Multiplier of the peak LR at optimizer step `step` (0-based).

    Warm-up ramps linearly from 1/warmup to 1 (never 0: the first step must move); cosine then
    decays to `min_ratio` at `total_steps` and stays there.
    """
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    if schedule == "constant":
        return 1.0
    if schedule == "cosine":
        span = max(total_steps - warmup_steps, 1)
        progress = min((step - warmup_steps) / span, 1.0)
        return min_ratio + (1.0 - min_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))
    raise ValueError(f"unknown lr schedule {schedule!r}: use 'constant' or 'cosine'")


def build_optimizer(
    params: Iterable[torch.nn.Parameter], *, lr: float, weight_decay: float, betas: tuple[float, float], eps: float
) -> torch.optim.AdamW:
    trainable = [p for p in params if p.requires_grad]
    if not trainable:
        raise ValueError("the model has no trainable parameters")
    # foreach is the fast multi-tensor path on CPU and GPU alike
    return torch.optim.AdamW(trainable, lr=lr, weight_decay=weight_decay, betas=betas, eps=eps, foreach=True)


def build_scheduler(
    optimizer: torch.optim.Optimizer, *, warmup_steps: int, total_steps: int, schedule: str, min_ratio: float = 0.0
) -> torch.optim.lr_scheduler.LambdaLR:
    lr_factor(0, warmup_steps=warmup_steps, total_steps=total_steps, schedule=schedule)  # validates the name now
    return torch.optim.lr_scheduler.LambdaLR(
        optimizer,
        lambda step: lr_factor(
            step, warmup_steps=warmup_steps, total_steps=total_steps, schedule=schedule, min_ratio=min_ratio
        ),
    )
