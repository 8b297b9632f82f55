"""A test model trained once from the built-in tiny model and cached by its recipe (tool_model, answer_model)."""

from __future__ import annotations

import hashlib
import json
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from grpo.common.tiny_model import ensure_tiny_model


def trained_once(cache_dir: Path, name: str, recipe: dict[str, Any], train: Callable[[Path, Path], None]) -> Path:
    """`cache_dir/<name>-<recipe hash>`: a standard Hugging Face folder that `train(tiny model, folder)` writes once and
    later calls reuse while `recipe` is unchanged. Safe when several processes race (the folder is renamed in whole)."""
    key = hashlib.sha256(json.dumps(recipe, sort_keys=True).encode()).hexdigest()[:12]
    target = Path(cache_dir) / f"{name}-{key}"
    if (target / "model.safetensors").is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        train(ensure_tiny_model(), tmp)
        try:
            tmp.rename(target)  # atomic: a reader sees nothing or the whole folder
        except OSError:
            if not (target / "model.safetensors").is_file():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def fit(model: Any, rows: list[tuple[list[int], list[int]]], pad: int, lr: float, steps: int) -> float:
    """`steps` full-batch AdamW updates on (input ids, labels) rows padded to one width (-100: no loss); the last
    loss."""
    import torch

    width = max(len(ids) for ids, _ in rows)
    ids = torch.tensor([i + [pad] * (width - len(i)) for i, _ in rows])
    labels = torch.tensor([lab + [-100] * (width - len(lab)) for _, lab in rows])
    mask = torch.tensor([[1] * len(i) + [0] * (width - len(i)) for i, _ in rows])
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    model.train()
    for _ in range(steps):
        loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return float(loss.item())
