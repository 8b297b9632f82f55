"""A tiny reward classifier trained locally in seconds: the hybrid reward's reward model in tests.

A one-layer Qwen2ForSequenceClassification on the demo's character tokenizer (grpo.demo.model), trained on CPU to
score one checkable property of a (prompt, completion) pair: whether the completion holds a digit. Saved as a Hugging
Face folder, it is what a real reward service loads through `reward_model_path`; `logits` gives the classifier's own
first logit for a pair, computed as the service computes it, for a test to compare the service's score with.
"""

from __future__ import annotations

import random
import string
from collections.abc import Sequence
from pathlib import Path
from typing import Any

PROMPTS = ("Say something.", "Write a word.", "What is 3 + 4?", "Name a colour.", "Count to three.")
LETTERS = string.ascii_letters + " .,!?"
MAX_LENGTH = 256  # positions: the pairs are far shorter


def has_digit(completion: str) -> bool:
    """The property the classifier learns (its label)."""
    return any(c.isdigit() for c in completion)


def example(rng: random.Random) -> tuple[str, str, float]:
    """One (prompt, completion, label) pair: random letters, with a digit or two in half of them."""
    chars = [rng.choice(LETTERS) for _ in range(rng.randint(1, 24))]
    label = rng.random() < 0.5
    if label:
        for _ in range(rng.randint(1, 2)):
            chars.insert(rng.randint(0, len(chars)), rng.choice(string.digits))
    return rng.choice(PROMPTS), "".join(chars), float(label)


def train_reward_classifier(path: Path, *, seed: int = 0, steps: int = 300, batch: int = 32) -> Path:
    """Build, train and save the classifier (with its tokenizer) under `path`; returns `path`.

    The tokenizer is saved first and read back as the reward service reads it (AutoTokenizer), so training encodes
    the pairs exactly as scoring will. 300 steps (~2 s): after 100 the outcome hung on torch's thread count (on one
    thread "the answer is 7" still scored below 0)."""
    import torch
    from transformers import AutoTokenizer, Qwen2Config, Qwen2ForSequenceClassification

    from grpo.demo.model import build_tokenizer

    torch.manual_seed(seed)
    path.mkdir(parents=True, exist_ok=True)
    build_tokenizer(MAX_LENGTH).save_pretrained(path)
    tokenizer = AutoTokenizer.from_pretrained(path)
    config = Qwen2Config(
        vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=1, max_position_embeddings=MAX_LENGTH, num_labels=1, pad_token_id=tokenizer.pad_token_id,
    )  # fmt: skip
    model = Qwen2ForSequenceClassification(config)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    rng = random.Random(seed)
    model.train()
    for _ in range(steps):
        prompts, completions, labels = zip(*(example(rng) for _ in range(batch)), strict=True)
        enc = tokenizer(list(prompts), list(completions), padding=True, return_tensors="pt")
        logits = model(**enc).logits[:, 0]
        loss = torch.nn.functional.binary_cross_entropy_with_logits(logits, torch.tensor(labels))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    model.eval()
    model.save_pretrained(path)
    return path


def logits(path: Path, prompts: Sequence[str], completions: Sequence[str]) -> list[float]:
    """The saved classifier's first logit for each pair, one pair at a time (no padding), as the service encodes a
    pair: tokenizer(prompt, completion)."""
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    tokenizer: Any = AutoTokenizer.from_pretrained(path, local_files_only=True)
    model: Any = AutoModelForSequenceClassification.from_pretrained(path, local_files_only=True).eval()
    out = []
    with torch.inference_mode():
        for prompt, completion in zip(prompts, completions, strict=True):
            enc = tokenizer(prompt, completion, truncation=True, max_length=MAX_LENGTH, return_tensors="pt")
            out.append(float(model(**enc).logits[0, 0]))
    return out


def accuracy(path: Path, n: int = 100, seed: int = 1) -> float:
    """The classifier's accuracy on `n` fresh pairs (a logit > 0 says "holds a digit")."""
    rng = random.Random(seed)
    pairs = [example(rng) for _ in range(n)]
    scores = logits(path, [p for p, _, _ in pairs], [c for _, c, _ in pairs])
    return sum((s > 0) == (label > 0.5) for s, (_, _, label) in zip(scores, pairs, strict=True)) / n
