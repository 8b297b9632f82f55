"""The demo's cold start (R1 stage 1), in-process with the trainer's Learner: SFT until a held-out accuracy threshold.

The trainer's SFT mode runs a fixed number of steps; the demo needs to stop on accuracy instead
(the tiny model's accuracy jumps from ~0 within a few tens of steps, at a seed-dependent point),
so it drives the Learner directly and evaluates greedily every `eval_every` steps.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from grpo.demo.model import EOS
from grpo.demo.task import Problem, is_correct, worked_answer

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SftResult:
    steps: int
    accuracy: float  # greedy accuracy on the eval problems at the last evaluation
    history: list[dict[str, float]]
    seconds: float


def greedy_completions(model: Any, tokenizer: Any, problems: list[Problem], max_new_tokens: int) -> list[str]:
    """Greedy completions (prompts all have one length, so no padding is needed)."""
    import torch

    ids = torch.tensor([tokenizer.encode(p.prompt, add_special_tokens=False) for p in problems])
    with torch.no_grad():
        out = model.generate(
            input_ids=ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=max_new_tokens,
            eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
        )  # fmt: skip
    return tokenizer.batch_decode(out[:, ids.shape[1] :], skip_special_tokens=True)


def greedy_accuracy(
    model: Any, tokenizer: Any, problems: list[Problem], max_new_tokens: int, chunk: int = 256
) -> float:
    model.eval()
    hits = 0
    for i in range(0, len(problems), chunk):
        part = problems[i : i + chunk]
        texts = greedy_completions(model, tokenizer, part, max_new_tokens)
        hits += sum(is_correct(t, p.gold) for t, p in zip(texts, part, strict=True))
    model.train()
    return hits / max(len(problems), 1)


def run_sft(
    model_dir: Path,
    out_dir: Path,
    train: list[Problem],
    evals: list[Problem],
    *,
    lr: float,
    batch_size: int,
    threshold: float,
    max_steps: int,
    eval_every: int,
    max_new_tokens: int,
    seed: int,
    on_eval: Callable[[dict[str, float]], None] | None = None,
) -> SftResult:
    """SFT on worked answers until greedy eval accuracy ≥ threshold (or max_steps); the model is saved to out_dir."""
    from transformers import AutoTokenizer

    from grpo.trainer.learner import SftPair

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    pairs = [
        SftPair(
            tokenizer.encode(p.prompt, add_special_tokens=False),
            tokenizer.encode(worked_answer(p) + EOS, add_special_tokens=False),
        )
        for p in train
    ]
    return train_until(
        model_dir, out_dir, pairs, lambda model: greedy_accuracy(model, tokenizer, evals, max_new_tokens),
        lr=lr, batch_size=batch_size, threshold=threshold, max_steps=max_steps, eval_every=eval_every, seed=seed,
        on_eval=on_eval,
    )  # fmt: skip


def train_until(
    model_dir: Path,
    out_dir: Path,
    pairs: list[Any],
    evaluate: Callable[[Any], float],
    *,
    lr: float,
    batch_size: int,
    threshold: float,
    max_steps: int,
    eval_every: int,
    seed: int,
    on_eval: Callable[[dict[str, float]], None] | None = None,
) -> SftResult:
    """SFT on `pairs` (SftPair) until `evaluate(model)` ≥ threshold (or max_steps); the model is saved to out_dir."""
    import torch
    from transformers import AutoTokenizer

    from grpo.trainer.learner import Learner, LearnerConfig

    started = time.monotonic()
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    learner = Learner(LearnerConfig(model=str(model_dir), lr=lr, micro_batch_size=batch_size, seed=seed, beta=0.0))
    gen = torch.Generator().manual_seed(seed)
    history: list[dict[str, float]] = []
    step, accuracy = 0, 0.0
    while step < max_steps:
        picks = torch.randint(len(pairs), (batch_size,), generator=gen).tolist()
        metrics = learner.sft_step([pairs[i] for i in picks])
        step += 1
        if step % eval_every == 0 or step == max_steps:
            accuracy = evaluate(learner.model)
            point = {"step": float(step), "accuracy": accuracy, "loss": metrics["sft_loss"],
                     "seconds": time.monotonic() - started}  # fmt: skip
            history.append(point)
            log.info("sft step %d: loss %.3f, eval accuracy %.3f", step, metrics["sft_loss"], accuracy)
            if on_eval is not None:
                on_eval(point)
            if accuracy >= threshold:
                break
    out_dir.mkdir(parents=True, exist_ok=True)
    model: Any = learner.model
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    return SftResult(step, accuracy, history, time.monotonic() - started)
