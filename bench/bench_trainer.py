"""Trainer throughput: Learner.step vs a plain forward+backward+AdamW loop, same model and batch → bench/results/trainer.json.

The reference is the loop anyone would write by hand: micro-batches in arrival order, padded to their
longest row, −A·log π summed over completion tokens, backward, clip, AdamW. Both see the same ~4M-parameter
Qwen2 (tiny tokenizer) and the same GRPO batch; steps are interleaved so machine noise hits both alike.
Target: Learner tokens/s ≥ 0.85 × reference.
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

import torch
import torch.nn.functional as F

from grpo.common.tiny_model import ensure_tiny_model
from grpo.trainer.learner import Learner, LearnerConfig, TrainableSample
from grpo.trainer.learner.batch import collate
from grpo.trainer.learner.policy import load_causal_lm

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # a script's path starts at bench/: the synthetic groups are shared with tests/
from tests.support.samples import gaussian, random_groups  # noqa: E402

log = logging.getLogger("bench_trainer")
MODEL = {"hidden_size": 256, "num_hidden_layers": 4, "intermediate_size": 1024}  # ≈4M parameters


def grpo_batch(n_groups: int, group_size: int, seed: int = 0) -> list[TrainableSample]:
    """Random groups with a normal advantage each; members carry weight versions 0..group_size-1."""
    batch = random_groups(
        n_groups, group_size, prompt_len=(20, 40), completion_len=(20, 120), advantage=gaussian, seed=seed
    )
    return [replace(s, weight_version=k % group_size) for k, s in enumerate(batch)]


def plain_step(model: torch.nn.Module, opt: torch.optim.Optimizer, batch: list[TrainableSample], mbs: int) -> None:
    """The hand-written reference: same loss family, no sorting, no metrics."""
    chunks = [batch[i : i + mbs] for i in range(0, len(batch), mbs)]
    for chunk in chunks:
        mb = collate(chunk, pad_id=0, mask_truncated=False)
        logits = model(input_ids=mb.input_ids, attention_mask=mb.attention_mask, use_cache=False).logits[:, :-1]
        logp = -F.cross_entropy(logits.transpose(1, 2), mb.targets, reduction="none")
        loss = -(logp * mb.completion_mask * mb.advantages[:, None]).sum() / mb.completion_mask.sum()
        (loss / len(chunks)).backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    opt.zero_grad(set_to_none=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--groups", type=int, default=8)
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument("--micro-batch-size", type=int, default=8)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "trainer.json")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO)
    torch.set_num_threads(args.threads)

    path = str(ensure_tiny_model(**MODEL))
    batch = grpo_batch(args.groups, args.group_size)
    tokens = sum(len(s.prompt_token_ids) + len(s.completion_token_ids) for s in batch)
    learner = Learner(LearnerConfig(model=path, lr=1e-5, micro_batch_size=args.micro_batch_size, beta=0.0))
    model = load_causal_lm(path).train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5, foreach=True)
    n_params = sum(p.numel() for p in model.parameters())

    learner.step(batch)  # warm-up both (allocator, first-call overheads)
    plain_step(model, opt, batch, args.micro_batch_size)
    # The same loop on length-sorted rows isolates the Learner's own overhead (metrics, entropy, bookkeeping)
    # from what its dynamic padding saves.
    by_length = sorted(batch, key=lambda s: len(s.prompt_token_ids) + len(s.completion_token_ids))
    learner_s, plain_s, sorted_s = [], [], []
    for _ in range(args.steps):
        start = time.perf_counter()
        learner.step(batch)
        learner_s.append(time.perf_counter() - start)
        start = time.perf_counter()
        plain_step(model, opt, batch, args.micro_batch_size)
        plain_s.append(time.perf_counter() - start)
        start = time.perf_counter()
        plain_step(model, opt, by_length, args.micro_batch_size)
        sorted_s.append(time.perf_counter() - start)

    learner_rate = tokens / statistics.median(learner_s)
    plain_rate = tokens / statistics.median(plain_s)
    sorted_rate = tokens / statistics.median(sorted_s)
    result = {
        "model_parameters": n_params,
        "batch": {"samples": len(batch), "tokens": tokens, "micro_batch_size": args.micro_batch_size},
        "threads": args.threads,
        "steps": args.steps,
        "learner_tokens_per_s": round(learner_rate, 1),
        "plain_loop_tokens_per_s": round(plain_rate, 1),
        "ratio": round(learner_rate / plain_rate, 3),
        "plain_loop_sorted_tokens_per_s": round(sorted_rate, 1),
        "ratio_vs_sorted_loop": round(learner_rate / sorted_rate, 3),
        "target_ratio": 0.85,
        "meets_target": learner_rate / plain_rate >= 0.85,
        "learner_step_s": [round(t, 4) for t in learner_s],
        "plain_step_s": [round(t, 4) for t in plain_s],
        "plain_sorted_step_s": [round(t, 4) for t in sorted_s],
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps({k: v for k, v in result.items() if not k.endswith("_step_s")}, indent=1))


if __name__ == "__main__":
    main()
