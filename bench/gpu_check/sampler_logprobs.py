"""Check 2, sampler_logprobs: the hf engine samples (bf16 and fp32); the trainer recomputes the same tokens'
log-probs (bf16 and fp32): |diff| and importance ratio − 1."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from gpu_check.shared import Ctx, encode_prompts, freed, make_learner, prompt_texts

if TYPE_CHECKING:
    import torch

    from grpo.trainer.learner import Learner, TrainableSample


def logp_stats(trainer: torch.Tensor, sampler: torch.Tensor) -> dict[str, float]:
    """Per-token comparison of two log-prob vectors: |diff| and the importance ratio π_trainer/π_sampler − 1."""
    diff = (trainer - sampler).double()
    ratio = diff.exp()
    return {
        "tokens": int(diff.numel()),
        "mean_abs_diff": float(diff.abs().mean()),
        "max_abs_diff": float(diff.abs().max()),
        "mean_diff": float(diff.mean()),
        "mean_ratio_minus_1": float((ratio - 1).mean()),
        "mean_abs_ratio_minus_1": float((ratio - 1).abs().mean()),
        "max_abs_ratio_minus_1": float((ratio - 1).abs().max()),
    }


def trainer_logprobs(
    learner: Learner, samples: list[TrainableSample], temperature: float = 1.0
) -> tuple[torch.Tensor, torch.Tensor]:
    """(trainer, sampler) log-probs of the samples' completion tokens, flattened alike: the trainer's through its
    own collation, forward and precision; the sampler's as the samples carry them."""
    import torch

    from grpo.trainer.learner.batch import collate
    from grpo.trainer.learner.policy import forward_logprobs

    mb = collate(samples, learner.pad_token_id, mask_truncated=False).to(learner.backend.device)
    with torch.no_grad(), learner.backend.autocast():
        logp, _ = forward_logprobs(learner.model, mb, temperature)
    assert mb.sampler_logp is not None
    mask = mb.completion_mask > 0
    return logp.float()[mask].cpu(), mb.sampler_logp[mask].cpu()


def sample_completions(engine: Any, prompts: list[list[int]], n: int, max_new: int) -> list[TrainableSample]:
    from grpo.rollout.engines.base import SamplingParams
    from grpo.trainer.learner import TrainableSample

    outputs = engine.generate(prompts, SamplingParams(n=n, temperature=1.0, max_new_tokens=max_new, seed=0))
    return [
        TrainableSample(o.prompt_token_ids, s.token_ids, advantage=0.0, sampler_logprobs=s.logprobs)
        for o in outputs
        for s in o.samples
        if s.token_ids
    ]


def check_sampler_logprobs(ctx: Ctx) -> dict[str, Any]:
    """The hf engine's per-token log-probs (bf16 sampler) against the trainer's recomputation of the same tokens."""
    from grpo.rollout.engines.hf import HFEngine

    sz = ctx.sizes
    result: dict[str, Any] = {}
    learners = {p: make_learner(ctx, p) for p in ("bf16", "fp32")}
    with freed():
        for engine_dtype in ("bfloat16", "float32"):
            engine = HFEngine(ctx.model, dtype=engine_dtype, device=str(ctx.device))
            with freed():
                prompts = encode_prompts(engine.tokenizer, prompt_texts(sz.logprob_prompts))
                samples = sample_completions(engine, prompts, sz.logprob_n, sz.logprob_tokens)
                attn = getattr(engine.model.config, "_attn_implementation", "?")
                for precision, learner in learners.items():
                    trainer, sampler = trainer_logprobs(learner, samples)
                    result[f"sampler_{engine_dtype}_vs_trainer_{precision}"] = {
                        **logp_stats(trainer, sampler),
                        "samples": len(samples),
                        "sampler_attn": attn,
                        "trainer_attn": getattr(learner.model.config, "_attn_implementation", "?"),
                    }
                engine.close()
    main = result["sampler_bfloat16_vs_trainer_bf16"]
    anchor = result["sampler_float32_vs_trainer_fp32"]
    problems = []
    # fp32 sampler vs fp32 trainer is the same function of the same weights: only float reordering may differ
    if anchor["max_abs_diff"] > 1e-3:
        problems.append(f"fp32 sampler and fp32 trainer log-probs differ by up to {anchor['max_abs_diff']:.2e}")
    if not math.isfinite(main["max_abs_diff"]):
        problems.append("non-finite bf16 log-probs")
    result["problems"] = problems
    result["summary"] = (
        f"bf16/bf16: mean|d| {main['mean_abs_diff']:.2e} max|d| {main['max_abs_diff']:.2e} "
        f"E[r-1] {main['mean_ratio_minus_1']:.1e}; fp32/fp32 max|d| {anchor['max_abs_diff']:.1e}"
    )
    return result
