"""Calibrate the demo outside the services: SFT to an accuracy threshold, then GRPO, in one process.

Uses the trainer's Learner (the same update the trainer service runs) and HF generate.
Prints one JSON line per evaluation and writes a JSON record to --out.
Example: .venv/bin/python scripts/calibrate_demo.py --seed 0 --sft-threshold 0.2 --out /tmp/cal0.json
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import torch

from grpo.algo import group_advantages
from grpo.demo.model import EOS, build_model_folder
from grpo.demo.task import Problem, make_splits, worked_answer
from grpo.demo.task import is_correct as task_correct
from grpo.trainer.learner import Learner, SftPair, TrainableSample
from grpo.trainer.learner.config import LearnerConfig

MAX_NEW = 20


def cpu() -> float:
    return time.process_time()


def generate(
    model, tok, problems: list[Problem], *, greedy: bool, n: int = 1, temperature: float = 1.0
) -> list[list[int]]:
    ids = torch.tensor([tok.encode(p.prompt, add_special_tokens=False) for p in problems])
    with torch.no_grad():
        out = model.generate(
            input_ids=ids,
            attention_mask=torch.ones_like(ids),
            do_sample=not greedy,
            temperature=temperature if not greedy else None,
            top_k=0 if not greedy else None,
            top_p=1.0 if not greedy else None,
            num_return_sequences=n,
            max_new_tokens=MAX_NEW,
            eos_token_id=tok.eos_token_id,
            pad_token_id=tok.pad_token_id,
        )
    rows = []
    for row in out[:, ids.shape[1] :].tolist():
        keep = []
        for t in row:
            keep.append(t)
            if t == tok.eos_token_id:
                break
        rows.append(keep)
    return rows


def evaluate(model, tok, problems: list[Problem]) -> float:
    model.eval()
    hits = 0
    for i in range(0, len(problems), 256):
        chunk = problems[i : i + 256]
        for p, c in zip(chunk, generate(model, tok, chunk, greedy=True), strict=True):
            hits += task_correct(tok.decode(c), p.gold)
    return hits / len(problems)


def reward(text: str, gold: str) -> float:
    fmt = 1.0 if text.startswith("<think>") and text.count("</answer>") == 1 and text.endswith("</answer>") else 0.0
    return float(task_correct(text, gold)) + fmt


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--sft-lr", type=float, default=2e-3)
    ap.add_argument("--sft-batch", type=int, default=128)
    ap.add_argument("--sft-threshold", type=float, default=0.2)
    ap.add_argument("--sft-max-steps", type=int, default=600)
    ap.add_argument("--eval-n", type=int, default=500)
    ap.add_argument("--lr", type=float, default=2e-4)
    ap.add_argument("--warmup", type=int, default=0)
    ap.add_argument("--schedule", default="constant")
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--g", type=int, default=8)
    ap.add_argument("--grpo-steps", type=int, default=60)
    ap.add_argument("--eval-every", type=int, default=10)
    ap.add_argument("--out", type=Path, default=None)
    a = ap.parse_args()
    torch.set_num_threads(1)
    from transformers import AutoTokenizer

    t0, c0 = time.time(), cpu()
    folder = build_model_folder(Path(tempfile.mkdtemp()) / "model", seed=a.seed)
    tok = AutoTokenizer.from_pretrained(folder)
    splits = make_splits(seed=a.seed, n_eval=a.eval_n)
    evals = splits.eval
    rec: dict = {"args": vars(a) | {"out": str(a.out)}, "sft": [], "grpo": []}
    learner = Learner(
        LearnerConfig(model=str(folder), lr=a.sft_lr, micro_batch_size=a.sft_batch, seed=a.seed, beta=0.0)
    )
    gen = torch.Generator().manual_seed(a.seed)
    pairs = [
        SftPair(
            tok.encode(p.prompt, add_special_tokens=False), tok.encode(worked_answer(p) + EOS, add_special_tokens=False)
        )
        for p in splits.sft
    ]
    step, acc = 0, 0.0
    while step < a.sft_max_steps:
        idx = torch.randint(len(pairs), (a.sft_batch,), generator=gen).tolist()
        m = learner.sft_step([pairs[i] for i in idx])
        step += 1
        if step % 10 == 0:
            acc = evaluate(learner.model, tok, evals)
            e = {"step": step, "acc": acc, "loss": m["sft_loss"], "cpu_s": cpu() - c0, "wall_s": time.time() - t0}
            rec["sft"].append(e)
            print(json.dumps({"sft": e}), flush=True)
            if acc >= a.sft_threshold:
                break
    sft_dir = Path(tempfile.mkdtemp()) / "sft"
    learner.model.save_pretrained(sft_dir)
    tok.save_pretrained(sft_dir)
    c1 = cpu()
    learner = Learner(
        LearnerConfig(
            model=str(sft_dir),
            lr=a.lr,
            micro_batch_size=64,
            seed=a.seed,
            beta=0.0,
            warmup_steps=a.warmup,
            temperature=a.temperature,
        )
    )
    before = acc
    rec["before"] = before
    rng = torch.Generator().manual_seed(a.seed + 1)
    for s in range(1, a.grpo_steps + 1):
        idx = torch.randint(len(splits.grpo), (a.prompts,), generator=rng).tolist()
        probs = [splits.grpo[i] for i in idx]
        learner.model.eval()
        comps = generate(learner.model, tok, probs, greedy=False, n=a.g, temperature=a.temperature)
        texts = [tok.decode(c, skip_special_tokens=True) for c in comps]
        golds = [p.gold for p in probs for _ in range(a.g)]
        r = torch.tensor([reward(t, g) for t, g in zip(texts, golds, strict=True)])
        adv = group_advantages(r, a.g)
        grouped = r.view(-1, a.g)
        keep = (grouped.max(1).values != grouped.min(1).values).repeat_interleave(a.g)
        prompt_ids = [tok.encode(p.prompt, add_special_tokens=False) for p in probs for _ in range(a.g)]
        samples = [
            TrainableSample(
                prompt_ids[i],
                comps[i],
                float(adv[i]),
                truncated=comps[i][-1] != tok.eos_token_id,
                weight_version=learner.version,
            )
            for i in range(len(comps))
            if keep[i]
        ]
        learner.model.train()
        m = learner.step(samples) if samples else {}
        acc_rate = float(sum(task_correct(t, g) for t, g in zip(texts, golds, strict=True)) / len(texts))
        e = {"step": s, "reward": float(r.mean()), "train_acc": acc_rate, "kept": len(samples), "cpu_s": cpu() - c1,
             "wall_s": time.time() - t0, "clip": m.get("clip_fraction", 0.0)}  # fmt: skip
        if s % a.eval_every == 0:
            e["acc"] = evaluate(learner.model, tok, evals)
            print(json.dumps({"grpo": e}), flush=True)
        rec["grpo"].append(e)
    accs = [e["acc"] for e in rec["grpo"] if "acc" in e]
    rec["after"] = sum(accs[-3:]) / len(accs[-3:])
    rec["gain"] = rec["after"] - before
    rec["cpu_s"] = cpu() - c0
    print(json.dumps({k: rec[k] for k in ("before", "after", "gain", "cpu_s")}), flush=True)
    if a.out:
        a.out.write_text(json.dumps(rec, indent=1))


if __name__ == "__main__":
    main()
