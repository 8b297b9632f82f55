"""Check 1, learner_precision: one GRPO update of the Learner in bf16 (autocast over fp32 master weights) and in
fp32, same weights and batch: losses, gradient norms and directions, parameter updates, step time."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from gpu_check.shared import (
    LEARNER_DEFAULTS,
    Ctx,
    cosine,
    flat_grads,
    flat_params,
    freed,
    make_learner,
    median_ms,
    rel_diff,
    synthetic_batch,
    tensor_rel_diff,
    timed,
)

if TYPE_CHECKING:
    import torch

    from grpo.trainer.learner import Learner, TrainableSample


def batch_objective(learner: Learner, samples: list[TrainableSample]) -> tuple[float, float]:
    """(J, nll) of the whole batch at the learner's weights and precision: J = mean over samples of
    advantage × token-mean log-prob (what a GRPO step raises), nll = token-mean −log-prob of the completions."""
    import torch

    from grpo.trainer.learner.batch import collate
    from grpo.trainer.learner.policy import forward_logprobs

    mb = collate(samples, learner.pad_token_id, mask_truncated=False).to(learner.backend.device)
    with torch.no_grad(), learner.backend.autocast():
        logp, _ = forward_logprobs(learner.model, mb, 1.0)
    logp, mask = logp.double(), mb.completion_mask.double()
    per_sample = (logp * mask).sum(1) / mask.sum(1)
    objective = float((per_sample * mb.advantages.double()).mean())
    nll = float(-(logp * mask).sum() / mask.sum())
    return objective, nll


def check_learner_precision(ctx: Ctx) -> dict[str, Any]:
    """One GRPO update in bf16 (autocast over fp32 master weights) and fp32, same weights and batch."""
    batch = synthetic_batch(ctx.sizes, ctx.vocab)
    runs: dict[str, dict[str, Any]] = {}
    vectors: dict[str, dict[str, torch.Tensor]] = {}
    for precision in ("fp32", "bf16"):
        learner = make_learner(ctx, precision)
        with freed():
            before = flat_params(learner.model)
            objective0, nll0 = batch_objective(learner, batch)
            metrics = learner.accumulate_gradients(batch)  # the Learner's loss + backward, no optimizer step
            grads = flat_grads(learner.model)
            grad_norm = learner.backend.optimizer_step()  # clip + AdamW + schedule: what step() does next
            delta = flat_params(learner.model) - before
            objective1, _ = batch_objective(learner, batch)
            times, step_losses = [], []
            for i in range(ctx.sizes.warmup + ctx.sizes.reps):
                seconds, m = timed(ctx.device, lambda learner=learner: learner.step(batch))
                if i >= ctx.sizes.warmup:
                    times.append(seconds)
                    step_losses.append(m["loss"])
            runs[precision] = {
                "backend_precision": learner.backend.precision,
                "autocast_dtype": str(learner.backend.autocast_dtype),
                "loss": metrics["loss"],
                "pg_loss": metrics.get("pg_loss", float("nan")),
                "entropy": metrics.get("entropy", float("nan")),
                "nll": nll0,
                "grad_norm": grad_norm,
                "update_norm": float(delta.norm()),
                "objective_before": objective0,
                "objective_after": objective1,
                "objective_gain": objective1 - objective0,
                "step_ms_median": median_ms(times),
                "step_ms_all": [1000 * t for t in times],
                "timed_step_losses": step_losses,
                "tokens_per_step": sum(len(s.prompt_token_ids) + len(s.completion_token_ids) for s in batch),
            }
            vectors[precision] = {"grads": grads, "delta": delta}
    f32, b16 = runs["fp32"], runs["bf16"]
    compare = {
        "loss_abs_diff": abs(b16["loss"] - f32["loss"]),
        "loss_rel_diff": rel_diff(b16["loss"], f32["loss"]),
        "nll_rel_diff": rel_diff(b16["nll"], f32["nll"]),
        "grad_norm_rel_diff": rel_diff(b16["grad_norm"], f32["grad_norm"]),
        "grad_rel_diff": tensor_rel_diff(vectors["bf16"]["grads"], vectors["fp32"]["grads"]),
        "grad_cosine": cosine(vectors["bf16"]["grads"], vectors["fp32"]["grads"]),
        "update_rel_diff": tensor_rel_diff(vectors["bf16"]["delta"], vectors["fp32"]["delta"]),
        "update_cosine": cosine(vectors["bf16"]["delta"], vectors["fp32"]["delta"]),
        "objective_gain_rel_diff": rel_diff(b16["objective_gain"], f32["objective_gain"]),
        "step_time_bf16_over_fp32": b16["step_ms_median"] / f32["step_ms_median"],
    }
    problems = []
    if not all(math.isfinite(r[k]) for r in runs.values() for k in ("loss", "nll", "grad_norm")):
        problems.append("non-finite loss, nll or grad norm")
    if compare["grad_cosine"] < 0.9:
        problems.append(f"bf16 gradient direction far from fp32 (cosine {compare['grad_cosine']:.3f})")
    summary = (
        f"nll rel {compare['nll_rel_diff']:.1e}, grad_norm rel {compare['grad_norm_rel_diff']:.1e}, "
        f"grad cos {compare['grad_cosine']:.5f}, update rel {compare['update_rel_diff']:.1e}, "
        f"step bf16 {b16['step_ms_median']:.1f} / fp32 {f32['step_ms_median']:.1f} ms"
    )
    return {
        "batch": {"samples": len(batch), "micro_batch_size": ctx.sizes.micro_batch, **LEARNER_DEFAULTS},
        "note": "loss is the step's GRPO loss at ratio 1 (π_old = current policy): −mean advantage, ~0 by "
        "construction with group-normalised advantages; nll and objective_gain carry the precision effect",
        "fp32": f32,
        "bf16": b16,
        "compare": compare,
        "problems": problems,
        "summary": summary,
    }
