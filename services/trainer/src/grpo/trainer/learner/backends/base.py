"""The backend interface the Learner drives: forward module, backward, optimizer step, state I/O."""

from __future__ import annotations

import contextlib
from abc import ABC, abstractmethod
from collections.abc import Iterator
from pathlib import Path
from typing import TypeVar

import torch
from torch import Tensor

T = TypeVar("T")


class Backend(ABC):
    """Owns the trainable model, its optimizer and LR scheduler on one process (rank)."""

    model: torch.nn.Module  # the module to call for forward passes
    device: torch.device
    rank: int = 0
    world_size: int = 1
    # The one precision of every forward pass (policy, π_old, reference): see LearnerConfig.precision.
    precision: str = "fp32"
    autocast_dtype: torch.dtype | None = None  # torch backend in bf16: autocast (fp32 master weights)
    reference_dtype: torch.dtype = torch.float32  # DeepSpeed in bf16 casts the policy, so the reference too

    @abstractmethod
    def backward(self, loss: Tensor, *, last_micro_batch: bool) -> None:
        """Accumulate gradients of `loss` (already weighted for accumulation)."""

    @abstractmethod
    def optimizer_step(self) -> float:
        """Clip, step the optimizer and the LR schedule, zero the gradients; the pre-clip grad norm."""

    @abstractmethod
    def lr(self) -> float:
        """The learning rate the next optimizer step will use."""

    @abstractmethod
    def save(self, directory: Path) -> None:
        """Model (HF safetensors under directory/model), optimizer and scheduler into an existing folder."""

    @abstractmethod
    def load(self, directory: Path, saved_world_size: int | None = None) -> None:
        """Restore what `save` wrote; `saved_world_size`: the ranks that wrote it (None: not recorded)."""

    @abstractmethod
    def full_state_dict(self) -> dict[str, Tensor]:
        """HF-named full tensors (gathered when sharded), on every rank."""

    @contextlib.contextmanager
    def autocast(self) -> Iterator[None]:
        """Autocast to `autocast_dtype` (on GPU or CPU) when set; else a no-op."""
        if self.autocast_dtype is not None:
            with torch.autocast(self.device.type, dtype=self.autocast_dtype):
                yield
        else:
            yield

    def gather(self, items: list[T]) -> list[T]:
        """Every rank's `items`, concatenated in rank order, on every rank (collective)."""
        return items

    def barrier(self) -> None:  # noqa: B027 - optional hook
        """Wait for every rank (no-op on one process)."""

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release the engine's resources (not the process group: see grpo.trainer.ranks.leave_process_group)."""
