"""Checkpoints: a round trip restores params, optimizer, schedule, RNG; rotation; partial dirs are ignored;
crashes mid-save and resumes from an older checkpoint leave checkpoints and ledger in one lineage."""

from __future__ import annotations

import random
import time
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch

from grpo.common.tiny_model import ensure_tiny_model
from grpo.trainer.accounting import Accounting
from grpo.trainer.checkpoint import (
    checkpoint_step,
    latest_checkpoint,
    list_checkpoints,
    load_checkpoint,
    resume,
    rewind,
    save_checkpoint,
)
from grpo.trainer.learner import Learner, LearnerConfig, TrainableSample
from grpo.trainer.ledger import read_ledger


@pytest.fixture(autouse=True)
def one_thread() -> None:
    torch.set_num_threads(1)


BATCH = [TrainableSample([5, 6, 7], [8, 9, 10 + i], advantage=1.0 if i % 2 else -1.0) for i in range(4)]


def make() -> Learner:
    cfg = LearnerConfig(
        model=str(ensure_tiny_model()), lr=1e-3, warmup_steps=3, lr_schedule="cosine", total_steps=10, beta=0.0
    )
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


class Killed(BaseException):
    """The process dies here (SIGKILL): nothing after this line of the save runs."""


def kill_at(monkeypatch: pytest.MonkeyPatch, method: str, name_prefix: str) -> None:
    """Make the filesystem call `Path.<method>` on a file named `name_prefix…` the point where the process dies."""
    real = getattr(Path, method)

    def call(self: Path, target: Path) -> Path:
        if self.name.startswith(name_prefix):
            raise Killed(f"{method} {self.name}")
        return real(self, target)  # type: ignore[no-any-return]

    monkeypatch.setattr(Path, method, call)


def test_a_resave_killed_between_its_renames_keeps_the_step(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    learner = make()
    save_checkpoint(tmp_path, learner, step=5, data_cursor={"row": 1}, keep_last=1)
    kill_at(monkeypatch, "rename", ".tmp-")  # the old copy is set aside, the new one not yet in place
    with pytest.raises(Killed):
        save_checkpoint(tmp_path, learner, step=5, data_cursor={"row": 2}, keep_last=1)  # e.g. the stop's re-save
    monkeypatch.undo()
    info = resume(tmp_path, make(), "auto")  # the restart finds step 5, not nothing
    assert info is not None and (info.step, info.data_cursor) == (5, {"row": 1})
    save_checkpoint(tmp_path, learner, step=5, data_cursor={"row": 3}, keep_last=1)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step-00000005"]  # the old copy is gone
    assert checkpoint_step(latest_checkpoint(tmp_path) or tmp_path) == 5


def test_resuming_an_older_checkpoint_sets_the_later_ones_aside(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    root, ledger, learner = tmp_path / "checkpoints", tmp_path / "ledger", make()
    for step in (30, 40, 50):
        save_checkpoint(root, learner, step=step, keep_last=3, outcomes=[(f"t{step}", "trained")], ledger_root=ledger)
    rewind(root, ledger, load_checkpoint(root / "step-00000030", learner))  # --resume …/step-00000030
    assert "resuming from step 30: later checkpoints set aside as ['abandoned-step-00000040'" in caplog.text
    assert [e["task_id"] for e in read_ledger(ledger)] == ["t30"]
    assert [p.name for p in list_checkpoints(root)] == ["step-00000030"]
    assert (root / "abandoned-step-00000050" / "trainer_state.json").is_file()  # set aside, not deleted
    save_checkpoint(root, learner, step=35, keep_last=3, outcomes=[("t35", "trained")], ledger_root=ledger)
    assert latest_checkpoint(root) == root / "step-00000035"  # the next --resume auto stays in this lineage
    caplog.clear()
    rewind(root, ledger, None)  # --resume never: a fresh ledger, and no checkpoint of the old run to resume
    assert read_ledger(ledger) == [] and list_checkpoints(root) == []
    assert "starting afresh in a folder with checkpoints" in caplog.text and "step -1" not in caplog.text
    assert (root / "abandoned-step-00000035").is_dir() and (root / "abandoned-step-00000030").is_dir()


@pytest.mark.parametrize(
    ("method", "name_prefix"),
    [("rename", ".tmp-step-"), ("replace", "step-00000005.tmp")],
    ids=["inside-the-checkpoint", "between-checkpoint-and-segment"],
)
def test_a_resave_killed_at_any_point_leaves_each_task_once_in_the_ledger(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, method: str, name_prefix: str
) -> None:
    root, ledger, learner = tmp_path / "checkpoints", tmp_path / "ledger", make()
    acct, tasks = Accounting(), [f"t{i}" for i in range(4)]
    for task_id in tasks:
        acct.publish(task_id, 1, 0, time.monotonic())
    acct.resolve("t0", "trained")
    acct.resolve("t1", "trained")
    first = list(acct.recent)
    save_checkpoint(root, learner, step=5, inflight=acct.to_state(time.monotonic()), outcomes=first, ledger_root=ledger)
    acct.resolve("t2", "zero_variance")  # a stop mid-collection of step 6, then the stop's re-save of step 5
    kill_at(monkeypatch, method, name_prefix)
    with pytest.raises(Killed):
        save_checkpoint(root, learner, step=5, inflight=acct.to_state(time.monotonic()),
                        outcomes=first + acct.recent[2:], ledger_root=ledger)  # fmt: skip
    monkeypatch.undo()

    info = load_checkpoint(latest_checkpoint(root) or root, make())  # --resume auto
    rewind(root, ledger, info)
    resumed = Accounting.from_state(info.inflight, time.monotonic())
    for task_id in list(resumed.in_flight):  # what the checkpoint still had in flight is (re)done
        resumed.resolve(task_id, "trained")
    save_checkpoint(root, learner, step=6, outcomes=resumed.recent, ledger_root=ledger)
    assert Counter(e["task_id"] for e in read_ledger(ledger)) == Counter(tasks)
