"""Multi-rank DeepSpeed: rank 0 drives the run (Redis, pushes, APIs); the other ranks follow its collective calls.

Every operation that is collective under ZeRO (an update, gathering the full weights, saving or loading a
checkpoint) is first announced by rank 0 with a broadcast, so all ranks enter it together. Followers hold
no data, queue or server: they only mirror the learner. With one process nothing is broadcast.
"""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

from grpo.trainer.checkpoint import CheckpointInfo, load_checkpoint, save_checkpoint
from grpo.trainer.export import save_final_model

if TYPE_CHECKING:
    from grpo.trainer.learner import Learner, SftPair, TrainableSample

log = logging.getLogger(__name__)


def env_rank() -> int:
    """This process's rank as set by torchrun / the deepspeed launcher (0 when launched alone)."""
    return int(os.environ.get("RANK", "0"))


def env_world_size() -> int:
    """The number of ranks torchrun / the deepspeed launcher started (1 when launched alone)."""
    return int(os.environ.get("WORLD_SIZE", "1"))


def single_process_backend_problem(backends: list[str], world_size: int) -> str | None:
    """Why a run with these backends (the run's, or each stage's) cannot run on `world_size` ranks (else None).

    Only DeepSpeed shares the work between ranks; each torch-backend rank would build a model of its own,
    and followers (which mirror rank 0 over the process group only DeepSpeed sets up) would crash.
    """
    if world_size <= 1 or all(b == "deepspeed" for b in backends):
        return None
    return (
        f"backend torch trains on one process, but this is rank {env_rank()} of {world_size} "
        f"(WORLD_SIZE={world_size}): use --backend deepspeed to train on several ranks, "
        "or launch one process (--nproc-per-node 1, or without torchrun)"
    )


def leave_process_group() -> None:
    """Destroy the default process group, once, at the end of the process (every rank).

    Not between the stages of a staged run: a rank that destroyed it would wait at the next stage's
    rendezvous for ranks that kept theirs (DeepSpeed's init_distributed reuses an existing group).
    """
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def exit_rank(code: int) -> NoReturn:
    """End a rank of a multi-rank run once serve() has returned, skipping the interpreter's teardown.

    After a finished run a rank could still abort in that teardown ("terminate called without an active
    exception", SIGABRT; 1 of 53 two-rank ZeRO-3 SFT runs on a loaded 2-core machine, and once in CI): gloo and
    DeepSpeed objects freed while the interpreter shuts down. torchrun then reports the finished run as failed.
    Everything the run owns is closed and written by now (files, Redis, servers, the process group), so only the
    logs and the standard streams are flushed."""
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _broadcast(command: tuple[Any, ...] | None) -> tuple[Any, ...]:
    import torch.distributed as dist

    box = [command]
    dist.broadcast_object_list(box, src=0)
    assert box[0] is not None
    return box[0]


class RankDriver:
    """Rank 0's handle on the learner: announces each collective operation, then takes part in it."""

    def __init__(self, learner: Learner, model: str) -> None:
        self.learner = learner
        self.model = model
        self.world = learner.backend.world_size

    def _announce(self, *command: Any) -> None:
        if self.world > 1:
            _broadcast(command)

    @property
    def version(self) -> int:
        return int(self.learner.version)

    @property
    def updates(self) -> int:
        """Optimizer updates made (the reference refresh's pace; unlike `version`, never jumps)."""
        return int(self.learner.updates)

    def set_version(self, version: int) -> None:
        self._announce("version", version)
        self.learner.version = version

    def step(self, samples: list[TrainableSample]) -> dict[str, float]:
        self._announce("step", samples)
        return self.learner.step(samples)

    def sft_step(self, pairs: list[SftPair]) -> dict[str, float]:
        self._announce("sft_step", pairs)
        return self.learner.sft_step(pairs)

    def push_tensors(self) -> dict[str, Any]:
        self._announce("gather")
        return self.learner.state_dict_for_push()

    def save(self, root: Path, **kwargs: Any) -> Path:
        self._announce("save", str(root), kwargs)
        return save_checkpoint(root, self.learner, **kwargs)

    def load(self, path: Path | str) -> CheckpointInfo:
        self._announce("load", str(path))
        return load_checkpoint(path, self.learner)

    def save_final(self, folder: Path) -> None:
        self._announce("final", str(folder))
        save_final_model(self.learner, self.model, folder)

    def close(self) -> None:
        """Release the followers, then this rank's engine (idempotent; the process group stays: see
        leave_process_group)."""
        if self.world > 1:
            self._announce("exit")
            self.world = 1
        self.learner.close()


def follow(learner: Learner, model: str) -> None:
    """Ranks > 0: run rank 0's announced operations until it says exit."""
    log.info("rank %d following rank 0", env_rank())
    while True:
        op, *args = _broadcast(None)
        if op == "exit":
            return
        if op == "version":
            learner.version = args[0]
        elif op == "step":
            learner.step(args[0])
        elif op == "sft_step":
            learner.sft_step(args[0])
        elif op == "gather":
            learner.state_dict_for_push()
        elif op == "save":
            save_checkpoint(Path(args[0]), learner, **args[1])
        elif op == "load":
            load_checkpoint(args[0], learner)
        elif op == "final":
            save_final_model(learner, model, Path(args[0]))
        else:
            raise RuntimeError(f"unknown operation {op!r} from rank 0")
