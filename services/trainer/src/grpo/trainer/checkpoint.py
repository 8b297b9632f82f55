"""Atomic, rotating checkpoints: model, optimizer, scheduler, step, data cursor, RNG, in-flight accounting.

Layout: <root>/step-00000042/{model/ (HF save_pretrained), optimizer.pt, scheduler.pt, rng_rank<r>.pt,
trainer_state.json (step, data cursor, in-flight books, ledger segment, difficulty buckets)}. A checkpoint is
written under <root>/.tmp-step-…, fsynced, then renamed: a crash leaves either the previous checkpoints or a temp
dir that `latest_checkpoint` never picks. Re-saving a step first renames the old copy to .old-step-…, which stands
for the step until the new copy has its name, so a crash never leaves a step without a complete copy. The checkpoint also carries its step's ledger segment,
written to the ledger only after the rename, so the ledger never runs ahead of the checkpoints (`rewind`).
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

from grpo.trainer.ledger import drop_after, write_segment

log = logging.getLogger(__name__)

STATE_FILE = "trainer_state.json"
_NAME = re.compile(r"^step-(\d{8,})$")
_SIDE = re.compile(r"^\.old-step-(\d{8,})$")  # the old copy of a step being re-saved
ABANDONED = "abandoned-"  # prefix of checkpoints a resume from an earlier step set aside
Outcomes = list[tuple[str, str]]


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
    outcomes: Outcomes | None = None  # the step's ledger segment (None: a checkpoint from before it was kept)
    difficulty: dict[str, Any] | None = None  # the difficulty buckets' records (difficulty.py); None: none kept


def checkpoint_name(step: int) -> str:
    return f"step-{step:08d}"


def list_checkpoints(root: Path) -> list[Path]:
    """Complete checkpoints under `root`, oldest first (temp dirs, set-aside and foreign folders ignored).

    A step whose step-… folder is missing but whose .old-step-… copy is complete (a crash in the middle of
    a re-save) is that copy.
    """
    return [p for _, p in _complete(Path(root))]


def _complete(root: Path) -> list[tuple[int, Path]]:
    if not root.is_dir():
        return []
    found: dict[int, Path] = {}
    for p in sorted(root.iterdir(), key=lambda p: p.name.startswith(".")):  # step-N before .old-step-N
        m = _NAME.match(p.name) or _SIDE.match(p.name)
        if m and (p / STATE_FILE).is_file():
            found.setdefault(int(m.group(1)), p)
    return sorted(found.items())


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
    outcomes: Outcomes | None = None,
    ledger_root: Path | None = None,
    difficulty: dict[str, Any] | None = None,
) -> Path:
    """Write a checkpoint of `learner` for `step` atomically and prune all but the newest `keep_last`.

    Every rank calls this (DeepSpeed writes per-rank shards); rank 0 owns the folder operations.
    `data_cursor` and `inflight` must be JSON-able: they come back unchanged from `load_checkpoint`.
    `outcomes` is the whole ledger segment of `step`: it goes into the checkpoint and, once the checkpoint
    is in place, to `ledger_root`; a crash in between is repaired by `rewind` from the checkpoint.
    `difficulty`: the difficulty buckets' state (JSON-able), saved beside the cursor it goes with.
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
        state = {
            "step": step,
            "data_cursor": data_cursor,
            "inflight": inflight or {},
            "learner": learner_state,
            "world_size": backend.world_size,  # ZeRO's optimizer shards load on as many ranks only
        }
        if outcomes is not None:
            state["outcomes"] = outcomes
        if difficulty is not None:
            state["difficulty"] = difficulty
        (tmp / STATE_FILE).write_text(json.dumps(state, indent=1))
        _fsync_tree(tmp)
        _publish(tmp, final)
        if ledger_root is not None and outcomes is not None:
            write_segment(ledger_root, step, outcomes)
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
    # None: a checkpoint from before the world size was recorded (the backend then counts its shards)
    learner.load_state(path, {**state["learner"], "saved_world_size": state.get("world_size")})
    rank = learner.backend.rank
    rng_file = path / f"rng_rank{rank}.pt"
    if not rng_file.exists():
        rng_file = path / "rng_rank0.pt"  # resumed with more ranks than saved: rank 0's stream
    set_rng_state(torch.load(rng_file, weights_only=False))
    log.info("resumed from %s (step %d)", path, state["step"])
    outcomes = state.get("outcomes")
    return CheckpointInfo(
        path=path, step=int(state["step"]), data_cursor=state["data_cursor"], inflight=state["inflight"],
        outcomes=None if outcomes is None else [(t, o) for t, o in outcomes], difficulty=state.get("difficulty"),
    )  # fmt: skip


