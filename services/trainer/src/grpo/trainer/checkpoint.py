"""Atomic, rotating checkpoints: model, optimizer, scheduler, step, data cursor, RNG, in-flight accounting.

Layout: <root>/step-00000042/{model/ (HF save_pretrained), optimizer.pt, scheduler.pt, rng_rank<r>.pt,
trainer_state.json}. A checkpoint is written under <root>/.tmp-step-…, fsynced, then renamed: a crash
leaves either the previous checkpoints or a temp dir that `latest_checkpoint` never picks.
"""

from __future__ import annotations

import json
import logging
import os
import random
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch

log = logging.getLogger(__name__)

STATE_FILE = "trainer_state.json"
_NAME = re.compile(r"^step-(\d{8,})$")


class Checkpointable(Protocol):
    """What the Learner offers: rank info plus state save/load into a folder."""

    backend: Any

    def save_state(self, directory: Path) -> dict[str, Any]: ...

    def load_state(self, directory: Path, state: dict[str, Any]) -> None: ...


@dataclass(frozen=True)
class CheckpointInfo:
    path: Path
    step: int
    data_cursor: Any
    inflight: dict[str, Any]


def checkpoint_name(step: int) -> str:
    return f"step-{step:08d}"


def list_checkpoints(root: Path) -> list[Path]:
    """Complete checkpoints under `root`, oldest first (temp dirs and foreign folders ignored)."""
    root = Path(root)
    if not root.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in root.iterdir() if (m := _NAME.match(p.name)) and (p / STATE_FILE).is_file()]
    return [p for _, p in sorted(found)]


def checkpoint_step(path: Path | str) -> int:
    """The step a checkpoint folder holds (its trainer_state.json)."""
    return int(json.loads((Path(path) / STATE_FILE).read_text())["step"])


def latest_checkpoint(root: Path | str) -> Path | None:
    """The newest complete checkpoint, or None."""
    found = list_checkpoints(Path(root))
    return found[-1] if found else None


def save_checkpoint(
    root: Path | str,
    learner: Checkpointable,
    *,
    step: int,
    data_cursor: Any = None,
    inflight: dict[str, Any] | None = None,
    keep_last: int = 3,
) -> Path:
    """Write a checkpoint of `learner` for `step` atomically and prune all but the newest `keep_last`.

    Every rank calls this (DeepSpeed writes per-rank shards); rank 0 owns the folder operations.
    `data_cursor` and `inflight` must be JSON-able: they come back unchanged from `load_checkpoint`.
    """
    root = Path(root)
    rank, backend = learner.backend.rank, learner.backend
    final = root / checkpoint_name(step)
    tmp = root / f".tmp-{checkpoint_name(step)}"
    if rank == 0:
        root.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(tmp, ignore_errors=True)  # leftover of a crash mid-write
        tmp.mkdir()
    backend.barrier()
    learner_state = learner.save_state(tmp)
    torch.save(rng_state(), tmp / f"rng_rank{rank}.pt")
    backend.barrier()
    if rank == 0:
        state = {"step": step, "data_cursor": data_cursor, "inflight": inflight or {}, "learner": learner_state}
        (tmp / STATE_FILE).write_text(json.dumps(state, indent=1))
        _fsync_tree(tmp)
        if final.exists():  # re-saving the same step (e.g. after a resume): replace it whole
            shutil.rmtree(final)
        tmp.rename(final)
        _fsync_dir(root)
        prune_checkpoints(root, keep_last)
        log.info("checkpoint saved: %s", final)
    backend.barrier()
    return final


def load_checkpoint(path: Path | str, learner: Checkpointable) -> CheckpointInfo:
    """Restore model, optimizer, scheduler, learner version and this rank's RNG from `path`."""
    path = Path(path)
    state_file = path / STATE_FILE
    if not state_file.is_file():
        raise FileNotFoundError(f"{path} is not a complete checkpoint (no {STATE_FILE})")
    state = json.loads(state_file.read_text())
    learner.load_state(path, state["learner"])
    rank = learner.backend.rank
    rng_file = path / f"rng_rank{rank}.pt"
    if not rng_file.exists():
        rng_file = path / "rng_rank0.pt"  # resumed with more ranks than saved: rank 0's stream
    set_rng_state(torch.load(rng_file, weights_only=False))
    log.info("resumed from %s (step %d)", path, state["step"])
    return CheckpointInfo(
        path=path, step=int(state["step"]), data_cursor=state["data_cursor"], inflight=state["inflight"]
    )


def resume(root: Path | str, learner: Checkpointable, mode: str = "auto") -> CheckpointInfo | None:
    """`--resume` semantics: "auto" = latest complete checkpoint if any, "none" = fresh, else a path."""
    if mode == "none":
        return None
    path = latest_checkpoint(root) if mode == "auto" else Path(mode)
    return load_checkpoint(path, learner) if path is not None else None


def prune_checkpoints(root: Path, keep_last: int) -> None:
    """Delete all but the newest `keep_last` complete checkpoints (keep_last ≤ 0 keeps everything)."""
    if keep_last <= 0:
        return
    for old in list_checkpoints(root)[:-keep_last]:
        shutil.rmtree(old, ignore_errors=True)


def rng_state() -> dict[str, Any]:
    state: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _fsync_tree(folder: Path) -> None:
    """Flush every file and folder below `folder` to disk before the rename publishes it."""
    for dirpath, _, filenames in os.walk(folder):
        for name in filenames:
            fd = os.open(Path(dirpath) / name, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        _fsync_dir(Path(dirpath))


def _fsync_dir(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
