"""Checkpoints: a round trip restores params, optimizer, schedule, RNG; rotation; partial dirs are ignored."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pytest
import torch

from grpo.common.tiny_model import ensure_tiny_model
from grpo.trainer.checkpoint import latest_checkpoint, list_checkpoints, load_checkpoint, resume, save_checkpoint
from grpo.trainer.learner import Learner, LearnerConfig, TrainableSample


@pytest.fixture(autouse=True)
def one_thread() -> None:
    torch.set_num_threads(1)


BATCH = [TrainableSample([5, 6, 7], [8, 9, 10 + i], advantage=1.0 if i % 2 else -1.0) for i in range(4)]


def make() -> Learner:
    cfg = LearnerConfig(model=str(ensure_tiny_model()), lr=1e-3, warmup_steps=3, lr_schedule="cosine", total_steps=10)
    return Learner(cfg)


def draws() -> tuple[float, float, float]:
    return random.random(), float(np.random.rand()), float(torch.rand(()))


def test_round_trip_restores_everything(tmp_path: Path) -> None:
    a = make()
    a.step(BATCH)
    a.step(BATCH)
    path = save_checkpoint(tmp_path, a, step=2, data_cursor={"row": 7}, inflight={"task-1": {"attempt": 1}})
    expected_draws = draws()
    a.step(BATCH)
    expected_params = {n: p.detach().clone() for n, p in a.model.named_parameters()}
    expected_lr = a.backend.lr()

    b = make()
    info = resume(tmp_path, b, "auto")
    assert info is not None and info.path == path
    assert (info.step, info.data_cursor, info.inflight) == (2, {"row": 7}, {"task-1": {"attempt": 1}})
    assert b.version == 2
    assert draws() == expected_draws  # RNG streams continue where they were
    b.step(BATCH)  # identical next step ⇒ identical params, Adam moments and LR schedule position
    for n, p in b.model.named_parameters():
        assert torch.equal(p.detach(), expected_params[n]), n
    assert b.backend.lr() == expected_lr
    assert (path / "model" / "model.safetensors").is_file()


def test_keeps_only_the_last_n_and_ignores_partial_dirs(tmp_path: Path) -> None:
    learner = make()
    for step in (1, 2, 3, 4):
        save_checkpoint(tmp_path, learner, step=step, keep_last=2)
    assert [p.name for p in list_checkpoints(tmp_path)] == ["step-00000003", "step-00000004"]
    (tmp_path / ".tmp-step-00000009").mkdir()  # a crash mid-write
    (tmp_path / "step-00000010").mkdir()  # a folder without its state file
    assert latest_checkpoint(tmp_path) == tmp_path / "step-00000004"
    with pytest.raises(FileNotFoundError, match="not a complete checkpoint"):
        load_checkpoint(tmp_path / "step-00000010", learner)
    assert resume(tmp_path / "nothing-here", learner, "auto") is None