def resume(root: Path | str, learner: Checkpointable, mode: str = "auto") -> CheckpointInfo | None:
    """`--resume` semantics: "auto" = latest complete checkpoint if any, "none" = fresh, else a path."""
    if mode == "none":
        return None
    path = latest_checkpoint(root) if mode == "auto" else Path(mode)
    return load_checkpoint(path, learner) if path is not None else None


def rewind(root: Path, ledger_root: Path, info: CheckpointInfo | None) -> list[Path]:
    """Make a run's checkpoints and ledger agree with the checkpoint it resumes from (None: a fresh start).

    The ledger loses the segments after its step and gets its step's segment as the checkpoint holds it
    (the segment is written after the checkpoint, so a crash can leave it behind). Later checkpoints are
    that lost lineage too, but they are the user's: renamed to abandoned-step-… (which `latest_checkpoint`
    never picks), not deleted. Returns their new paths.
    """
    step = -1 if info is None else info.step
    drop_after(ledger_root, step)
    if info is not None and info.outcomes is not None:
        write_segment(ledger_root, step, info.outcomes)
    return set_aside_after(root, step)


def set_aside_after(root: Path, step: int) -> list[Path]:
    """Rename the complete checkpoints after `step` (-1: all) to abandoned-step-…, which `latest_checkpoint` never
    picks: a run resumed from an earlier step, or started afresh, must not be resumed into the lost lineage."""
    moved = [_set_aside(path) for s, path in _complete(Path(root)) if s > step]
    if moved:
        names = [p.name for p in moved]
        if step < 0:
            log.warning("starting afresh in a folder with checkpoints: they are set aside as %s", names)
        else:
            log.warning("resuming from step %d: later checkpoints set aside as %s", step, names)
    return moved


def prune_checkpoints(root: Path, keep_last: int) -> None:
    """Delete all but the newest `keep_last` complete checkpoints (keep_last ≤ 0 keeps everything)."""
    for side in root.glob(".old-step-*"):  # a re-save's old copy, left by a crash after the new one's rename
        if (root / side.name.removeprefix(".old-")).joinpath(STATE_FILE).is_file():
            shutil.rmtree(side, ignore_errors=True)
    if keep_last <= 0:
        return
    for old in list_checkpoints(root)[:-keep_last]:
        shutil.rmtree(old, ignore_errors=True)


def _publish(tmp: Path, final: Path) -> None:
    """Rename the finished `tmp` to `final`. A complete `final` (a re-save of its step) is renamed aside first
    and deleted last, so at every instant one complete copy of the step has a name `list_checkpoints` reads."""
    side = final.with_name(f".old-{final.name}")
    if (final / STATE_FILE).is_file():
        shutil.rmtree(side, ignore_errors=True)  # an earlier crash's old copy: `final` is newer
        final.rename(side)
    else:
        shutil.rmtree(final, ignore_errors=True)  # not a checkpoint (no state file): nothing to keep
    tmp.rename(final)
    _fsync_dir(final.parent)
    shutil.rmtree(side, ignore_errors=True)


def _set_aside(path: Path) -> Path:
    name = ABANDONED + path.name.removeprefix(".old-")
    target, n = path.with_name(name), 1
    while target.exists():  # set aside before, by an earlier resume
        n += 1
        target = path.with_name(f"{name}-{n}")
    path.rename(target)
    return target


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
