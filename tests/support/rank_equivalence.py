"""Worker for test_rank_equivalence: under torchrun, train one batch with DeepSpeed and with one plain process.

Every rank builds the DeepSpeed learner (ZeRO stage argv[1]) for each case; rank 0 also trains a
plain-PyTorch learner (one process, the reference) on the same batch, then writes the largest
differences of the updated parameters and of the logged metrics to argv[2] (JSON).
"""

from __future__ import annotations

import dataclasses
import gc
import json
import sys
from pathlib import Path
from typing import Any

import torch

from grpo.trainer.learner import Learner, LearnerConfig, SftPair, TrainableSample

torch.set_num_threads(1)

# Lengths alternate long/short (the case where per-rank normalisation skews the loss most); 7 rows split
# unevenly over 2 and 3 ranks; one row is truncated (masked out by mask_truncated).
BATCH = [
    TrainableSample(
        [3 + i, 4, 5],
        [6 + (i * 7 + t) % 50 for t in range(12 if i % 2 else 2)],
        advantage=(-1.0) ** i * (0.5 + 0.25 * i),
        truncated=i == 5,
        group_id=str(i // 4),
    )
    for i in range(7)
]
PAIRS = [SftPair([3 + i, 4], [7 + (i * 5 + t) % 40 for t in range(10 if i % 2 else 3)]) for i in range(7)]

GRPO_CASES: list[dict[str, Any]] = [
    {"agg": agg, "micro_batch_size": mbs}
    for agg in ("token_mean", "seq_mean_token_mean", "seq_mean_token_sum")
    for mbs in (1, 2, 3)
] + [
    {"agg": "token_mean", "micro_batch_size": 2, "beta": 0.05, "ppo_epochs": 2},  # reference model, π_old recomputed
    {"agg": "token_mean", "micro_batch_size": 3, "max_tokens_per_micro_batch": 20},  # token-capped micro-batches
    {"agg": "seq_mean_token_mean", "micro_batch_size": 1, "rows": 2},  # fewer rows than ranks
    {"agg": "token_mean", "micro_batch_size": 2, "per_token": True},  # step credit: one advantage per token
    # multi-turn episodes: tool output (mask 0) inside the long completions, sampler log-probs 0.0 there
    {"agg": "token_mean", "micro_batch_size": 2, "episodes": True},
    {"agg": "seq_mean_token_mean", "micro_batch_size": 3, "episodes": True, "ratio_level": "sequence", "tis_cap": 2.0},
    {"agg": "seq_mean_token_sum", "micro_batch_size": 1, "episodes": True, "beta": 0.05, "tis_cap": 1.5},
]
SFT_CASES: list[dict[str, Any]] = [{"micro_batch_size": mbs} for mbs in (1, 2, 3)] + [
    {"micro_batch_size": 1, "rows": 2},
    {"micro_batch_size": 2, "episodes": True},  # tool segments out of the loss
]
OWN_KEYS = ("rows", "per_token", "episodes")  # this file's options, not LearnerConfig's
COMPARED = ("loss", "pg_loss", "kl_loss", "kl", "ratio_mean", "ratio_max", "entropy", "clip_frac", "grad_norm",
            "tokens", "response_length_mean", "truncation_rate", "sft_loss")  # fmt: skip


def config(backend: str, stage: int, case: dict[str, Any]) -> LearnerConfig:
    # Adam's first step is lr·g/(|g|+eps): eps well above float noise keeps the comparison about the gradient.
    base = {"lr": 1e-3, "adam_eps": 1e-4, "max_len": 12, "seed": 0, "mask_truncated": True, "beta": 0.0}
    options = {k: v for k, v in case.items() if k not in OWN_KEYS}
    return LearnerConfig(backend=backend, zero_stage=stage, **{**base, **options})


def per_token(sample: TrainableSample) -> TrainableSample:
    """Advantages that change along the completion (as process supervision or VinePPO give)."""
    n = len(sample.completion_token_ids)
    return dataclasses.replace(sample, token_advantages=[sample.advantage * (1 - t / n) for t in range(n)])


def env_mask(n: int) -> list[int]:
    """A model turn, a tool result of 4 tokens, the answer: for completions long enough to hold them."""
    return [1, 1, 1, 0, 0, 0, 0, *[1] * (n - 7)] if n > 7 else [1] * n


def episode(sample: TrainableSample) -> TrainableSample:
    """The sample as a multi-turn episode: a token mask, and the sampler's log-probs (0.0 on environment tokens)."""
    mask = env_mask(len(sample.completion_token_ids))
    logprobs = [-2.0 - 0.1 * t if m else 0.0 for t, m in enumerate(mask)]
    return dataclasses.replace(sample, token_mask=mask, sampler_logprobs=logprobs)


def train(
    learner: Learner, kind: str, rows: int, tokens: bool = False, episodes: bool = False
) -> tuple[dict[str, torch.Tensor], dict[str, float]]:
    before = {k: v.clone() for k, v in learner.state_dict_for_push().items()}
    batch, pairs = BATCH[:rows], PAIRS[:rows]
    if tokens:
        batch = [per_token(s) for s in batch]
    if episodes:
        batch = [episode(s) for s in batch]
        pairs = [dataclasses.replace(p, response_mask=env_mask(len(p.response_token_ids))) for p in pairs]
    metrics = learner.step(batch) if kind == "grpo" else learner.sft_step(pairs)
    if kind == "grpo" and learner.config.ppo_epochs == 1:
        metrics |= {f"second/{k}": v for k, v in learner.step(batch).items()}  # the ratio has moved now
    after = learner.state_dict_for_push()
    return {k: after[k] - before[k] for k in before}, metrics


def compare(
    ds: tuple[dict[str, torch.Tensor], dict[str, float]], ref: tuple[dict[str, torch.Tensor], dict[str, float]]
):
    (ds_delta, ds_metrics), (ref_delta, ref_metrics) = ds, ref
    scale = max(float(d.abs().max()) for d in ref_delta.values())
    param_diff = max(float((ds_delta[k] - ref_delta[k]).abs().max()) for k in ref_delta) / scale
    keys = [k for k in ref_metrics if k.split("/")[-1] in COMPARED]
    missing = sorted(set(keys) - set(ds_metrics))
    metric_diff = {
        k: abs(ds_metrics[k] - ref_metrics[k]) / max(abs(ref_metrics[k]), 1e-3) for k in keys if k in ds_metrics
    }
    return {"param_diff": param_diff, "metric_diff": metric_diff, "missing": missing, "update_scale": scale}


def main() -> None:
    stage, out = int(sys.argv[1]), Path(sys.argv[2])
    rank = torch.distributed.get_rank() if torch.distributed.is_initialized() else 0
    results = []
    for kind, cases in (("grpo", GRPO_CASES), ("sft", SFT_CASES)):
        for case in cases:
            learner = Learner(config("deepspeed", stage, case))
            rank = learner.backend.rank
            rows = case.get("rows", len(BATCH))
            tokens, episodes = case.get("per_token", False), case.get("episodes", False)
            ds = train(learner, kind, rows, tokens, episodes)
            if rank == 0:
                ref = train(Learner(config("torch", stage, case)), kind, rows, tokens, episodes)
                results.append({"kind": kind, "case": case, **compare(ds, ref)})
            learner.backend.barrier()
            del learner  # engines left alive past destroy_process_group can abort the interpreter at exit
            gc.collect()
    if rank == 0:
        world = torch.distributed.get_world_size()
        out.write_text(json.dumps({"world_size": world, "stage": stage, "results": results}))
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
